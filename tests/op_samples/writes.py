"""Samples of the ops `transpiler/lower_writes.py` lowers: the functional forms of in-place writes (copy,
fill.Tensor) and a runtime number made into a 0-d tensor."""
from __future__ import annotations

import torch

from .kit import F64, X, X3, XB, XI, Sample, randn, scalar, scripted


def copy(x, src, row, s, xb):
    return (torch.ops.aten.copy(x, src), torch.ops.aten.copy(x.t(), src.t()), torch.ops.aten.copy(x, row),
            torch.ops.aten.copy(x, s), torch.ops.aten.copy(xb, x), torch.ops.aten.copy(x, xb))


def fill_tensor(x, s, xb, xi, sd):
    return torch.fill(x, s), torch.fill(x.t(), s), torch.fill(xb, s), torch.fill(xi, s), torch.fill(x, sd)


def tensor_of_int(x, n: int):
    return x * torch.tensor(n), torch.tensor(n) + 1


def tensor_of_float(x, f: float):
    return x + torch.tensor(f), torch.tensor(f, dtype=torch.float64) * 2


def tensor_of_bool(x, b: bool):
    return torch.where(torch.tensor(b), x, -x), torch.tensor(b) | (x > 0)


def number(low: int, high: int):
    return lambda: int(torch.randint(low, high, ()))


WRITES_SAMPLES: dict[str, list[Sample]] = {
    "aten::copy": [scripted(copy, X, randn(4, 6), randn(6), scalar(), XB)],
    "aten::fill.Tensor": [scripted(fill_tensor, X, scalar(), XB, XI, scalar(F64))],
    "aten::tensor.int": [scripted(tensor_of_int, X3, number(-9, 10))],
    "aten::tensor.float": [scripted(tensor_of_float, X3, lambda: float(torch.randn(())))],
    "aten::tensor.bool": [scripted(tensor_of_bool, X3, lambda: bool(torch.rand(()) < 0.5))],
}
