"""Lowerings of reductions and of the composites built on them (softmax, layer_norm, var, ...).

A reduction is a `reduce` node inside a virtual box; its consumers stay virtual, so a normalisation (reduce, then
broadcast back over the row) renders as one kernel per row: the row's reductions first, then its elements.
"""
from __future__ import annotations

from typing import Optional, Sequence

from . import kernel_ir as K
from .symbolic import SymSize
from .lowering import (LowerContext, TensorBox, broadcast_index, compute_dtype, is_box, lowering, make_box,
                       normalize_dim, require)


def reduce_box(ctx: LowerContext, x: TensorBox, dims: Optional[Sequence[int]], keepdim: bool, reduction: str,
               dtype: str, body=None) -> TensorBox:
    """x reduced over `dims` (all if None) with `reduction`; `body(value, full_index)` transforms each element."""
    rank = len(x.shape)
    dims = sorted({normalize_dim(d, rank) for d in dims}) if dims else list(range(rank))
    rvars = ctx.rvars([x.shape[d] for d in dims])
    out_shape = tuple(1 if d in dims else n for d, n in enumerate(x.shape) if keepdim or d not in dims)
    value_dtype = "int64" if reduction in ("argmax", "argmin") else compute_dtype(dtype)
    box = make_box(out_shape, dtype, None, [x])
    ctx.reductions[box.id] = box

    def fn(index):
        kept = iter(index)
        full = []
        for d in range(rank):
            if d in dims:
                full.append(rvars[dims.index(d)])
                if keepdim:
                    next(kept)
            else:
                full.append(next(kept))
        value = x(full)
        if body is not None:
            value = body(value, full)
        if reduction in ("sum", "prod"):
            value = K.cast(value, value_dtype)
        return K.reduce(reduction, value, rvars, value_dtype if reduction not in ("argmax", "argmin") else
                        value.dtype, tag=box.id)

    box.fn = lambda index: K.cast(fn(index), value_dtype)
    return box


def elementwise(shape, dtype: str, fn, *inputs) -> TensorBox:
    """A box over `shape` computing fn(index, *values of inputs broadcast at index) in compute dtype."""
    def inner(index):
        values = [K.cast(x(broadcast_index(x, index, shape)), compute_dtype(dtype)) for x in inputs]
        return K.cast(fn(*values), compute_dtype(dtype))
    return make_box(tuple(shape), dtype, inner, inputs)


def _c(value, like):
    """A constant in `like`'s dtype; a count over dynamic dims (a SymSize) is computed from the call's dims."""
    if isinstance(value, SymSize):
        return K.cast(K.size(value), like.dtype)
    return K.const(value, like.dtype)


def _count(x: TensorBox, dims) -> int:
    rank = len(x.shape)
    dims = {normalize_dim(d, rank) for d in dims} if dims else set(range(rank))
    n = 1
    for d in dims:
        n *= x.shape[d]
    return n


@lowering("aten::sum", "aten::sum.dim_IntList")
def sum_(ctx, x, dims=None, keepdim=False, dtype=None):
    if ctx.op == "aten::sum":  # sum(self, *, dtype): the second argument is the dtype, not dims
        dims, keepdim = None, False
    return reduce_box(ctx, x, dims, keepdim, "sum", ctx.out_dtype)


@lowering("aten::mean", "aten::mean.dim")
def mean(ctx, x, dims=None, keepdim=False, dtype=None):
    if ctx.op == "aten::mean":  # mean(self, *, dtype)
        dims, keepdim = None, False
    total = reduce_box(ctx, x, dims, keepdim, "sum", ctx.out_dtype)
    n = _count(x, dims)
    return elementwise(total.shape, ctx.out_dtype, lambda s: K.op("truediv", s, _c(n, s)), total)


@lowering("aten::amax")
def amax(ctx, x, dims=(), keepdim=False):
    return reduce_box(ctx, x, dims or None, keepdim, "max", ctx.out_dtype)


@lowering("aten::amin")
def amin(ctx, x, dims=(), keepdim=False):
    return reduce_box(ctx, x, dims or None, keepdim, "min", ctx.out_dtype)


@lowering("aten::max.dim")
def max_dim(ctx, x, dim, keepdim=False):
    return (reduce_box(ctx, x, [dim], keepdim, "max", ctx.out_dtypes[0]),
            reduce_box(ctx, x, [dim], keepdim, "argmax", "int64"))


@lowering("aten::min.dim")
def min_dim(ctx, x, dim, keepdim=False):
    return (reduce_box(ctx, x, [dim], keepdim, "min", ctx.out_dtypes[0]),
            reduce_box(ctx, x, [dim], keepdim, "argmin", "int64"))


@lowering("aten::max", "aten::min")
def max_all(ctx, x):
    return reduce_box(ctx, x, None, False, "max" if ctx.op == "aten::max" else "min", ctx.out_dtype)


@lowering("aten::argmax", "aten::argmin")
def argmax(ctx, x, dim=None, keepdim=False):
    require(dim is not None or len(x.shape) <= 1, "argmax over a flattened tensor")
    return reduce_box(ctx, x, None if dim is None else [dim], keepdim, ctx.op[6:], "int64")


# A cumulative sum is a masked sum per element (n * n work where a scan does n): a kernel only over short dims
CUMSUM_LIMIT = 256


@lowering("aten::cumsum")
def cumsum(ctx, x, dim, dtype=None):
    """Each element the sum of its dim's elements up to it: per output element, a sum over the dim masked to the
    prefix, so it fuses as any reduction does (its producers inline, its consumers read it in the same kernel)."""
    rank = len(x.shape)
    dim = normalize_dim(dim, rank)
    n = x.shape[dim] if rank else 1
    require(isinstance(n, int) and n <= CUMSUM_LIMIT, f"a cumulative sum over more than {CUMSUM_LIMIT} elements")
    if rank == 0:
        return elementwise((), ctx.out_dtype, lambda v: v, x)
    acc = compute_dtype(ctx.out_dtype)
    (r,) = ctx.rvars([n])
    box = make_box(x.shape, ctx.out_dtype, None, [x])

    def fn(index):
        full = list(index[:dim]) + [r] + list(index[dim + 1:])
        prefix = K.op("le", r, index[dim])
        value = K.op("where", prefix, K.cast(x(full), acc), K.const(0, acc))
        return K.reduce("sum", value, (r,), acc, tag=box.id)

    box.fn = fn
    return box


@lowering("aten::prod", "aten::prod.dim_int")
def prod(ctx, x, dim=None, keepdim=False, dtype=None):
    if ctx.op == "aten::prod":  # prod(self, *, dtype)
        dim, keepdim = None, False
    return reduce_box(ctx, x, None if dim is None else [dim], keepdim, "prod", ctx.out_dtype)


@lowering("aten::any", "aten::any.dim", "aten::all", "aten::all.dim")
def any_all(ctx, x, dim=None, keepdim=False):
    reduction = "any" if ctx.op.startswith("aten::any") else "all"
    truthy = lambda v, index: K.op("ne", v, K.const(0, v.dtype)) if v.dtype != "bool" else v  # noqa: E731
    return reduce_box(ctx, x, None if dim is None else [dim], keepdim, reduction, "bool", body=truthy)


def moments(ctx, x, dims, correction, keepdim, dtype) -> tuple[TensorBox, TensorBox]:
    """The mean (dims kept) and the variance, in two passes in the compute dtype: the mean, then the mean square
    deviation from it (no cancellation). One mean serves both, so a normalization reduces its rows twice, not
    three times."""
    n = _count(x, dims)
    total = reduce_box(ctx, x, dims, True, "sum", dtype)
    mu = elementwise(total.shape, dtype, lambda s: K.op("truediv", s, _c(n, s)), total)

    def deviation(v, full):
        d = K.op("sub", v, K.cast(mu(broadcast_index(mu, full, x.shape)), v.dtype))
        return K.op("mul", d, d)

    squares = reduce_box(ctx, x, dims, keepdim, "sum", dtype, body=deviation)
    def degrees_of_freedom(like):  # max(n - correction, 0), as ATen divides (over a dynamic count: at run time)
        if isinstance(n, SymSize):
            return K.op("maximum", _c(n - correction, like), K.const(0, like.dtype))
        return _c(max(n - correction, 0), like)

    var = elementwise(squares.shape, dtype, lambda s: K.op("truediv", s, degrees_of_freedom(s)), squares)
    return mu, var


def variance(ctx, x, dims, correction, keepdim, dtype) -> TensorBox:
    return moments(ctx, x, dims, correction, keepdim, dtype)[1]


@lowering("aten::var", "aten::var.dim", "aten::var.correction", "aten::std", "aten::std.dim", "aten::std.correction")
def var_std(ctx, x, *args, **kwargs):
    dims, correction, keepdim = _variance_args(ctx.op, args)
    result = variance(ctx, x, dims, correction, keepdim, ctx.out_dtype)
    if ctx.op.startswith("aten::std"):
        return elementwise(result.shape, ctx.out_dtype, lambda v: K.op("sqrt", v), result)
    return result


def _variance_args(op: str, args):
    overload = op.partition(".")[2]
    if overload == "":  # var(self, bool unbiased)
        return None, int(args[0]) if args else 1, False
    if overload == "dim":  # var.dim(self, int[1]? dim, bool unbiased, bool keepdim)
        return args[0], int(args[1]), args[2]
    dims, correction, keepdim = args[0], args[1], args[2]  # var.correction(self, dim, *, correction, keepdim)
    return dims, 1 if correction is None else correction, keepdim


@lowering("aten::softmax.int", "aten::log_softmax.int")
def softmax(ctx, x, dim, dtype=None):
    out_dtype = ctx.out_dtype
    biggest = reduce_box(ctx, x, [dim], True, "max", out_dtype)
    shifted = elementwise(x.shape, out_dtype, lambda v, m: K.op("sub", v, m), x, biggest)
    total = reduce_box(ctx, shifted, [dim], True, "sum", out_dtype, body=lambda v, index: K.op("exp", v))
    if ctx.op == "aten::log_softmax.int":
        return elementwise(x.shape, out_dtype, lambda s, t: K.op("sub", s, K.op("log", t)), shifted, total)
    if ctx.device_type == "cuda":  # (as ATen rounds it: its CUDA kernel divides by the sum, its CPU kernel multiplies
        return elementwise(x.shape, out_dtype, lambda s, t: K.op("truediv", K.op("exp", s), t), shifted, total)
    return elementwise(x.shape, out_dtype,  # by the sum's reciprocal, one division a row where a division an element
                       lambda s, t: K.op("mul", K.op("exp", s), K.op("truediv", _c(1, t), t)), shifted, total)


@lowering("aten::logsumexp")
def logsumexp(ctx, x, dims, keepdim=False):
    out_dtype = ctx.out_dtype
    biggest = reduce_box(ctx, x, dims, True, "max", out_dtype)
    safe = elementwise(biggest.shape, out_dtype,
                       lambda m: K.op("where", K.op("isinf", m), _c(0, m), m), biggest)
    total = reduce_box(ctx, elementwise(x.shape, out_dtype, lambda v, m: K.op("exp", K.op("sub", v, m)), x, safe),
                       dims, True, "sum", out_dtype)
    result = elementwise(total.shape, out_dtype, lambda s, m: K.op("add", K.op("log", s), m), total, safe)
    if keepdim:
        return result
    rank = len(x.shape)
    reduced = {normalize_dim(d, rank) for d in dims}
    shape = tuple(n for d, n in enumerate(x.shape) if d not in reduced)
    return make_box(shape, out_dtype, lambda index: result(_unsqueeze_index(index, reduced, rank)), [result])


def _unsqueeze_index(index, reduced, rank):
    it = iter(index)
    return [K.const(0, K.INT) if d in reduced else next(it) for d in range(rank)]


@lowering("aten::layer_norm")
def layer_norm(ctx, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    dims = list(range(len(x.shape) - len(normalized_shape), len(x.shape)))
    return _normalize(ctx, x, dims, weight, bias, eps, ctx.out_dtype)


def _normalize(ctx, x, dims, weight, bias, eps, dtype):
    mu, var = moments(ctx, x, dims, 0, True, dtype)
    params = [p for p in (weight, bias) if is_box(p)]

    def fn(v, m, s, *wb):
        y = K.op("mul", K.op("sub", v, m), K.op("rsqrt", K.op("add", s, _c(eps, s))))
        if is_box(weight):
            y = K.op("mul", y, wb[0])
        if is_box(bias):
            y = K.op("add", y, wb[-1])
        return y

    return elementwise(x.shape, dtype, fn, x, mu, var, *params)


@lowering("aten::group_norm")
def group_norm(ctx, x, groups, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    batch, channels = x.shape[0], x.shape[1]
    rest = x.shape[2:]
    inner = channels // groups
    spatial = 1
    for n in rest:
        spatial *= n
    grouped_shape = (batch, groups, inner * spatial)
    grouped = make_box(grouped_shape, x.dtype, lambda i: x(_ungroup(i, inner, spatial, rest)), [x])
    normed = _normalize(ctx, grouped, [2], None, None, eps, ctx.out_dtype)

    def fn(index):
        b, ch = index[0], index[1]
        flat = K.const(0, K.INT)
        for i, n in zip(index[2:], rest):
            flat = flat * n + i
        value = normed([b, ch // inner, (ch % inner) * spatial + flat])
        if is_box(weight):
            value = K.op("mul", value, K.cast(weight([ch]), value.dtype))
        if is_box(bias):
            value = K.op("add", value, K.cast(bias([ch]), value.dtype))
        return value

    return make_box(x.shape, ctx.out_dtype, fn, [normed] + [p for p in (weight, bias) if is_box(p)])


def _ungroup(index, inner, spatial, rest):
    b, g, j = index
    channel = g * inner + j // spatial
    position = j % spatial
    tail = []
    for n in reversed(rest):
        tail.append(position % n)
        position = position // n
    return [b, channel] + list(reversed(tail))


@lowering("aten::batch_norm")
def batch_norm(ctx, x, weight, bias, running_mean, running_var, training, momentum, eps, cudnn_enabled):
    require(not training and is_box(running_mean) and is_box(running_var), "batch_norm in training mode")
    dtype = ctx.out_dtype

    if ctx.device_type == "cuda":
        return make_box(x.shape, dtype, _batch_norm_cuda(x, weight, bias, running_mean, running_var, eps), [x])

    def fn(index):  # ATen's CPU formula, rounded as it rounds (a score at a threshold decides as the model does)
        ch = [index[1]]
        v = K.cast(x(index), compute_dtype(dtype))
        alpha = K.op("rsqrt", K.op("add", K.cast(running_var(ch), v.dtype), _c(eps, v)))
        if is_box(weight):
            alpha = K.op("mul", alpha, K.cast(weight(ch), v.dtype))
        shift = K.cast(bias(ch), v.dtype) if is_box(bias) else _c(0.0, v)
        beta = K.op("fma", K.op("neg", K.cast(running_mean(ch), v.dtype)), alpha, shift)
        return K.op("fma", v, alpha, beta)

    return make_box(x.shape, dtype, fn, [x])


def _batch_norm_cuda(x, weight, bias, running_mean, running_var, eps):
    """ATen's CUDA formula in eval over a contiguous input (batch_norm_transform_input_kernel), rounded as it
    rounds: invstd = rsqrt(var + eps) in the accumulate type (CUDA's rsqrtf: libdevice's, emitters/triton_math.py),
    then gamma * (x - mean) * invstd + beta, the last multiply and add contracted into an fma as nvcc compiles it."""
    def fn(index):
        ch = [index[1]]
        v = K.cast(x(index), compute_dtype(x.dtype))  # (float32 for float16 and bfloat16: ATen's accumulate type)
        invstd = K.op("rsqrt", K.op("add", K.cast(running_var(ch), v.dtype), _c(eps, v)))
        centred = K.op("sub", v, K.cast(running_mean(ch), v.dtype))
        if is_box(weight):
            centred = K.op("mul", K.cast(weight(ch), v.dtype), centred)
        shift = K.cast(bias(ch), v.dtype) if is_box(bias) else _c(0.0, v)
        return K.op("fma", centred, invstd, shift)
    return fn


# --- vector norms (F.normalize: norm, then clamp_min, expand_as and div) ------------------------------------------

@lowering("aten::linalg_vector_norm", "aten::norm.ScalarOpt_dim")
def vector_norm(ctx, x, order=2, dims=None, keepdim=False, dtype=None):
    order = 2 if order is None else order
    require(dtype is None and isinstance(order, (int, float)) and order != 0, "a norm of this order or dtype")
    out_dtype = ctx.out_dtype
    if order in (float("inf"), float("-inf")):
        return reduce_box(ctx, x, dims, keepdim, "max" if order > 0 else "min", out_dtype,
                          body=lambda v, index: K.op("abs", v))
    if order == 2:
        total = reduce_box(ctx, x, dims, keepdim, "sum", out_dtype, body=lambda v, index: K.op("mul", v, v))
        return elementwise(total.shape, out_dtype, lambda s: K.op("sqrt", s), total)
    if order == 1:
        return reduce_box(ctx, x, dims, keepdim, "sum", out_dtype, body=lambda v, index: K.op("abs", v))
    # |v| ** p as exp(p * log|v|): |v| is never negative, so pow's sign and integer-exponent cases have no work
    total = reduce_box(ctx, x, dims, keepdim, "sum", out_dtype,
                       body=lambda v, index: K.op("exp", K.op("mul", K.op("log", K.op("abs", v)), _c(order, v))))
    return elementwise(total.shape, out_dtype, lambda s: K.op("exp", K.op("mul", K.op("log", s), _c(1 / order, s))),
                       total)
