"""Data-dependent sizes: post-processing whose output sizes depend on the values (boolean-mask indexing, nonzero,
masked_select, unique, one-argument where, a slice or topk by a computed count, an NMS written in TorchScript)
converts and matches TorchScript on fresh inputs whose counts differ from the example's, in every backend. A size
the package fixed at conversion that then changes makes verification fail (kernels out), never pass with a note."""
from __future__ import annotations

import pytest
import torch

import jit2triton

from helpers import BACKENDS, assert_same, convert_for, to_cpu, to_device


@torch.jit.script
def positives(x):
    return torch.relu(x[x > 0] * 2 + 1).sin()


@torch.jit.script
def nonzero_rows(x):
    rows = torch.nonzero(x.sum(1) > 0).squeeze(1)
    return (x[rows] * 3).exp().sum(0), rows


@torch.jit.script
def selected(x, y):
    picked = torch.masked_select(x, y > 0.2)
    return picked * picked + 1, torch.where(y > 0.5)[0]


@torch.jit.script
def uniques(ids):
    values, counts = torch.unique(ids, return_counts=True)
    return values * 2, counts.float().softmax(0)


@torch.jit.script
def top_by_count(scores):
    k = int((scores > 0).sum()) + 1
    top = torch.topk(scores, k).values
    return top.sigmoid() * 2, scores[: k // 2 + 1].cos()


@torch.jit.script
def box_iou(a, b):
    lt = torch.max(a[:, None, :2], b[None, :, :2])
    rb = torch.min(a[:, None, 2:], b[None, :, 2:])
    inter = (rb - lt).clamp(min=0).prod(2)
    area_a = (a[:, 2:] - a[:, :2]).prod(1)
    area_b = (b[:, 2:] - b[:, :2]).prod(1)
    return inter / (area_a[:, None] + area_b[None, :] - inter)


@torch.jit.script
def postprocess(boxes, scores):
    """A detection head's post-process: threshold, sort, keep the best 50, pairwise-IoU suppression."""
    keep = scores > 0.3
    boxes, scores = boxes[keep], scores[keep]
    order = scores.argsort(descending=True)[:50]
    boxes, scores = boxes[order], scores[order]
    iou = box_iou(boxes, boxes)
    suppressed = torch.zeros(boxes.shape[0], dtype=torch.bool)
    for i in range(boxes.shape[0]):
        if not bool(suppressed[i]):
            suppressed = suppressed | ((iou[i] > 0.5) & (torch.arange(boxes.shape[0]) > i))
    return boxes[~suppressed] * 2.0, scores[~suppressed].sqrt()


def _boxes(n: int, generator: torch.Generator) -> torch.Tensor:
    corner = torch.rand(n, 2, generator=generator) * 100
    return torch.cat([corner, corner + 5 + torch.rand(n, 2, generator=generator) * 30], 1)


def _inputs(name: str, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    if name == "positives":
        return (torch.randn(64, generator=g),)
    if name == "nonzero_rows":
        return (torch.randn(16, 8, generator=g),)
    if name == "selected":
        return torch.randn(8, 8, generator=g), torch.rand(8, 8, generator=g)
    if name == "uniques":
        return (torch.randint(0, 40, (24,), generator=g),)
    if name == "top_by_count":
        return (torch.randn(32, generator=g),)
    return _boxes(160, g), torch.rand(160, generator=g)


PROGRAMS = {"positives": positives, "nonzero_rows": nonzero_rows, "selected": selected, "uniques": uniques,
            "top_by_count": top_by_count, "postprocess": postprocess}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_data_dependent_sizes_follow_the_data(name, backend):
    program = PROGRAMS[name]
    converted = convert_for(program, _inputs(name, 0), backend)
    verification = converted.summary()["verification"]
    # shape inference saw the counts vary: no kernel was fitted to the example's count for verification to take out
    assert verification["status"] == "passed" and not verification["kernels_removed"], verification
    device = converted.device
    sizes = set()
    for seed in range(1, 6):
        inputs = _inputs(name, seed)
        expected = program(*inputs)
        actual = to_cpu(converted(*to_device(inputs, device)))
        assert_same(actual, expected, f"{name} at seed {seed}")
        sizes.add(tuple(x.shape[0] for x in (expected if isinstance(expected, tuple) else (expected,))))
    assert len(sizes) > 1, "the draws must change the data-dependent sizes, or the test proves nothing"


def test_a_size_fixed_at_conversion_fails_verification(monkeypatch):
    """Without the other values shape inference runs on, the mask's count is the example's: verification must catch
    it on the fresh draw (a refused draw is not a note) and take the kernels out."""
    from jit2triton import conversion
    monkeypatch.setattr(conversion, "VALUE_SHIFTS", ())
    converted = jit2triton.convert(positives, _inputs("positives", 0))
    verification = converted.summary()["verification"]
    assert verification["kernels_removed"], verification
    x = _inputs("positives", 3)[0]
    assert_same(converted(x), positives(x))
