"""A renderer bug in one kernel costs that kernel, never the model's others (issue 46): the kernel that fails to
render (or, for C++, to compile) alone has its ops run through ATen, named with the failure in the report, and the
package is built again with every other kernel; only where every kernel fails, or rounds of failures pass
MAX_GENERATION_ROUNDS, does every op run through ATen."""
from __future__ import annotations

import pytest
import torch

from jit2triton.emitters import cpp, triton_math
from jit2triton.transpiler import fallbacks

from helpers import BACKENDS, assert_matches_torchscript, convert_for

RENDERERS = {"cpp": cpp.OPS, "triton": triton_math.OPS, "cuda": triton_math.OPS}  # each backend's op table


def three_regions(x, w):
    """Three kernels an ATen GEMM keeps apart: sin's, then the bias and relu after each product."""
    a = torch.sin(x) * 2.0
    b = torch.relu(torch.mm(a, w) + 1.0)
    return torch.relu(torch.mm(b, w.t())) + x


def _draw() -> tuple:
    return torch.randn(4, 8), torch.randn(8, 16)


def _break_sin(monkeypatch, backend: str) -> None:
    """The renderer of `backend` raises for the kernel-IR op sin, and renders every other op as before."""
    def no_sin(*args):
        raise KeyError("an injected renderer bug for sin")
    monkeypatch.setitem(RENDERERS[backend], "sin", no_sin)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_kernel_that_fails_to_render_alone_costs_only_that_kernel(backend, monkeypatch):
    model = torch.jit.script(three_regions)
    _break_sin(monkeypatch, backend)
    converted = convert_for(model, _draw(), backend)
    summary = converted.summary()
    assert converted.manifest["backend"] != "aten" and "generation_failed" not in summary, summary
    kernel_ops = {op for kernel in summary["kernels"] for op in kernel["ops"]}
    assert summary["native_nodes"] > 0 and "aten::relu" in kernel_ops and "aten::sin" not in kernel_ops, summary
    assert summary["fallback_ops"].get("aten::sin") == 1, summary["fallback_ops"]
    why = summary["fallback_reasons"]["aten::sin"]
    assert "failed to render" in why and "an injected renderer bug for sin" in why, why
    assert any("failed to render" in note and "the other kernels stay" in note
               for note in summary["verification"]["notes"]), summary["verification"]["notes"]
    assert_matches_torchscript(converted, model, _draw)


def test_a_kernel_whose_cpp_does_not_compile_costs_only_that_kernel(monkeypatch):
    """The model's kernels are one C++ translation unit: halves of them are compiled to find the one to blame."""
    monkeypatch.setitem(cpp.OPS, "sin", "j2t_no_such_function({0})")
    model = torch.jit.script(three_regions)
    converted = convert_for(model, _draw(), "cpp")
    summary = converted.summary()
    assert converted.manifest["backend"] == "cpp" and "generation_failed" not in summary, summary
    kernel_ops = {op for kernel in summary["kernels"] for op in kernel["ops"]}
    assert "aten::relu" in kernel_ops and "aten::sin" not in kernel_ops, summary
    why = summary["fallback_reasons"]["aten::sin"]
    assert "failed to compile" in why and "j2t_no_such_function" in why, why
    assert_matches_torchscript(converted, model, _draw)


def test_a_renderer_failing_for_every_kernel_leaves_every_op_to_aten(monkeypatch):
    """No single kernel to blame: one round, then the model's ops all run through ATen, as before."""
    def broken(*args):
        raise KeyError("an injected renderer bug for every load")
    monkeypatch.setitem(cpp.OPS, "load", broken)
    model = torch.jit.script(three_regions)
    converted = convert_for(model, _draw(), "cpp")
    summary = converted.summary()
    assert converted.manifest["backend"] == "aten" and not summary["kernels"], summary
    assert "an injected renderer bug for every load" in summary["generation_failed"]
    assert_matches_torchscript(converted, model, _draw)


def test_render_failures_are_bounded_in_rounds(monkeypatch):
    """Each round of render failures is a fusion and a rendering of the whole model: past MAX_GENERATION_ROUNDS every
    kernel goes out instead of another round."""
    monkeypatch.setattr(fallbacks, "MAX_GENERATION_ROUNDS", 0)
    _break_sin(monkeypatch, "cpp")
    model = torch.jit.script(three_regions)
    converted = convert_for(model, _draw(), "cpp")
    summary = converted.summary()
    assert not summary["kernels"] and summary["native_nodes"] == 0, summary
    assert any("generating kernels failed" in note and "every op runs through ATen" in note
               for note in summary["verification"]["notes"]), summary["verification"]["notes"]
    assert_matches_torchscript(converted, model, _draw)
