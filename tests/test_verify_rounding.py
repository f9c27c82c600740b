"""Verification tells a wrong kernel from rounding that a discontinuous op amplified: where a package first parts
from ATen at a sort, a comparison or NMS fed values that agree to rounding, the kernels stay (the report says where
the outputs differ and why); where a kernel itself differs, that kernel is taken out. Before, a detection model whose
NMS flipped on rounding lost every kernel."""
from __future__ import annotations

import pytest
import torch

import jit2triton
from jit2triton.deploy import runtime as runtime_module
from jit2triton.deploy.packaging import culprit as culprit_module

from helpers import FRESH_SEED, assert_same


class SortByScore(torch.nn.Module):
    """Scores from a generated kernel, then an order (ATen's argsort) over scores with many exact ties: the order of
    tied scores is decided by their last bits."""

    def forward(self, x):
        # 0 or 1: ties everywhere, as NMS meets equal scores (from ops that round as ATen does: where one rounds its
        # own way, it goes to ATen first, tests/test_aten_rounding.py)
        scores = (x * 2.0 + 1.0).clamp(0.0, 1.0).round()
        scores = scores * (x.abs() + 1.0) / (x.abs() + 1.0)
        order = torch.argsort(scores, dim=-1, descending=True, stable=True)
        return torch.gather(x, -1, order)


def _perturbed(amount):
    """load_kernels whose kernels move every other float output element by `amount` (ulps when an int)."""
    real = runtime_module.load_kernels

    def load(*args, **kwargs):
        kernels = real(*args, **kwargs)

        def wrap(launch):
            def launched(inputs, outputs, *rest):
                launch(inputs, outputs, *rest)
                for out in outputs:
                    if out.is_floating_point() and out.numel():
                        flat = out.view(-1)
                        even = flat[::2]
                        moved = (torch.nextafter(even, torch.full_like(even, float("inf"))) if isinstance(amount, int)
                                 else even * (1 + amount))
                        even.copy_(moved)
            return launched
        return {name: wrap(launch) for name, launch in kernels.items()}
    return load


@pytest.fixture
def kernels_rounding_differently(monkeypatch):
    def use(amount):
        load = _perturbed(amount)
        monkeypatch.setattr(runtime_module, "load_kernels", load)
        monkeypatch.setattr(culprit_module, "load_kernels", load)
    return use


def _example():
    return (torch.randn(4, 64, generator=torch.Generator().manual_seed(0)),)


def test_an_order_decided_by_rounding_keeps_the_kernels_and_says_where_outputs_differ(kernels_rounding_differently):
    kernels_rounding_differently(1)  # one ulp: within every tolerance, but it breaks ties
    model = torch.jit.trace(SortByScore(), _example())
    converted = jit2triton.convert(model, _example(), backend="cpp")
    verification = converted.summary()["verification"]
    assert verification["kernels_removed"] == []
    assert verification["status"] == "matched up to rounding"
    assert any("argsort" in note and "decided differently" in note for note in verification["notes"])
    assert "verification: matched up to rounding" in converted.report()


def test_a_kernel_that_is_wrong_is_still_taken_out(kernels_rounding_differently):
    kernels_rounding_differently(0.05)  # 5%: a wrong kernel, not rounding
    model = torch.jit.trace(SortByScore(), _example())
    converted = jit2triton.convert(model, _example(), backend="cpp")
    verification = converted.summary()["verification"]
    assert verification["kernels_removed"] and verification["status"] == "passed"
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(FRESH_SEED))
    assert_same(converted(x), model(x))


def test_without_a_discontinuous_op_a_mismatch_is_never_put_down_to_rounding(kernels_rounding_differently):
    kernels_rounding_differently(0.05)
    model = torch.jit.trace(lambda x: torch.sigmoid(x * 2.0 + 1.0) * x, _example())
    converted = jit2triton.convert(model, _example(), backend="cpp")
    verification = converted.summary()["verification"]
    assert verification["kernels_removed"] and verification["status"] == "passed"


class SortBySigmoid(SortByScore):
    """The same order over scores from sigmoid, which rounds its own way on the CPU (SLEEF's in ATen)."""

    def forward(self, x):
        scores = torch.sigmoid(x * 2.0 + 1.0).round()
        scores = scores * (x.abs() + 1.0) / (x.abs() + 1.0)
        order = torch.argsort(scores, dim=-1, descending=True, stable=True)
        return torch.gather(x, -1, order)


def test_ops_taken_out_for_rounding_that_buy_no_answer_are_put_back(kernels_rounding_differently):
    """sigmoid goes to ATen first (it rounds its own way); every kernel still moves a last bit here, so the order
    still differs: sigmoid goes back into its kernel, and the package ships as it would have, up to rounding."""
    kernels_rounding_differently(1)
    model = torch.jit.trace(SortBySigmoid(), _example())
    converted = jit2triton.convert(model, _example(), backend="cpp")
    summary = converted.summary()
    assert summary["verification"]["kernels_removed"] == []
    assert summary["verification"]["status"] == "matched up to rounding"
    assert "aten::sigmoid" in {op for kernel in summary["kernels"] for op in kernel["ops"]}
