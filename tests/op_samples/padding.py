"""Samples of the ops `transpiler/lower_padding.py` lowers: padding in its four modes (negative widths crop) and
roll, with shifts past the dim's size and negative dims."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .kit import BF16, X, X3, XB, XI, Sample, randn, scripted, traced


def pad(x, x3, x4, xb, xi):
    return (F.pad(x, [1, 2], value=0.5), F.pad(x.t(), [-1, 1, 2, 0]), F.pad(x3, [2, 1], mode="reflect"),
            F.pad(x4, [1, 2, 2, 1], mode="reflect"), F.pad(x4, [1, 2, 2, 1], mode="replicate"),
            F.pad(x3, [1, 2], mode="circular"), F.pad(x4, [2, 1, 1, 3], mode="circular"), F.pad(xb, [1, 1]),
            F.pad(xi, [0, 0, 1, 2], value=3.0))


def constant_pad_nd(x, x3, xb):
    return (torch.constant_pad_nd(x, [1, 1, 2, 0], 1.5), torch.constant_pad_nd(x3, [0, -2]),
            torch.constant_pad_nd(xb, [2, 1]))


def roll(x, x3, xb, xi):
    return (torch.roll(x, [1, -2], [0, 1]), torch.roll(x.t(), [3], [1]), torch.roll(x3, [7, 5], [-1, 0]),
            torch.roll(x3[:, 1:], [-9], [1]), torch.roll(xb, [2], [1]), torch.roll(xi, [1, 1], [0, 1]))


PADDING_SAMPLES: dict[str, list[Sample]] = {
    "aten::pad": [scripted(pad, X, X3, randn(2, 3, 4, 5), XB, XI)],
    "aten::constant_pad_nd": [traced(constant_pad_nd, X, X3, randn(4, 6, dtype=BF16))],
    "aten::roll": [scripted(roll, X, X3, XB, XI)],
}
