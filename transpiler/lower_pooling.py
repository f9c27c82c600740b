"""Lowerings of pooling: windows of a fixed size become reductions over window loop variables."""
from __future__ import annotations

import math

import torch

from . import kernel_ir as K
from .lowering import lowering, make_box, require


@lowering("aten::adaptive_avg_pool2d", "aten::adaptive_avg_pool1d")
def adaptive_avg_pool(ctx, x, output_size):
    spatial = len(output_size)
    sizes = x.shape[-spatial:]
    require(all(n % o == 0 for n, o in zip(sizes, output_size)), "adaptive pooling with uneven windows")
    windows = [n // o for n, o in zip(sizes, output_size)]
    rvars = ctx.rvars(windows)
    count = 1
    for w in windows:
        count *= w
    dtype = ctx.out_dtype
    box = make_box(ctx.out_shape, dtype, None, [x])
    lead = len(x.shape) - spatial

    def fn(index):
        window = [o * w + r for o, w, r in zip(index[lead:], windows, rvars)]
        total = K.reduce("sum", K.cast(x(list(index[:lead]) + window), "float32" if dtype != "float64" else dtype),
                         rvars, "float32" if dtype != "float64" else dtype, tag=box.id)
        return K.op("truediv", total, K.const(count, total.dtype))

    box.fn = fn
    return box


@lowering("aten::max_pool2d")
def max_pool2d(ctx, x, kernel_size, stride=(), padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    """Padding counts as -inf (lowest) and is never read: a window's loads are masked to the input. ceil_mode
    only adds output positions (TorchScript's output shape has them) whose windows hang past the input: masked too."""
    kernel, pad, dilation = _pair(kernel_size), _pair(padding), _pair(dilation)
    stride = _pair(stride) if stride else kernel
    rvars = ctx.rvars(kernel)
    box = make_box(ctx.out_shape, ctx.out_dtype, None, [x])

    def fn(index):
        h, w = [o * s + r * d + (-p) for o, s, r, d, p in zip(index[-2:], stride, rvars, dilation, pad)]
        value = x(list(index[:-2]) + [h, w])
        inside = [c for c in (K.within(h, 0, x.shape[-2]), K.within(w, 0, x.shape[-1])) if c is not None]
        if inside:
            condition = inside[0] if len(inside) == 1 else K.op("and", *inside)
            value = K.op("where", condition, K.guarded(value, condition), _lowest(value.dtype))
        return K.reduce("max", value, rvars, value.dtype, tag=box.id)

    box.fn = fn
    return box


def _pair(values) -> list[int]:
    """An int[2] argument as ATen reads it: one value stands for both dims."""
    values = [values] if isinstance(values, int) else list(values)
    return values * 2 if len(values) == 1 else values


def _lowest(dtype: str) -> K.KExpr:
    if dtype.startswith(("float", "bfloat")):
        return K.const(-math.inf, dtype)
    return K.const(torch.iinfo(getattr(torch, dtype)).min, dtype)


@lowering("aten::avg_pool2d")
def avg_pool2d(ctx, x, kernel_size, stride=(), padding=(0, 0), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    stride = list(stride) or list(kernel_size)
    require(list(padding) == [0, 0] and not ceil_mode and divisor_override is None, "padded average pooling")
    rvars = ctx.rvars(kernel_size)
    box = make_box(ctx.out_shape, ctx.out_dtype, None, [x])
    count = kernel_size[0] * kernel_size[1]

    def fn(index):
        h, w = index[-2] * stride[0] + rvars[0], index[-1] * stride[1] + rvars[1]
        value = K.cast(x(list(index[:-2]) + [h, w]), "float32")
        return K.op("truediv", K.reduce("sum", value, rvars, "float32", tag=box.id), K.const(count, "float32"))

    box.fn = fn
    return box
