"""Samples of the ops `transpiler/lower_pointwise.py` lowers: arithmetic, comparisons, selection, activations,
casts and fills."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .kit import (BF16, INT_PAIR, M, X, X3, XB, XI, XW, XWB, XWI, Sample, between, binary, edges, from_ir, halves,
                  ints, late_edges, mask, nonzero, positive, randn, scalar, scripted, sign_ints, small_ints, unary,
                  uniform, wide)


# --- arithmetic with Python scalars, rounding modes and exponents -------------------------------------------------

def add_scalar(x, xb, xi):
    return x + 2.5, x.t() + 2.5, torch.add(x, 2.5, alpha=2.0), xb + 2.5, xi + 3, xi + 2.5


def sub_scalar(x, xb, xi):
    return x - 2.5, x[:, 1:] - 2.5, torch.sub(x, 2.5, alpha=2.0), xb - 2.5, xi - 3, xi - 0.5


def rsub_scalar(x, xb, xi):
    return torch.rsub(x, 2.5), torch.rsub(x.t(), 2.5, 2.0), torch.rsub(xb, 2.5), torch.rsub(xi, 3)


def mul_scalar(x, xb, xi):
    return x * 2.5, x.t() * -0.5, xb * 2.5, xi * 3, xi * 2.5


def div_scalar(x, xb, xi):
    return x / 3.0, x.t() / -0.5, xb / 3.0, xi / 2


def div_mode(a, b, c, d, ai, bi):
    return (torch.div(a, b, rounding_mode="floor"), torch.div(a.t(), b.t(), rounding_mode="trunc"),
            torch.div(c, d, rounding_mode="floor"), torch.div(ai, bi, rounding_mode="floor"),
            torch.div(ai, bi, rounding_mode="trunc"))


def div_scalar_mode(x, xb, xi):
    return (torch.div(x, 2.5, rounding_mode="floor"), torch.div(x.t(), -1.5, rounding_mode="trunc"),
            torch.div(xb, 3.0, rounding_mode="floor"), torch.div(xi, 4, rounding_mode="floor"),
            torch.div(xi, -3, rounding_mode="trunc"))


def max_other(a, b, c, d, ai, bi):
    return torch.max(a, b), torch.max(a.t(), b.t()), torch.max(c, d), torch.max(ai, bi)


def min_other(a, b, c, d, ai, bi):
    return torch.min(a, b), torch.min(a.t(), b.t()), torch.min(c, d), torch.min(ai, bi)


def pow_tensor_scalar(x, p, pb, xi):
    return x ** 2, x.t() ** 3, p ** 0.5, p ** -0.5, x ** 1, p ** -1, p[:, 1:] ** 2.5, pb ** 2, xi ** 2


def pow_scalar(x, xb):
    return 2.0 ** x, 1.5 ** x.t(), 2.0 ** xb


def remainder_scalar(x, xb, xi):
    return x % 1.5, x.t() % -2.0, xb % 1.5, xi % 3, xi % -4, xi % 1.5


def floor_divide_scalar(x, xb, xi):
    return x // 1.5, x.t() // -2.0, xb // 1.5, xi // 3, xi // -4, xi // 1.5


def lerp(a, b, c, d, ab, bb):
    return torch.lerp(a, b, 0.3), torch.lerp(a.t(), b.t(), 0.7), torch.lerp(c, d, 0.3), torch.lerp(ab, bb, 0.3)


def addcmul(x, a, b, c, d, xb, ab, bb):
    return (torch.addcmul(x, a, b, value=0.5), torch.addcmul(x.t(), a.t(), b.t()), torch.addcmul(x[0], c, d),
            torch.addcmul(xb, ab, bb, value=-2.0))


def addcdiv(x, a, b, c, d, xb, ab, bb):
    return (torch.addcdiv(x, a, b, value=0.5), torch.addcdiv(x.t(), a.t(), b.t()), torch.addcdiv(x[0], c, d),
            torch.addcdiv(xb, ab, bb, value=-2.0))


RSUB_TENSOR_IR = """
graph(%a : Tensor, %b : Tensor, %c : Tensor, %d : Tensor, %ai : Tensor, %bi : Tensor):
  %one : int = prim::Constant[value=1]()
  %two : int = prim::Constant[value=2]()
  %r0 : Tensor = aten::rsub(%a, %b, %one)
  %r1 : Tensor = aten::rsub(%a, %b, %two)
  %r2 : Tensor = aten::rsub(%c, %d, %one)
  %r3 : Tensor = aten::rsub(%ai, %bi, %two)
  %out : (Tensor, Tensor, Tensor, Tensor) = prim::TupleConstruct(%r0, %r1, %r2, %r3)
  return (%out)
"""


# --- comparisons with a scalar (integer-valued inputs, so each comes out both ways) -------------------------------

def eq_scalar(x, xb, xi):
    return x == 1.0, x.t() == -1.0, xb == 1.0, xi == 2, xi == 2.0


def ne_scalar(x, xb, xi):
    return x != 1.0, x.t() != -1.0, xb != 1.0, xi != 2, xi != 2.0


def lt_scalar(x, xb, xi):
    return x < 1.0, x.t() < -1.0, xb < 1.0, xi < 2, xi < 2.0


def le_scalar(x, xb, xi):
    return x <= 1.0, x.t() <= -1.0, xb <= 1.0, xi <= 2, xi <= 2.0


def gt_scalar(x, xb, xi):
    return x > 1.0, x.t() > -1.0, xb > 1.0, xi > 2, xi > 2.0


def ge_scalar(x, xb, xi):
    return x >= 1.0, x.t() >= -1.0, xb >= 1.0, xi >= 2, xi >= 2.0


def bitwise_not(m):
    return ~m, ~m.t(), torch.bitwise_not(m[:, 1:])


def masks_and(a, b):  # transformers' masking utilities combine boolean masks with `&`
    return a & b, a.t() & b.t(), a[:, 1:] & b[:, :1]


def masks_or(a, b):
    return a | b, a.t() | b.t(), a[:, 1:] | b[:, :1]


def bitwise_and(a, b):
    return torch.bitwise_and(a, b), torch.bitwise_and(a.t(), b.t())


def bitwise_or(a, b):
    return torch.bitwise_or(a, b), torch.bitwise_or(a.t(), b.t())


# --- selection and clamping ---------------------------------------------------------------------------------------

def where_self(m, a, b, m3, c, ab, bb, ai, bi):
    return (torch.where(m, a, b), torch.where(m.t(), a.t(), b.t()), torch.where(m3, c, a[0]),
            torch.where(m, ab, bb), torch.where(m, ai, bi))


def where_scalar_other(m, x, m3, c, xb, xi):
    return (torch.where(m, x, 0.5), torch.where(m.t(), x.t(), -1.0), torch.where(m3, c, 0.5),
            torch.where(m, xb, 0.5), torch.where(m, xi, 3), torch.where(m, xi, 2.5))


def where_scalar_self(m, x, m3, c, xb, xi):
    return (torch.where(m, 0.5, x), torch.where(m.t(), -1.0, x.t()), torch.where(m3, 0.5, c),
            torch.where(m, 0.5, xb), torch.where(m, 3, xi), torch.where(m, 2.5, xi))


def where_scalar(m, m3):
    return torch.where(m, 1.0, 0.0), torch.where(m.t(), 1, -1), torch.where(m3, 2.5, -1.0)


def masked_fill_scalar(x, m, x3, row, xb, xi):
    return (x.masked_fill(m, -1.5), x.t().masked_fill(m.t(), 2.0), x3.masked_fill(row, 0.5), xb.masked_fill(m, 2.0),
            xi.masked_fill(m, -7))


def masked_fill_tensor(x, m, v, xi, vi):
    return x.masked_fill(m, v), x.t().masked_fill(m.t(), v), xi.masked_fill(m, vi)


def clamp(x, e, xb, xi):
    return (torch.clamp(x, -0.5, 0.5), x.t().clamp(min=-0.5), x[:, 1:].clamp(max=0.5), torch.clamp(e, -1.0, 1.0),
            torch.clamp(xb, -0.5, 0.5), torch.clamp(xi, -3, 3))


def clamp_tensor(x, low, high, rows, xb, xi):
    """Tensor bounds: 0-dim, a row per row, a broadcast column, one side only; bfloat16 and int64 inputs."""
    return (x.clamp(min=low, max=high), x.clamp(min=rows), x.t().clamp(max=high), x.clamp(min=low, max=rows),
            xb.clamp(min=low.to(torch.bfloat16), max=high.to(torch.bfloat16)), xi.clamp(min=(low * 4).long()))


def clamp_min(x, e, xb, xi):
    return x.clamp_min(0.1), x.t().clamp_min(-0.5), e.clamp_min(0.0), xb.clamp_min(0.1), xi.clamp_min(2)


def clamp_max(x, e, xb, xi):
    return x.clamp_max(0.1), x.t().clamp_max(-0.5), e.clamp_max(0.0), xb.clamp_max(0.1), xi.clamp_max(2)


# --- activations --------------------------------------------------------------------------------------------------

def relu6(x, e, xb):
    return F.relu6(x), F.relu6(x.t()), F.relu6(e), F.relu6(xb)


def hardtanh(x, xb):
    return F.hardtanh(x), F.hardtanh(x.t(), -0.5, 0.5), F.hardtanh(xb)


def gelu(x, xb):
    return F.gelu(x), F.gelu(x.t(), approximate="tanh"), F.gelu(xb), F.gelu(xb, approximate="tanh")


def silu(x, xb):
    return F.silu(x), F.silu(x.t()), F.silu(xb)


def mish(x, xb):
    return F.mish(x), F.mish(x.t()), F.mish(xb)


def hardswish(x, xb):
    return F.hardswish(x), F.hardswish(x.t()), F.hardswish(xb)


def hardsigmoid(x, xb):
    return F.hardsigmoid(x), F.hardsigmoid(x.t()), F.hardsigmoid(xb)


def elu(x, xb):
    return F.elu(x), F.elu(x.t(), 0.5), F.elu(xb)


def leaky_relu(x, xb):
    return F.leaky_relu(x), F.leaky_relu(x.t(), 0.2), F.leaky_relu(xb)


def softplus(x, xb):
    return F.softplus(x), F.softplus(x.t(), 2.0, 1.0), F.softplus(xb)


# --- casts, copies and fills --------------------------------------------------------------------------------------

def to_dtype(x, xb, xi, m):
    return (x.to(torch.bfloat16), x.t().to(torch.float64), x.to(torch.int64), x[:, 1:].to(torch.int32),
            xb.to(torch.float32), xi.to(torch.float32), m.to(torch.float32), x.to(torch.bool))


def to_other(x, xb, xi):
    return x.to(xb), xb.to(x), x.t().to(xi), xi.to(x)


def to_dtype_layout(x, xb, xi):
    return (x.to(dtype=torch.float64, layout=torch.strided), x.t().to(dtype=torch.bfloat16, layout=torch.strided),
            xb.to(dtype=torch.float32, layout=torch.strided), xi.to(dtype=torch.float32, layout=torch.strided))


def to_device(x, xb, xi):
    cpu = torch.device("cpu")
    return x.to(cpu, torch.float64), x.t().to(cpu, torch.bfloat16), xb.to(cpu, torch.float32), xi.to(cpu, torch.float32)


def type_as(x, xb, xi):
    return x.type_as(xi), x.t().type_as(xb), xb.type_as(x), xi.type_as(x)


def dropout(x, xb):
    return F.dropout(x, 0.5, False), F.dropout(x.t(), 0.1, False), F.dropout(xb, 0.5, False)


def feature_dropout(x, xb):
    return (torch.feature_dropout(x, 0.5, False), torch.feature_dropout(x.t(), 0.1, False),
            torch.feature_dropout(xb, 0.5, False))


def alpha_dropout(x, xb):
    return (torch.alpha_dropout(x, 0.5, False), torch.alpha_dropout(x.t(), 0.1, False),
            torch.alpha_dropout(xb, 0.5, False))


def detach(x, xb, xi):
    return x.detach(), x.t().detach(), xb.detach(), xi.detach()


def clone(x, xb, xi):
    return x.clone(), x.t().clone(), xb.clone(), xi.clone()


def contiguous(x, xb, xi):
    return x.t().contiguous(), x[:, 1:].contiguous(), xb.t().contiguous(), xi.t().contiguous()


def fill(x, xb, xi):
    return torch.fill(x, 1.5), torch.fill(x.t(), -2.0), torch.fill(xb, 0.5), torch.fill(xi, 7)


def zeros_like(x, xb, xi):
    return torch.zeros_like(x), torch.zeros_like(x.t()), torch.zeros_like(xb), torch.zeros_like(x, dtype=torch.int64)


def ones_like(x, xb, xi):
    return torch.ones_like(x), torch.ones_like(x.t()), torch.ones_like(xb), torch.ones_like(xi)


def full_like(x, xb, xi):
    return (torch.full_like(x, 2.5), torch.full_like(x.t(), -1.0), torch.full_like(xb, 0.5), torch.full_like(xi, 7),
            torch.full_like(x, 3, dtype=torch.int64))


# sizes from the input's, so freezing cannot fold the new tensors into constants
def zeros_ones_full(x, xb, xi):
    return (torch.zeros(x.size(0), x.size(1)), torch.zeros(x.size(), dtype=torch.int64), torch.ones(x.shape),
            torch.ones([xb.size(1)], dtype=torch.bfloat16), torch.full(x.shape, 2.5),
            torch.full([xi.size(0)], 7, dtype=torch.int64))


def new_zeros_ones_full(x, xb, xi):
    return (x.new_zeros(x.size(0), x.size(1)), xi.new_ones(x.size()), xb.new_full([x.size(1)], 0.75),
            x.new_full(x.shape, -2.0), x.new_zeros([xi.size(0)], dtype=torch.int64))


# --- the table ----------------------------------------------------------------------------------------------------

CMP_INTS = (ints(-2, 3, 4, 6), ints(-2, 3, 4, 6))
TRUTHY_INTS = (ints(-1, 2, 4, 6), ints(-1, 2, 4, 6))
WHERE_SCALAR_INPUTS = (M, X, mask(4, 1, 6), randn(5, 1), XB, XI)
CLAMP_INPUTS = (X, edges(4, 6), XB, XI)

# bounds from the input's sizes, so freezing cannot fold them away; fold_shapes makes them constants
def arange(x, xb):
    n, m = x.size(0), x.size(1)
    return (torch.arange(m) + x, torch.arange(m * 0.5 + 0.25) * x[0, :4], torch.arange(n, dtype=torch.float16),
            xb * torch.arange(m, dtype=torch.bfloat16), torch.arange(m - 6), torch.arange(m * 1.0 - 0.5),
            torch.arange(n, dtype=torch.float64) * x.t()[0, 0])


def arange_start(x, xi):
    n, m = x.size(0), x.size(1)
    return (torch.arange(-n, m) * 2, torch.arange(n, m, dtype=torch.float64) + x[0, 0],
            torch.arange(n - 0.5, m + 0.25), torch.arange(0.5, m + 0.7, dtype=torch.int64),
            torch.arange(0.5, m + 0.7, dtype=torch.int32), torch.arange(m, m), xi + torch.arange(1, m + 1))


def arange_start_step(x):
    n, m = x.size(0), x.size(1)
    return (torch.arange(1, 4 * m, n) + x[0, 0], torch.arange(m, -n, -3), torch.arange(0.5, m * 0.7, 0.3),
            torch.arange(m * 1.0, -0.1, -0.4, dtype=torch.float64), torch.arange(0.0, 1.0, 1.0 / (10 * m)),
            torch.arange(-n, 2 * m, 2.5, dtype=torch.int64), torch.arange(-n, m, 0.75, dtype=torch.float16),
            torch.arange(n, 100 * m, 7, dtype=torch.int32))


POINTWISE_SAMPLES: dict[str, list[Sample]] = {
    "aten::add.Tensor": [binary(lambda a, b: (torch.add(a, b), torch.add(a, b, alpha=2)), int64=INT_PAIR)],
    "aten::add.Scalar": [scripted(add_scalar, X, XB, XI)],
    "aten::sub.Tensor": [binary(lambda a, b: (torch.sub(a, b), torch.sub(a, b, alpha=2)), int64=INT_PAIR)],
    "aten::sub.Scalar": [scripted(sub_scalar, X, XB, XI)],
    "aten::rsub.Scalar": [scripted(rsub_scalar, X, XB, XI)],
    "aten::rsub.Tensor": [from_ir("rsub_tensor", RSUB_TENSOR_IR, X, randn(4, 6), randn(4, 1, 6), randn(5, 1),
                                  *INT_PAIR)],
    "aten::mul.Tensor": [binary(torch.mul, int64=INT_PAIR)],
    "aten::mul.Scalar": [scripted(mul_scalar, X, XB, XI)],
    "aten::div.Tensor": [binary(torch.div, make_b=nonzero, int64=INT_PAIR)],
    "aten::div.Scalar": [scripted(div_scalar, X, XB, XI)],
    "aten::div.Scalar_mode": [scripted(div_scalar_mode, XW, XWB, XWI)],
    "aten::max.other": [scripted(max_other, X, randn(4, 6), randn(4, 1, 6), randn(5, 1), *INT_PAIR)],
    "aten::min.other": [scripted(min_other, X, randn(4, 6), randn(4, 1, 6), randn(5, 1), *INT_PAIR)],
    "aten::div.Tensor_mode": [scripted(div_mode, XW, nonzero(4, 6), wide(4, 1, 6), nonzero(5, 1), *INT_PAIR)],
    "aten::neg": [unary(torch.neg, others=(XI,))],
    "aten::pow.Tensor_Scalar": [scripted(pow_tensor_scalar, X, positive(4, 6), positive(4, 6, dtype=BF16), XI)],
    "aten::pow.Tensor_Tensor": [binary(torch.pow, positive, randn, int64=(ints(1, 5, 4, 6), ints(0, 4, 4, 6)))],
    "aten::pow.Scalar": [scripted(pow_scalar, X, XB)],
    "aten::sqrt": [unary(torch.sqrt, positive)],
    "aten::rsqrt": [unary(torch.rsqrt, positive)],
    "aten::exp": [unary(torch.exp)],
    "aten::log": [unary(torch.log, positive)],
    "aten::log2": [unary(torch.log2, positive)],
    "aten::exp2": [unary(torch.exp2)],
    "aten::log1p": [unary(torch.log1p, positive)],
    "aten::expm1": [unary(torch.expm1)],
    "aten::abs": [unary(torch.abs, others=(XI,))],
    "aten::sin": [unary(torch.sin)],
    "aten::cos": [unary(torch.cos)],
    "aten::tan": [unary(torch.tan, between(-1, 1))],
    "aten::tanh": [unary(torch.tanh)],
    "aten::sigmoid": [unary(torch.sigmoid, wide)],
    "aten::erf": [unary(torch.erf)],
    "aten::relu": [unary(torch.relu, edges, others=(XI,))],
    "aten::relu6": [scripted(relu6, XW, edges(4, 6), XWB)],
    "aten::gelu": [scripted(gelu, XW, XWB)],
    "aten::silu": [scripted(silu, XW, XWB)],
    "aten::hardswish": [scripted(hardswish, XW, XWB)],
    "aten::hardsigmoid": [scripted(hardsigmoid, XW, XWB)],
    "aten::hardtanh": [scripted(hardtanh, X, XB)],
    "aten::mish": [scripted(mish, XW, XWB)],
    "aten::elu": [scripted(elu, X, XB)],
    "aten::leaky_relu": [scripted(leaky_relu, X, XB)],
    "aten::softplus": [scripted(softplus, XW, XWB)],
    "aten::clamp": [scripted(clamp, *CLAMP_INPUTS)],
    "aten::clamp.Tensor": [scripted(clamp_tensor, X, uniform(-0.8, -0.2), uniform(0.2, 0.8), randn(4, 1), XB, XI)],
    "aten::clamp_min": [scripted(clamp_min, *CLAMP_INPUTS)],
    "aten::clamp_max": [scripted(clamp_max, *CLAMP_INPUTS)],
    "aten::where.self": [scripted(where_self, M, X, randn(4, 6), mask(4, 1, 6), randn(5, 1), XB,
                                  randn(4, 6, dtype=BF16), XI, ints(-9, 10, 4, 6))],
    "aten::where.ScalarOther": [scripted(where_scalar_other, *WHERE_SCALAR_INPUTS)],
    "aten::where.ScalarSelf": [scripted(where_scalar_self, *WHERE_SCALAR_INPUTS)],
    "aten::where.Scalar": [scripted(where_scalar, M, mask(4, 1, 6))],
    "aten::masked_fill.Scalar": [scripted(masked_fill_scalar, X, M, X3, mask(6), XB, XI)],
    "aten::masked_fill.Tensor": [scripted(masked_fill_tensor, X, M, scalar(), XI, lambda: torch.randint(-9, 10, ()))],
    **{f"aten::{name}.Tensor": [binary(getattr(torch, name), small_ints, small_ints, int64=CMP_INTS)]
       for name in ("eq", "ne", "lt", "le", "gt", "ge")},
    **{f"aten::{name}.Scalar": [scripted(fn, small_ints(4, 6), small_ints(4, 6, dtype=BF16), ints(-2, 5, 4, 6))]
       for name, fn in (("eq", eq_scalar), ("ne", ne_scalar), ("lt", lt_scalar), ("le", le_scalar),
                        ("gt", gt_scalar), ("ge", ge_scalar))},
    "aten::logical_not": [unary(torch.logical_not, sign_ints, others=(M, TRUTHY_INTS[0]))],
    "aten::logical_and": [binary(torch.logical_and, mask, mask, floats=(), int64=TRUTHY_INTS)],
    "aten::logical_or": [binary(torch.logical_or, mask, mask, floats=(), int64=TRUTHY_INTS)],
    "aten::bitwise_not": [scripted(bitwise_not, M)],
    "aten::__and__.Tensor": [scripted(masks_and, M, M)],
    "aten::__or__.Tensor": [scripted(masks_or, M, M)],
    "aten::bitwise_and.Tensor": [scripted(bitwise_and, M, M)],
    "aten::bitwise_or.Tensor": [scripted(bitwise_or, M, M)],
    "aten::maximum": [binary(torch.maximum, edges, late_edges, int64=INT_PAIR)],
    "aten::minimum": [binary(torch.minimum, edges, late_edges, int64=INT_PAIR)],
    "aten::reciprocal": [unary(torch.reciprocal, nonzero)],
    "aten::floor": [unary(torch.floor, wide)],
    "aten::ceil": [unary(torch.ceil, wide)],
    "aten::round": [unary(torch.round, halves)],
    "aten::sign": [unary(torch.sign, sign_ints, others=(XI,))],
    "aten::remainder.Tensor": [binary(torch.remainder, wide, nonzero, int64=INT_PAIR)],
    "aten::remainder.Scalar": [scripted(remainder_scalar, XW, XWB, XWI)],
    "aten::floor_divide": [binary(torch.floor_divide, wide, nonzero, int64=INT_PAIR)],
    "aten::floor_divide.Scalar": [scripted(floor_divide_scalar, XW, XWB, XWI)],
    "aten::to.dtype": [scripted(to_dtype, XW, XB, XI, M)],
    "aten::to.other": [scripted(to_other, XW, XB, XI)],
    "aten::to.dtype_layout": [scripted(to_dtype_layout, X, XB, XI)],
    "aten::to.device": [scripted(to_device, X, XB, XI)],
    "aten::type_as": [scripted(type_as, XW, XB, XI)],
    "aten::dropout": [scripted(dropout, X, XB)],
    "aten::feature_dropout": [scripted(feature_dropout, X, XB)],
    "aten::alpha_dropout": [scripted(alpha_dropout, X, XB)],
    "aten::detach": [scripted(detach, X, XB, XI)],
    "aten::clone": [scripted(clone, X, XB, XI)],
    "aten::contiguous": [scripted(contiguous, X, XB, XI)],
    "aten::lerp.Scalar": [scripted(lerp, X, randn(4, 6), randn(4, 1, 6), randn(5, 1), XB, randn(4, 6, dtype=BF16))],
    "aten::addcmul": [scripted(addcmul, X, randn(4, 6), randn(4, 6), randn(4, 1, 6), randn(5, 1), XB,
                               randn(4, 6, dtype=BF16), randn(4, 6, dtype=BF16))],
    "aten::addcdiv": [scripted(addcdiv, X, randn(4, 6), nonzero(4, 6), randn(4, 1, 6), nonzero(5, 1), XB,
                               randn(4, 6, dtype=BF16), nonzero(4, 6, dtype=BF16))],
    "aten::fill.Scalar": [scripted(fill, X, XB, XI)],
    "aten::zeros_like": [scripted(zeros_like, X, XB, XI)],
    "aten::ones_like": [scripted(ones_like, X, XB, XI)],
    "aten::full_like": [scripted(full_like, X, XB, XI)],
    "aten::zeros": [scripted(zeros_ones_full, X, XB, XI)],
    "aten::ones": [scripted(zeros_ones_full, X, XB, XI)],
    "aten::full": [scripted(zeros_ones_full, X, XB, XI)],
    "aten::new_zeros": [scripted(new_zeros_ones_full, X, XB, XI)],
    "aten::new_ones": [scripted(new_zeros_ones_full, X, XB, XI)],
    "aten::new_full": [scripted(new_zeros_ones_full, X, XB, XI)],
    "aten::isnan": [unary(torch.isnan, edges)],
    "aten::isinf": [unary(torch.isinf, edges)],
    "aten::arange": [scripted(arange, X, XB)],
    "aten::arange.start": [scripted(arange_start, X, XI)],
    "aten::arange.start_step": [scripted(arange_start_step, X)],
}


# --- a case that runs into a bug outside the lowerings: a strict xfail in test_ops.py -----------------------------

def continued_line(x):
    return torch.relu(x) + \
        1


BACKSLASH_CONTINUED_SOURCE = scripted(continued_line, X)
