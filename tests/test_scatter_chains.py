"""Writes through chains of slices, read back through the same slices. transpiler/functionalize.py makes each
`t[h0:h1, w0:w1] = v` a slice_scatter inside a slice_scatter; a later read through a slice reaches the scatter
with its index already shifted by the slice's start. A slice_scatter whose every index lies in its slice must still
read its source at `index - start`: it read it at `index`, past the source's end, which on an H200 was the illegal
memory access of torchvision's swin_v2_t. Its shifted-window mask is such a chain, and there each
`mask[...] = count` filled from a CPU tensor (a CUDA tensor's setitem makes `count` one, and tracing keeps it)
that no kernel may read, so the fills ran through ATen and cut the chain into kernels over the slices they read.
Now such a fill takes the constant's number and fuses; the chain cut by ATen fills is kept as a test of the
scatters, and the CPU-held counts as a test of the fill."""
from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from bounds_checked_triton import checked_loads
from fallback_models import FALLBACK_MODELS, ShiftedWindowMask, region_read_back
from helpers import BACKENDS, TRITON_ON_CPU, assert_matches_torchscript, convert_for, replace_pass
from jit2triton.transpiler.lowering import CannotLower
from jit2triton.transpiler.op_table import OP_TABLE
from jit2triton.transpiler.place_on_device import place_on_device

FILLS = {"aten::fill.Scalar", "aten::fill.Tensor", "aten::copy"}  # a traced `mask[...] = count`, a scripted one


def _fills_through_aten(ctx, *args):
    raise CannotLower("as on CUDA: the value is a CPU tensor")


@pytest.fixture
def fills_through_aten(monkeypatch):
    for op in FILLS:
        monkeypatch.setitem(OP_TABLE, op, dataclasses.replace(OP_TABLE[op], lowering=_fills_through_aten))


@pytest.fixture
def counts_on_the_host(monkeypatch):
    """The 0-d constants typed as a CUDA conversion of a CUDA trace types them: held where no kernel runs."""
    def place(graph, ctx):
        place_on_device(graph, ctx.device)
        for node in graph.walk():
            if node.op == "prim::Constant" and graph.weights.get(node.attrs.get("weight"), SIZED).dim() == 0:
                node.output.type = dataclasses.replace(node.output.type, device="host")

    replace_pass(monkeypatch, "place_on_device", place)


SIZED = torch.empty(1)


def _mask(how: str):
    draw = lambda: (torch.randn(64, 64),)  # noqa: E731
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = ShiftedWindowMask().eval()
        model = torch.jit.trace(model, draw(), check_trace=False) if how == "traced" else torch.jit.script(model)
    return model, draw


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["traced", "scripted"])
def test_shifted_window_mask_with_fills_through_aten(how: str, backend: str, fills_through_aten) -> None:
    torch.manual_seed(0)
    model, draw = _mask(how)
    converted = convert_for(model, draw(), backend)
    summary = converted.summary()
    assert summary["verification"]["kernels_removed"] == [], converted.report()
    assert summary["fallback_nodes"] == 9 and set(summary["fallback_ops"]) <= FILLS, converted.report()
    assert_matches_torchscript(converted, model, draw)


@pytest.mark.parametrize("backend", ["cpp", BACKENDS[1]])
def test_shifted_window_mask_counts_held_on_the_host_fuse(backend: str, counts_on_the_host) -> None:
    torch.manual_seed(0)
    model, draw = _mask("traced")
    converted = convert_for(model, draw(), backend)
    summary = converted.summary()
    assert summary["fallback_nodes"] == 0 and summary["verification"]["kernels_removed"] == [], converted.report()
    assert_matches_torchscript(converted, model, draw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_region_written_then_read_through_its_rows(backend: str) -> None:
    torch.manual_seed(0)
    model, draw = torch.jit.script(region_read_back), lambda: (torch.randn(64, 64), torch.randn(4, 56))
    converted = convert_for(model, draw(), backend)
    summary = converted.summary()
    assert summary["verification"]["kernels_removed"] == [] and summary["fallback_nodes"] == 0, converted.report()
    assert_matches_torchscript(converted, model, draw)


@pytest.mark.skipif(not TRITON_ON_CPU, reason="Triton kernels run on the CPU only under TRITON_INTERPRET=1")
@pytest.mark.parametrize("name", ["mask", "swin_v2_traced"])
def test_kernels_read_and_write_only_inside_their_tensors(name: str, fills_through_aten) -> None:
    """What faulted on the GPU, found on the CPU: the interpreter with every load and store bounds-checked, over
    the mask with its fills through ATen and over the Swin-V2 structure (tests/fallback_models.py)."""
    torch.manual_seed(0)
    model, draw = _mask("traced") if name == "mask" else FALLBACK_MODELS[name]()
    with checked_loads():
        converted = convert_for(model, draw(), "triton", verify=False)
        inputs = draw()
        torch.testing.assert_close(converted(*inputs), model(*inputs), rtol=1e-4, atol=1e-5)
