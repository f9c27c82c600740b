"""Verification tells a wrong kernel from rounding that a discontinuous op amplified: where a package first parts
from ATen at a sort, a comparison or NMS fed values that agree to rounding, the kernels stay (the report says where
the outputs differ and why); where a kernel itself differs, that kernel is taken out. Before, a detection model whose
NMS flipped on rounding lost every kernel."""
from __future__ import annotations

import pytest
import torch

import jit2triton
from jit2triton.emitters import cpp as cpp_emitter

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


@pytest.fixture
def kernels_rounding_differently(monkeypatch):
    """Generated C++ kernels that move every other float32 output element by `amount` (ulps when an int): the
    nudge is in the kernels' source, so the C++ runtime verification runs and the culprit search both see it."""
    real = cpp_emitter._KernelWriter.store

    def use(amount):
        def store(self, sweep, out, code):
            if out.dtype == "float32":
                index = self.value(cpp_emitter.store_index(self.kernel, out.strides), sweep)
                value = f"(float)({code})"
                moved = (f"std::nextafter({value}, INFINITY)" if isinstance(amount, int)
                         else f"({value} * {1 + amount}f)")
                code = f"((({index}) % 2 == 0) ? {moved} : {value})"
            real(self, sweep, out, code)
        monkeypatch.setattr(cpp_emitter._KernelWriter, "store", store)
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
