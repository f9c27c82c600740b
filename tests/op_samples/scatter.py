"""Samples of the ops `transpiler/lower_scatter.py` lowers: scatters into a destination by an index, along dim 0
and dim 1, by an index expanded from one position per row (a graph network's) and by a full one, into a fresh
tensor and into an input, of floats and of integers (exact). Indices repeat (more updates than rows)."""
from __future__ import annotations

import torch

from .kit import F64, X, XI, Sample, index, ints, randn, scripted


def scatter_add(x, i0, i1, src, xi, srci, rows):
    expanded = rows.view(-1, 1).expand(9, 6)
    return (x.scatter_add(0, i0, src), x.scatter_add(1, i1, src[:4]) * 2, xi.scatter_add(0, i0, srci),
            torch.zeros(4, 6).scatter_add(0, expanded, src), x.t().scatter_add(0, i1.t(), src[:4].t()))


def index_add(x, rows, src, xi, srci, cols, x64):
    return (x.index_add(0, rows, src), x.index_add(1, cols, src[:4, :5].t().contiguous().t(), alpha=0.5),
            xi.index_add(0, rows, srci), torch.zeros(4, 6).index_add(0, rows.int(), src * 2),
            x64.index_add(0, rows, src.double()))


def scatter_reduce(x, i0, src, xi, srci, rows):
    expanded = rows.view(-1, 1).expand(9, 6)
    zeros = torch.zeros(4, 6)
    return (x.scatter_reduce(0, i0, src, "sum"), x.scatter_reduce(0, i0, src, "mean"),
            x.scatter_reduce(0, i0, src, "amax"), x.scatter_reduce(0, i0, src, "amin"),
            zeros.scatter_reduce(0, expanded, src, "sum", include_self=False),
            x.scatter_reduce(0, expanded, src, "mean", include_self=False),
            zeros.scatter_reduce(0, expanded, -src.abs(), "amax", include_self=False),
            x.scatter_reduce(0, expanded, src, "amin", include_self=False),
            xi.scatter_reduce(0, i0, srci, "mean"), xi.scatter_reduce(0, i0, srci, "amax", include_self=False),
            x.scatter_reduce(1, i0[:4], src[:4], "amax"))


SCATTER_SAMPLES: dict[str, list[Sample]] = {
    "aten::scatter_add": [scripted(scatter_add, X, index(4, 9, 6), index(6, 4, 6), randn(9, 6), XI,
                                   ints(-9, 10, 9, 6), index(4, 9))],
    "aten::index_add": [scripted(index_add, X, index(4, 9), randn(9, 6), XI, ints(-9, 10, 9, 6), index(6, 5),
                                 randn(4, 6, dtype=F64))],
    "aten::scatter_reduce.two": [scripted(scatter_reduce, X, index(4, 9, 6), randn(9, 6), XI, ints(-9, 10, 9, 6),
                                          index(4, 9))],
}
