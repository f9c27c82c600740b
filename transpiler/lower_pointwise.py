"""Lowerings of pointwise ops and pointwise composites (gelu, silu, hardswish, ...), in kernel-IR primitives."""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import numpy

from . import kernel_ir as K
from .symbolic import SymSize
from .lowering import (RUNTIME_SIZE, LowerContext, TensorBox, broadcast_shapes, compute_dtype, is_box, lowering,
                       make_box, promoted_dtype, require, value_at)

Math = Callable[..., K.KExpr]


def pointwise(ctx: LowerContext, fn: Math, *inputs: Any, math_dtype: Optional[str] = None) -> TensorBox:
    """out[i] = fn(inputs at i): inputs broadcast, cast to `math_dtype` (default: the output's compute dtype)."""
    out_dtype = ctx.out_dtype
    math_dtype = math_dtype or compute_dtype(out_dtype)
    shape = broadcast_shapes(*[x.shape for x in inputs if is_box(x)]) if any(map(is_box, inputs)) else ()
    require(tuple(shape) == tuple(ctx.out_shape), "broadcast shape differs from the observed output")
    result_dtype = compute_dtype(out_dtype)

    def inner(index):
        args = [value_at(x, index, shape, math_dtype) for x in inputs]
        return K.cast(fn(*args), result_dtype)

    return make_box(shape, out_dtype, inner, inputs)


def unary(name: str) -> Math:
    return lambda x: K.op(name, x)


def binary(name: str) -> Math:
    return lambda a, b: K.op(name, a, b)


def c(value: float, like: K.KExpr) -> K.KExpr:
    return K.const(value, like.dtype)


# --- arithmetic ---------------------------------------------------------------------------------------------------

@lowering("aten::add.Tensor", "aten::add.Scalar")
def add(ctx, a, b, alpha=1):
    if alpha != 1:
        return pointwise(ctx, lambda x, y: K.op("add", x, K.op("mul", y, c(alpha, y))), a, b)
    return pointwise(ctx, binary("add"), a, b)


@lowering("aten::sub.Tensor", "aten::sub.Scalar")
def sub(ctx, a, b, alpha=1):
    if alpha != 1:
        return pointwise(ctx, lambda x, y: K.op("sub", x, K.op("mul", y, c(alpha, y))), a, b)
    return pointwise(ctx, binary("sub"), a, b)


@lowering("aten::rsub.Scalar", "aten::rsub.Tensor")
def rsub(ctx, a, b, alpha=1):
    return sub(ctx, b, a, alpha)


@lowering("aten::mul.Tensor", "aten::mul.Scalar")
def mul(ctx, a, b):
    return pointwise(ctx, binary("mul"), a, b)


@lowering("aten::div.Tensor", "aten::div.Scalar")
def div(ctx, a, b):
    if ctx.device_type == "cuda" and is_box(a) and isinstance(b, (int, float)) and not isinstance(b, bool) \
            and compute_dtype(ctx.out_dtype).startswith("float"):
        # ATen's CUDA division by a scalar multiplies by its reciprocal, rounded in the math type (a last bit
        # apart from dividing: a detector's box decode `dx / wx` must round as the model does)
        kind = numpy.float32 if compute_dtype(ctx.out_dtype) == "float32" else numpy.float64
        with numpy.errstate(over="ignore", divide="ignore"):  # (1 / 0 is inf, as in ATen)
            inverse = float(kind(1.0) / kind(b))
        return pointwise(ctx, lambda x: K.op("mul", x, c(inverse, x)), a)
    return pointwise(ctx, binary("truediv"), a, b)


@lowering("aten::div.Tensor_mode", "aten::div.Scalar_mode")
def div_mode(ctx, a, b, rounding_mode=None):
    if rounding_mode is None:
        return div(ctx, a, b)
    if rounding_mode == "trunc":  # on integers the renderers' division already truncates; trunc is then a no-op
        return pointwise(ctx, lambda x, y: K.op("trunc", K.op("truediv", x, y)), a, b)
    return pointwise(ctx, binary("floordiv"), a, b)


@lowering("aten::floor_divide", "aten::floor_divide.Scalar")
def floor_divide(ctx, a, b):
    return pointwise(ctx, binary("floordiv"), a, b)


@lowering("aten::remainder.Tensor", "aten::remainder.Scalar")
def remainder(ctx, a, b):
    return pointwise(ctx, binary("mod"), a, b)


@lowering("aten::pow.Tensor_Scalar")
def pow_scalar(ctx, a, exponent):
    if exponent == 2:
        return pointwise(ctx, lambda x: K.op("mul", x, x), a)
    if exponent == 3:
        return pointwise(ctx, lambda x: K.op("mul", K.op("mul", x, x), x), a)
    if exponent == 0.5:
        return pointwise(ctx, unary("sqrt"), a)
    if exponent == -0.5:
        return pointwise(ctx, unary("rsqrt"), a)
    if exponent == 1:
        return pointwise(ctx, lambda x: x, a)
    if exponent == -1:
        return pointwise(ctx, unary("reciprocal"), a)
    return pointwise(ctx, lambda x: K.op("pow", x, c(exponent, x)), a)


@lowering("aten::pow.Tensor_Tensor", "aten::pow.Scalar")
def pow_tensor(ctx, a, b):
    return pointwise(ctx, binary("pow"), a, b)


@lowering("aten::maximum", "aten::max.other")
def maximum(ctx, a, b):
    return pointwise(ctx, binary("maximum"), a, b)


@lowering("aten::minimum", "aten::min.other")
def minimum(ctx, a, b):
    return pointwise(ctx, binary("minimum"), a, b)


for _name in ("neg", "exp", "exp2", "log", "log2", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "erf", "abs",
              "floor", "ceil", "round", "sign", "reciprocal", "sigmoid"):
    lowering(f"aten::{_name}")(lambda ctx, x, _n=_name: pointwise(ctx, unary(_n), x))


@lowering("aten::addcmul")
def addcmul(ctx, x, t1, t2, value=1):
    return pointwise(ctx, lambda a, b, d: K.op("add", a, K.op("mul", K.op("mul", b, d), c(value, b))), x, t1, t2)


@lowering("aten::addcdiv")
def addcdiv(ctx, x, t1, t2, value=1):
    return pointwise(ctx, lambda a, b, d: K.op("add", a, K.op("mul", K.op("truediv", b, d), c(value, b))), x, t1, t2)


@lowering("aten::lerp.Scalar")
def lerp(ctx, a, b, weight):
    return pointwise(ctx, lambda x, y: K.op("add", x, K.op("mul", K.op("sub", y, x), c(weight, x))), a, b)


# --- comparisons and logic: compared in the promoted input type, result bool -----------------------------------

for _name, _prim in (("eq", "eq"), ("ne", "ne"), ("lt", "lt"), ("le", "le"), ("gt", "gt"), ("ge", "ge")):
    lowering(f"aten::{_name}.Tensor", f"aten::{_name}.Scalar")(
        lambda ctx, a, b, _p=_prim: pointwise(ctx, binary(_p), a, b, math_dtype=compute_dtype(promoted_dtype(a, b))))


@lowering("aten::logical_not")
def logical_not(ctx, x):
    return pointwise(ctx, unary("not"), x, math_dtype="bool")


@lowering("aten::bitwise_not")
def bitwise_not(ctx, x):
    require(x.dtype == "bool", "bitwise_not on integers")
    return pointwise(ctx, unary("not"), x, math_dtype="bool")


@lowering("aten::logical_and")
def logical_and(ctx, a, b):
    return pointwise(ctx, binary("and"), a, b, math_dtype="bool")


@lowering("aten::logical_or")
def logical_or(ctx, a, b):
    return pointwise(ctx, binary("or"), a, b, math_dtype="bool")


@lowering("aten::__and__.Tensor", "aten::bitwise_and.Tensor", "aten::__or__.Tensor", "aten::bitwise_or.Tensor")
def bitwise_and_or(ctx, a, b):
    """`mask & other_mask` (transformers' attention masks): on bools, logical; on integers, not lowered."""
    require(ctx.out_dtype == "bool" and all(not is_box(x) or x.dtype == "bool" for x in (a, b)),
            "bitwise ops on integers")
    return pointwise(ctx, binary("and" if "and" in ctx.op else "or"), a, b, math_dtype="bool")


@lowering("aten::isnan")
def isnan(ctx, x):
    return pointwise(ctx, unary("isnan"), x, math_dtype=compute_dtype(x.dtype))


@lowering("aten::isinf")
def isinf(ctx, x):
    return pointwise(ctx, unary("isinf"), x, math_dtype=compute_dtype(x.dtype))


@lowering("aten::where.self", "aten::where.ScalarOther", "aten::where.ScalarSelf", "aten::where.Scalar")
def where(ctx, condition, a, b):
    dtype = compute_dtype(ctx.out_dtype)
    shape = ctx.out_shape

    def inner(index):
        return K.op("where", value_at(condition, index, shape, "bool"), value_at(a, index, shape, dtype),
                    value_at(b, index, shape, dtype))

    return make_box(shape, ctx.out_dtype, inner, [condition, a, b])


@lowering("aten::masked_fill.Scalar", "aten::masked_fill.Tensor")
def masked_fill(ctx, x, mask, value):
    require(not is_box(value) or value.shape == (), "masked_fill with a non-scalar value")
    return where(ctx, mask, value, x)


# --- activations, written in primitives --------------------------------------------------------------------------

@lowering("aten::relu")
def relu(ctx, x):
    return pointwise(ctx, lambda v: K.op("maximum", v, c(0, v)), x)


@lowering("aten::relu6")
def relu6(ctx, x):
    return hardtanh(ctx, x, 0.0, 6.0)


@lowering("aten::hardtanh")
def hardtanh(ctx, x, low=-1.0, high=1.0):
    return pointwise(ctx, lambda v: K.op("minimum", K.op("maximum", v, c(low, v)), c(high, v)), x)


@lowering("aten::clamp", "aten::clamp.Tensor")
def clamp(ctx, x, low=None, high=None):
    if is_box(low) or is_box(high):  # tensor bounds (torchvision's clip_boxes_to_image): max, then min, as ATen's
        bounds = [b for b in (low, high) if b is not None]  # vectorised kernel, NaN from any operand propagating

        def with_tensors(v, *given):
            lo, hi = (given[0] if low is not None else None), (given[-1] if high is not None else None)
            if lo is not None:
                v = K.op("maximum", v, lo)
            return K.op("minimum", v, hi) if hi is not None else v
        return pointwise(ctx, with_tensors, x, *bounds)

    def fn(v):
        # NaN propagates as in ATen: compare first, so a NaN input stays NaN
        if low is not None:
            v = K.op("where", K.op("lt", v, c(low, v)), c(low, v), v)
        if high is not None:
            v = K.op("where", K.op("gt", v, c(high, v)), c(high, v), v)
        return v

    return pointwise(ctx, fn, x)


@lowering("aten::clamp_min")
def clamp_min(ctx, x, low):
    return clamp(ctx, x, low, None)


@lowering("aten::clamp_max")
def clamp_max(ctx, x, high):
    return clamp(ctx, x, None, high)


@lowering("aten::gelu")
def gelu(ctx, x, approximate="none"):
    if approximate == "tanh":
        def fn(v):
            inner = K.op("mul", c(math.sqrt(2 / math.pi), v),
                         K.op("add", v, K.op("mul", c(0.044715, v), K.op("mul", v, K.op("mul", v, v)))))
            return K.op("mul", K.op("mul", c(0.5, v), v), K.op("add", c(1, v), K.op("tanh", inner)))
    else:
        def fn(v):
            return K.op("mul", K.op("mul", c(0.5, v), v),
                        K.op("add", c(1, v), K.op("erf", K.op("mul", v, c(1 / math.sqrt(2), v)))))
    return pointwise(ctx, fn, x)


@lowering("aten::silu")
def silu(ctx, x):
    return pointwise(ctx, lambda v: K.op("mul", v, K.op("sigmoid", v)), x)


@lowering("aten::mish")
def mish(ctx, x):
    return pointwise(ctx, lambda v: K.op("mul", v, K.op("tanh", _softplus(v, 1.0, 20.0))), x)


def _softplus(v, beta, threshold):
    scaled = K.op("mul", v, c(beta, v))
    soft = K.op("truediv", K.op("log1p", K.op("exp", scaled)), c(beta, v))
    return K.op("where", K.op("gt", scaled, c(threshold, v)), v, soft)


@lowering("aten::softplus")
def softplus(ctx, x, beta=1.0, threshold=20.0):
    return pointwise(ctx, lambda v: _softplus(v, beta, threshold), x)


# hardsigmoid and hardswish as ATen rounds them, per device: its CUDA kernels multiply by one_sixth (1.0f / 6.0f),
# its CPU kernels divide by six, each after x * clamp(x + 3, 0, 6), left to right. Another association differed in the
# last bit on 28% of elements (CPU), which a MobileNetV3 detector's score threshold turns into another box.
def _clamp6(v: K.KExpr) -> K.KExpr:
    return K.op("minimum", K.op("maximum", K.op("add", v, c(3, v)), c(0, v)), c(6, v))


ONE_SIXTH = float(numpy.float32(1.0 / 6.0))  # ATen's 1.0f / 6.0f, also where it computes in double


def _over6(ctx, v: K.KExpr) -> K.KExpr:
    return K.op("mul", v, c(ONE_SIXTH, v)) if ctx.device_type == "cuda" else K.op("truediv", v, c(6, v))


@lowering("aten::hardsigmoid")
def hardsigmoid(ctx, x):
    return pointwise(ctx, lambda v: _over6(ctx, _clamp6(v)), x)


@lowering("aten::hardswish")
def hardswish(ctx, x):
    return pointwise(ctx, lambda v: _over6(ctx, K.op("mul", v, _clamp6(v))), x)


@lowering("aten::elu")
def elu(ctx, x, alpha=1.0, scale=1.0, input_scale=1.0):
    def fn(v):
        negative = K.op("mul", c(alpha, v), K.op("expm1", K.op("mul", v, c(input_scale, v))))
        return K.op("mul", c(scale, v), K.op("where", K.op("gt", v, c(0, v)), v, negative))
    return pointwise(ctx, fn, x)


@lowering("aten::leaky_relu")
def leaky_relu(ctx, x, slope=0.01):
    return pointwise(ctx, lambda v: K.op("where", K.op("gt", v, c(0, v)), v, K.op("mul", v, c(slope, v))), x)


# --- identity-like and casts ---------------------------------------------------------------------------------

@lowering("aten::to.dtype", "aten::to.dtype_layout", "aten::to.other", "aten::to.device", "aten::type_as")
def to(ctx, x, *args):
    # a cast to float16/bfloat16 rounds there and then, even if the value stays inside the kernel
    return pointwise(ctx, lambda v: K.cast(v, ctx.out_dtype), x, math_dtype=compute_dtype(x.dtype))


@lowering("aten::dropout", "aten::feature_dropout", "aten::alpha_dropout")
def dropout(ctx, x, p, train):
    require(not train, "dropout in training mode")
    return pointwise(ctx, lambda v: v, x)


@lowering("aten::detach", "aten::clone", "aten::contiguous")
def identity(ctx, x, *args):
    return pointwise(ctx, lambda v: v, x)


def _filled(ctx, value):
    dtype = compute_dtype(ctx.out_dtype)
    if is_box(value):  # a number known only at run time (a loop's counter: a detector's class label)
        require(len(value.shape) == 0, "fill with a tensor value")
        return make_box(ctx.out_shape, ctx.out_dtype, lambda index: value_at(value, index, ctx.out_shape, dtype),
                        [value])
    return make_box(ctx.out_shape, ctx.out_dtype, lambda index: K.const(value, dtype), [])


@lowering("aten::zeros_like")
def zeros_like(ctx, x, *args):
    return _filled(ctx, 0)


@lowering("aten::ones_like")
def ones_like(ctx, x, *args):
    return _filled(ctx, 1)


@lowering("aten::full_like", "aten::fill.Scalar")
def full_like(ctx, x, value, *args):
    return _filled(ctx, value)


@lowering("aten::zeros", "aten::ones")
def zeros_or_ones(ctx, size, *args):  # size, dtype and device are the output type TorchScript recorded
    return _filled(ctx, 0 if ctx.op == "aten::zeros" else 1)


@lowering("aten::full")
def full(ctx, size, value, *args):
    return _filled(ctx, value)


@lowering("aten::new_zeros", "aten::new_ones")
def new_zeros_or_ones(ctx, x, size, *args):  # x only lends its dtype and device, which the output type holds
    return _filled(ctx, 0 if ctx.op == "aten::new_zeros" else 1)


@lowering("aten::new_full")
def new_full(ctx, x, size, value, *args):
    return _filled(ctx, value)


@lowering("aten::arange", "aten::arange.start", "aten::arange.start_step")
def arange(ctx, *args):
    """An iota: element i is start + step * i, an index expression, so it fuses into whatever reads it."""
    bounds = args[:{"aten::arange": 1, "aten::arange.start": 2}.get(ctx.op, 3)]
    start, end, step = (0, bounds[0], 1) if len(bounds) == 1 else (*bounds, 1)[:3]
    # an end computed at run time (RUNTIME_SIZE, see fuse.shape_argument): when it follows a dynamic dim
    # (arange(seq)), shape inference fitted the length, which is all the end decides; element i is start + step * i
    if end is RUNTIME_SIZE and isinstance(ctx.out_shape[0], SymSize):
        end = None
    require(all(isinstance(b, (int, float)) for b in (start, step)) and (end is None or isinstance(end, (int, float))),
            "its start, end or step is computed at run time (only constant bounds become an index expression)")
    dtype = ctx.out_dtype
    integral = not dtype.startswith(("float", "bfloat"))
    # ATen computes an integer result in int64 from the bounds truncated (and sizes an int64 one from those too),
    # a float one in double
    truncated = (int(start), int(end if end is not None else 0), int(step))
    require(step != 0 and (not integral or truncated[2] != 0), "a step of zero")
    if end is not None:
        if dtype == "int64":
            length = max(0, -((truncated[0] - truncated[1]) // truncated[2]))
        else:
            length = max(0, math.ceil((end - start) / step))
        require(ctx.out_shape == (length,),
                f"ATen's rule gives {length} elements, TorchScript saw {list(ctx.out_shape)}")
    math_dtype = K.INT if integral else "float64"
    first, step = (truncated[0], truncated[2]) if integral else (start, step)

    def fn(index):
        value = K.op("add", K.const(first, math_dtype),
                     K.op("mul", K.const(step, math_dtype), K.cast(index[0], math_dtype)))
        return K.cast(value, compute_dtype(dtype))

    return make_box(ctx.out_shape, dtype, fn, [])
