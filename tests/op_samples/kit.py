"""What the op samples are made of: `Sample`, the ways to build a TorchScript model, input makers, and the
unary/binary families that turn one torch callable into a model of all its cases."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor

Maker = Callable[[], Any]
F32, F64, BF16, I64 = torch.float32, torch.float64, torch.bfloat16, torch.int64


@dataclass(frozen=True)
class Sample:
    build: Callable[[tuple], Any]  # example inputs -> ScriptFunction
    inputs: tuple[Maker, ...]

    def make_inputs(self) -> tuple:
        return tuple(make() for make in self.inputs)


def scripted(fn: Callable, *inputs: Maker) -> Sample:
    return Sample(lambda example: torch.jit.script(fn), inputs)


def traced(fn: Callable, *inputs: Maker) -> Sample:
    """A trace records the overload each call dispatched to, so one generic model serves a whole family of ops
    (`unary`, `binary`), where a script needs each op spelled out in source."""
    return Sample(lambda example: torch.jit.trace(fn, example), inputs)


def from_ir(name: str, source: str, *inputs: Maker) -> Sample:
    """For overloads neither script nor trace emits any more (old archives still hold them)."""
    return Sample(lambda example: torch._C._create_function_from_graph(name, torch._C.parse_ir(source)), inputs)


# --- input makers: new random values on every call, never all zeros -----------------------------------------------

def randn(*shape: int, dtype: torch.dtype = F32, scale: float = 1.0) -> Maker:
    return lambda: (torch.randn(shape) * scale).to(dtype)


def uniform(low: float, high: float, *shape: int, dtype: torch.dtype = F32) -> Maker:
    return lambda: (torch.rand(shape) * (high - low) + low).to(dtype)


def nonzero(*shape: int, dtype: torch.dtype = F32) -> Maker:
    """Both signs, magnitudes in [0.5, 2): divisors."""
    return lambda: (torch.where(torch.rand(shape) < 0.5, -1.0, 1.0) * (torch.rand(shape) * 1.5 + 0.5)).to(dtype)


def ints(low: int, high: int, *shape: int, dtype: torch.dtype = I64, nonzero: bool = False) -> Maker:
    def make():
        x = torch.randint(low, high, shape, dtype=dtype)
        return torch.where(x == 0, torch.ones_like(x), x) if nonzero else x
    return make


def halves(*shape: int, dtype: torch.dtype = F32) -> Maker:
    """Values on the half-way points (-2.5, 0.5, 1.5, ...), where rounding modes differ, and between them."""
    return lambda: torch.cat([torch.randint(-8, 8, (shape[0], shape[1] // 2)) + 0.5,
                              torch.randn(shape[0], shape[1] - shape[1] // 2) * 3], 1).to(dtype)


def edges(*shape: int, dtype: torch.dtype = F32, at: int = 0) -> Maker:
    """Random values with NaN, +inf and -inf at flat positions at, at + 1, at + 2 (those that exist)."""
    def make():
        x = torch.randn(shape).view(-1)
        special = torch.tensor([float("nan"), float("inf"), float("-inf")])[:max(0, x.numel() - at)]
        x[at:at + len(special)] = special
        return x.view(shape).to(dtype)
    return make


def late_edges(*shape: int, dtype: torch.dtype = F32) -> Maker:
    """NaN/inf where `edges` has ordinary values, so a binary op meets NaN on either side."""
    return edges(*shape, dtype=dtype, at=3)


def infinite_rows() -> Tensor:
    """[4, 6]: row 0 holds +inf, row 1 is all -inf, row 2 holds one -inf."""
    x = torch.randn(4, 6)
    x[0, 2], x[1], x[2, 0] = float("inf"), float("-inf"), float("-inf")
    return x


def mask(*shape: int, p_true: float = 0.5) -> Maker:
    return lambda: torch.rand(shape) < p_true


def index(high: int, *shape: int) -> Maker:
    return lambda: torch.randint(0, high, shape)


def scalar(dtype: torch.dtype = F32) -> Maker:
    return lambda: torch.randn(()).to(dtype)


def positive(*shape: int, dtype: torch.dtype = F32) -> Maker:
    return uniform(0.5, 4.0, *shape, dtype=dtype)


def small_ints(*shape: int, dtype: torch.dtype = F32) -> Maker:
    """Integer-valued, so equality comparisons come out both ways."""
    return lambda: torch.randint(-2, 3, shape).to(dtype)


def sign_ints(*shape: int, dtype: torch.dtype = F32) -> Maker:
    return lambda: torch.randint(-3, 4, shape).to(dtype)


def wide(*shape: int, dtype: torch.dtype = F32) -> Maker:
    return randn(*shape, dtype=dtype, scale=5.0)


def between(low: float, high: float) -> Callable[..., Maker]:
    return lambda *shape, dtype=F32: uniform(low, high, *shape, dtype=dtype)


def sparse(*shape: int, p_nonzero: float = 0.1, dtype: torch.dtype = F32) -> Maker:
    """Mostly zeros (any/all must see both outcomes), the rest random."""
    def make():
        values = torch.randn(shape).to(dtype) if dtype.is_floating_point else torch.randint(1, 5, shape, dtype=dtype)
        return values * (torch.rand(shape) < p_nonzero)
    return make


# --- inputs the samples share: [4, 6] float32, bfloat16, int64, [2, 4, 6], a mask ---------------------------------

INT_PAIR = (ints(-20, 20, 4, 6), ints(-5, 6, 4, 6, nonzero=True))
X, XB, XI = randn(4, 6), randn(4, 6, dtype=BF16), ints(-9, 10, 4, 6)
X3, M = randn(2, 4, 6), mask(4, 6)
XW, XWB, XWI = wide(4, 6), wide(4, 6, dtype=BF16), ints(-20, 20, 4, 6)


# --- families: one model per op, its cases as the model's outputs -------------------------------------------------

def unary(op: Callable, make: Callable[..., Maker] = randn, floats: tuple[torch.dtype, ...] = (BF16, F64),
          others: tuple[Maker, ...] = ()) -> Sample:
    """op on a [4, 6] float32 tensor, its transpose, a column slice, one element (0-d); then on the other
    float dtypes and on `others` (int64, bool...)."""
    def model(x, *rest):
        return (op(x), op(x.t()), op(x[:, 1:]), op(x[1, 2])) + tuple(op(o) for o in rest)
    return traced(model, make(4, 6), *[make(4, 6, dtype=dtype) for dtype in floats], *others)


def binary(op: Callable, make_a: Callable[..., Maker] = randn, make_b: Callable[..., Maker] = randn,
           floats: tuple[torch.dtype, ...] = (BF16, F64), int64: tuple[Maker, Maker] | None = None) -> Sample:
    """op on two [4, 6] float32 tensors, their transposes, strided slices, a [4, 1, 6] with a [5, 1], a tensor with
    a 0-d one; then on pairs of each other float dtype, bfloat16 with float32, int64, and float32 with int64."""
    def model(a, b, c, d, s, *pairs):
        return ((op(a, b), op(a.t(), b.t()), op(a[:, ::2], b[:, 1::2]), op(c, d), op(a, s))
                + tuple(op(pairs[i], pairs[i + 1]) for i in range(0, len(pairs), 2)))
    inputs = [make_a(4, 6), make_b(4, 6), make_a(4, 1, 6), make_b(5, 1), make_b()]
    for dtype in floats:
        inputs += [make_a(4, 6, dtype=dtype), make_b(4, 6, dtype=dtype)]
    if BF16 in floats:
        inputs += [make_a(4, 6, dtype=BF16), make_b(4, 6)]
    if int64:
        inputs += [*int64, make_a(4, 6), int64[1]]
    return traced(model, *inputs)
