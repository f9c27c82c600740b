"""A write through views that functionalize rewrote as scatters (transpiler/functionalize.py) runs in place, as
TorchScript had it, wherever a scatter does not reach a generated kernel: through ATen a slice_scatter copies the
whole tensor for every write (Mask R-CNN v2's mask pasting on an H100: 1,032 clones and 1,004 device copies a call
that TorchScript does not make, 0.80x TorchScript). Where the scatters fuse, they stay. Bounds read at run time, or a
tensor whose size depends on the data, functionalize does not rewrite at all (its views need literal arguments and
static shapes): those writes are checked to stay in place too. Each case is compared with TorchScript on fresh random
inputs at several box draws."""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

from jit2triton import conversion
from jit2triton.transpiler.lowering import load_lowerings
from jit2triton.transpiler.op_table import OP_TABLE

from helpers import assert_matches_torchscript, convert_for

COPIES = {"aten::slice_scatter", "aten::select_scatter", "aten::clone"}


def paste_masks(masks, boxes, h: int, w: int):
    """torchvision's paste_mask_in_image, in a loop over boxes: the bounds are read from the boxes at run time."""
    pasted = []
    for i in range(boxes.shape[0]):
        box = boxes[i]
        x0, y0, x1, y1 = int(box[0]), int(box[1]), int(box[2]), int(box[3])
        im = torch.zeros(h, w)
        im[y0:y1, x0:x1] = masks[i, :y1 - y0, :x1 - x0] * 2
        pasted.append(im)
    return torch.stack(pasted)


def paste_columns(masks, boxes, w: int):
    """Fixed bounds (columns 1:3, every row) into a tensor whose row count is read from the boxes: a size that
    depends on the data, which no kernel could index either."""
    pasted = []
    for i in range(boxes.shape[0]):
        rows = int(boxes[i, 3]) + 2
        im = torch.zeros(rows, w)
        im[:, 1:3] = masks[i, :rows, :2] * 2
        pasted.append(im.sum(0))
    return torch.stack(pasted)


def paste_fixed(x):
    im = torch.zeros(8, 8)
    im[2:5, 1:4] = x * 2
    return im + 1


def paste_three(x):
    """Three writes into one tensor, each reading what the one before wrote: two through slices, one through a
    select."""
    im = torch.zeros(8, 8)
    im[2:5, 1:4] = x * 2
    im[4:6, 3:6] = x[:2] - 1
    im[4].mul_(-3.0)
    return im * im


def _boxes():
    corner = torch.rand(3, 2) * 4
    return torch.cat([corner, corner + 1 + torch.rand(3, 2) * 3], 1)


def _plan_ops(converted) -> Counter:
    """The ops of the plan's steps, nested blocks (the loop's body) included."""
    def walk(steps):
        for step in steps:
            yield step.get("op", step["kind"])
            for block in step.get("blocks") or []:
                yield from walk(block["steps"])
    return Counter(walk(converted.manifest["plan"]["steps"]))


def _kernel_ops(converted) -> list[str]:
    return [f["op"] for e in converted.manifest["nodes"] if e["category"] == "kernel" for f in e["fused"]]


def _check_in_place(model, draw, writes=1):
    converted = convert_for(model, draw(), "cpp")
    ops = _plan_ops(converted)
    assert ops["aten::copy_"] == writes and not COPIES & set(ops), ops
    for seed in range(3):  # several box draws
        torch.manual_seed(seed)
        assert_matches_torchscript(converted, model, draw)
    return converted


def test_bounds_read_at_run_time_write_in_place():
    _check_in_place(torch.jit.script(paste_masks), lambda: (torch.randn(3, 8, 8), _boxes(), 10, 12))


def test_a_scatter_whose_size_depends_on_the_data_is_put_back_in_place():
    _check_in_place(torch.jit.script(paste_columns), lambda: (torch.randn(3, 12, 8), _boxes(), 6))


def test_a_scatter_whose_lowering_fails_is_put_back_in_place(monkeypatch):
    _break_slice_scatter(monkeypatch)
    _check_in_place(torch.jit.script(paste_fixed), lambda: (torch.randn(3, 3),))


def _break_slice_scatter(monkeypatch):
    load_lowerings()
    original = OP_TABLE["aten::slice_scatter"]

    def raises(ctx, *args):
        raise KeyError("an injected bug")
    monkeypatch.setitem(OP_TABLE, "aten::slice_scatter", dataclasses.replace(original, lowering=raises))


def test_writes_that_read_each_other_are_put_back_in_place(monkeypatch):
    """The slice writes put back in place; the select's scatter, which lowers, reads the tensor they wrote."""
    _break_slice_scatter(monkeypatch)
    model = torch.jit.script(paste_three)
    converted = convert_for(model, (torch.randn(3, 3),), "cpp")
    ops = _plan_ops(converted)
    assert ops["aten::copy_"] == 2 and "aten::slice_scatter" not in ops and "aten::clone" not in ops, ops
    assert "aten::select_scatter" in _kernel_ops(converted), _kernel_ops(converted)
    for seed in range(3):
        torch.manual_seed(seed)
        assert_matches_torchscript(converted, model, lambda: (torch.randn(3, 3),))


def test_three_writes_that_fuse_stay_scatters():
    model = torch.jit.script(paste_three)
    converted = convert_for(model, (torch.randn(3, 3),), "cpp")
    ops = _plan_ops(converted)
    assert "aten::copy_" not in ops and not COPIES & set(ops), ops
    assert_matches_torchscript(converted, model, lambda: (torch.randn(3, 3),))


def test_without_kernels_every_write_is_in_place(monkeypatch):
    """Kernel generation failing for the whole model: every write runs in place, as TorchScript has them."""
    def fails(*args, **kwargs):
        raise RuntimeError("an injected renderer bug")
    monkeypatch.setattr(conversion, "build_kernels", fails)
    converted = _check_in_place(torch.jit.script(paste_three), lambda: (torch.randn(3, 3),), writes=2)
    assert "an injected renderer bug" in converted.summary()["generation_failed"]
    assert _plan_ops(converted)["aten::mul_.Scalar"] == 1


def test_fixed_bounds_still_fuse():
    model = torch.jit.script(paste_fixed)
    converted = convert_for(model, (torch.randn(3, 3),), "cpp")
    ops = _plan_ops(converted)
    assert "aten::copy_" not in ops and not COPIES & set(ops), ops
    assert _kernel_ops(converted).count("aten::slice_scatter") == 2, _kernel_ops(converted)
    assert_matches_torchscript(converted, model, lambda: (torch.randn(3, 3),))
