"""A boolean mask that indexes several tensors is counted once (transpiler/shared_masks.py): one nonzero, then
gathers by its integer columns, whose outputs are ATen's bit for bit; left alone where the mask is written between
its readers. A count made inside a loop is bound there each iteration (infer_shapes.py, bind_sizes.py), so the
gathers after it, and a fill with the loop's counter, are kernels. Checked against TorchScript on fresh inputs
whose counts differ from the example's, on both backends."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

from helpers import BACKENDS, convert_for, plan_ops


class PerClass(torch.nn.Module):
    """A detector's per-class post-process (torchvision's SSD): per class a threshold, the scores and boxes it keeps,
    their best few."""

    def forward(self, boxes: Tensor, scores: Tensor):
        out_boxes, out_scores, out_labels = [], [], []
        for label in range(1, scores.shape[1]):
            score = scores[:, label]
            keep = score > 0.5
            score = score[keep]
            box = boxes[keep]
            score, order = score.topk(min(5, score.size(0)))
            out_boxes.append(box[order])
            out_scores.append(score)
            out_labels.append(torch.full_like(score, fill_value=label, dtype=torch.int64))
        return torch.cat(out_boxes), torch.cat(out_scores), torch.cat(out_labels)


class TwoDims(torch.nn.Module):
    def forward(self, x: Tensor, y: Tensor):
        m = x > 0.2
        return x[m] * 2, y[m] - 1, (x + y)[:, None][m[:, None]]


class WrittenBetween(torch.nn.Module):
    def forward(self, x: Tensor, y: Tensor):
        m = x > 0
        a = x[m]
        m[0] = True  # the second reader sees the written mask
        return a, y[m]


class InputMask(torch.nn.Module):
    """A mask the caller passes, read in two blocks: shared where read twice in one, not across blocks."""

    def forward(self, x: Tensor, m: Tensor, flag: bool):
        a = x[m] + 1
        if flag:
            return a, (x * 2)[m], x.sin()[m]
        return a, x[m].cos(), a


def _check(model, draw, backend: str, calls: int = 4):
    device = "cuda" if backend == "cuda" else "cpu"
    scripted = torch.jit.script(model.to(device))
    torch.manual_seed(0)
    package = convert_for(scripted, draw(), backend)
    for _ in range(calls):
        inputs = tuple(x.to(device) if isinstance(x, torch.Tensor) else x for x in draw())
        for got, want in zip(package(*inputs), scripted(*inputs)):
            assert got.shape == want.shape  # (the counts)
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)  # (gathers are exact; sin, cos round)
    return package


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_per_class_loop_counts_each_mask_once(backend) -> None:
    package = _check(PerClass(), lambda: (torch.rand(40, 4), torch.rand(40, 6)), backend)
    ops = plan_ops(package)  # in the loop's body: once a class, for scores and boxes (its count read before the
    assert ops.count("aten::nonzero") + ops.count("aten::nonzero_static") == 1  # loop: loop_counts.py)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mask_of_two_dims_is_indexed_by_both_columns(backend) -> None:
    _check(TwoDims(), lambda: (torch.randn(6, 5), torch.randn(6, 5)), backend)


def test_a_mask_written_between_its_readers_is_not_shared() -> None:
    package = _check(WrittenBetween(), lambda: (torch.randn(8), torch.randn(8)), "cpp")
    assert "aten::nonzero" not in plan_ops(package)


def test_a_rewrite_that_breaks_the_example_is_taken_out(monkeypatch) -> None:
    """A shared count whose columns are wrong (every one the mask's first dim's) fails the example when the graph is
    typed again: conversion goes on without the optional rewrites and the package is right."""
    from jit2triton.transpiler import shared_masks
    real = shared_masks._count

    def wrong_columns(mask, at, columns):
        pieces = real(mask, at, columns)
        columns[mask.id] = [columns[mask.id][0]] * len(columns[mask.id])
        return pieces

    monkeypatch.setattr(shared_masks, "_count", wrong_columns)
    package = _check(TwoDims(), lambda: (torch.randn(6, 5), torch.randn(6, 5)), "cpp")
    assert "aten::nonzero" not in plan_ops(package)
    assert any("after the optional rewrites: converted without them" in n
               for n in package.summary()["verification"]["notes"]), package.summary()["verification"]["notes"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_mask_passed_in_and_read_in_two_blocks(backend) -> None:
    draw = lambda: (torch.randn(7, 3), torch.rand(7) > 0.4, bool(torch.rand(()) > 0.5))  # noqa: E731
    package = _check(InputMask(), draw, backend, calls=6)
    assert plan_ops(package).count("aten::nonzero") == 1  # in the branch that reads it twice


class Escapes(torch.nn.Module):
    """A count made in a loop whose values leave it (one class's kept scores, carried out): the loop's outputs have
    sizes of their own, and the package stays right with no kernel taken out."""

    def forward(self, scores: Tensor):
        kept = scores[:, 0]
        for label in range(1, scores.shape[1]):
            score = scores[:, label]
            high = score[score > 0.5]
            if label == 2:
                kept = high * 2.0
        return kept + 1.0


def _loop_kernels(package) -> int:
    """Kernel steps inside the plan's loops."""
    def count(steps, inside):
        found = 0
        for step in steps:
            found += inside and not step.get("op")
            for block in step.get("blocks") or []:
                found += count(block["steps"] if isinstance(block, dict) else block, inside or step.get("op") == "prim::Loop")
        return found
    return count(package.manifest["plan"]["steps"], False)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_per_class_count_is_bound_in_the_loop_and_its_gathers_are_kernels(backend) -> None:
    """The count of each class's mask, bound where the loop makes it: the gathers of the kept scores and boxes,
    and of their best few, run in generated kernels (before, every op after a mask in a loop ran through ATen),
    over counts from none to all of the boxes."""
    draw = lambda: (torch.rand(40, 4), torch.rand(40, 6) * torch.tensor([1.0, 0.4, 0.6, 1.0, 2.0, 0.9]))  # noqa: E731
    package = _check(PerClass(), draw, backend, calls=6)
    assert _loop_kernels(package) >= 4  # the threshold, the kept rows' gather, the best few's gather, the labels
    assert "aten::full_like" not in plan_ops(package)  # filled with the loop's counter, in a kernel


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_count_that_leaves_its_loop_is_right(backend) -> None:
    package = _check(Escapes(), lambda: (torch.rand(30, 5),), backend, calls=6)
    assert package.summary()["verification"]["kernels_removed"] == []


class TwoMasks(torch.nn.Module):
    """Two masks, each read twice: one count each."""

    def forward(self, x: Tensor, y: Tensor):
        rows, cols = x[:, 0] > 0, x[0] > 0
        return x[rows][:, cols], y[rows], y[:, cols]


@pytest.mark.parametrize("backend", BACKENDS)
def test_two_masks_each_read_twice(backend) -> None:
    package = _check(TwoMasks(), lambda: (torch.randn(7, 6), torch.randn(7, 6)), backend, calls=6)
    assert plan_ops(package).count("aten::nonzero") == 2  # one per mask, each read twice
