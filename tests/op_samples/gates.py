"""Samples of the ops `transpiler/lower_gates.py` lowers: PReLU (slopes per channel or one) and GLU."""
from __future__ import annotations

import torch.nn.functional as F

from .kit import BF16, X, X3, XB, Sample, randn, scripted


def prelu(x4, w3, w1, x, w6, xb, wb):
    return (F.prelu(x4, w3), F.prelu(x4.transpose(2, 3), w3), F.prelu(x4, w1), F.prelu(x, w6), F.prelu(x.t(), w1),
            F.prelu(xb, wb))


def glu(x, x3, xb):
    return F.glu(x, -1), F.glu(x3, 1), F.glu(x.t(), 0), F.glu(xb, 1)


GATES_SAMPLES: dict[str, list[Sample]] = {
    "aten::prelu": [scripted(prelu, randn(2, 3, 4, 5), randn(3), randn(1), X, randn(6), XB, randn(6, dtype=BF16))],
    "aten::glu": [scripted(glu, X, X3, XB)],
}
