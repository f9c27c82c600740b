"""Samples of the ops `transpiler/lower_cat.py` lowers: cat and stack, joined by piecewise (masked) loads."""
from __future__ import annotations

import torch

from .kit import X, X3, XB, XI, Sample, randn, scripted


def cat(x, y, x3, xb, xi, e, z):
    return (torch.cat([x, y], 0),  # several realized inputs
            torch.cat([x.t(), y.t()], -1),  # transposed views, a negative dim
            torch.cat([x[:, ::2], x, x.t()[1:5].t()], 1),  # strided slices, three inputs
            torch.cat([x3, x3[:, 1:]], -2), torch.cat([x3[:, :, :1], x3], 2),  # 3-D, a piece one wide
            torch.cat([x + 1, torch.relu(y)], 0) * 2,  # fused pointwise inputs and consumer
            torch.cat([x, xb, xi], 1), torch.cat([xb, xi], 0), torch.cat([xi, xi // 2], -1),  # promotion, int64
            torch.cat([x > 0, y < 0], 0),  # bool
            torch.cat([x, e, y], 0), torch.cat([e, x], 1),  # 1-D empty inputs of shape [0]: skipped, as ATen does
            torch.cat([z, x, z], 0), torch.cat([z, z], 0),  # empty along the joined dim; an empty result
            torch.cat([x], 1), torch.cat([x, y], 0)[2:6] - 1)  # one input; a slice across the seam


def stack(x, y, x3, xb, xi, e):
    return (torch.stack([x, y]),  # default dim 0
            torch.stack([x.t(), y.t()], -1),  # transposed views, a negative dim
            torch.stack([x, x[:, ::1] * 2, y], 2), torch.stack([x3, x3.transpose(1, 2).transpose(1, 2)], -4),
            torch.stack([x, xb, xi], 1), torch.stack([xb, xi], 0), torch.stack([xi, xi], -1),  # promotion, int64
            torch.stack([x[0], y[1]], -1), torch.stack([x.sum(1), y.amax(1)], 0) * 3,  # 1-D, reductions
            torch.stack([x[1, 2], y[0, 0]]),  # 0-d inputs
            torch.stack([e, e]), torch.stack([x]) + 1)  # empty inputs; one input


CAT_SAMPLES: dict[str, list[Sample]] = {
    "aten::cat": [scripted(cat, X, randn(3, 6), X3, XB, XI, randn(0), randn(0, 6))],
    "aten::stack": [scripted(stack, X, randn(4, 6), X3, XB, XI, randn(0))],
}
