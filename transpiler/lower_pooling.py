"""Lowerings of pooling. A small window (up to UNROLL_WINDOW positions) becomes one load per position, combined
pointwise: on a GPU each is a coalesced load across neighbouring outputs. A larger one becomes a reduction over window
loop variables, whose tile loads stride across the input's rows: fine on the CPU, slow on a GPU (resnet18's fp16 stem
pool as a reduction took 441 us against ATen's ~15 us on an H100), so there max/avg pooling with a large window stays
on ATen."""
from __future__ import annotations

import itertools
import math

import torch

from . import kernel_ir as K
from .lowering import lowering, make_box, require

UNROLL_WINDOW = 32
LARGE_WINDOW_ON_CUDA = ("a window of more than 32 positions: as a reduction its loads stride across rows, and ATen's "
                        "kernel is faster on CUDA")


@lowering("aten::adaptive_avg_pool2d", "aten::adaptive_avg_pool1d")
def adaptive_avg_pool(ctx, x, output_size):
    spatial = len(output_size)
    sizes = x.shape[-spatial:]
    require(all(n % o == 0 for n, o in zip(sizes, output_size)), "adaptive pooling with uneven windows")
    windows = [n // o for n, o in zip(sizes, output_size)]
    count = math.prod(windows)
    dtype = ctx.out_dtype
    acc = "float32" if dtype != "float64" else dtype
    box = make_box(ctx.out_shape, dtype, None, [x])
    lead = len(x.shape) - spatial

    if count <= UNROLL_WINDOW:
        def fn(index):
            taps = [K.cast(x(list(index[:lead]) + [o * w + r for o, w, r in zip(index[lead:], windows, offsets)]), acc)
                    for offsets in itertools.product(*(range(w) for w in windows))]
            return K.op("truediv", _tree("add", taps), K.const(count, acc))
    else:  # a whole plane (global pooling) is a contiguous row per output: a reduction coalesces
        rvars = ctx.rvars(windows)

        def fn(index):
            window = [o * w + r for o, w, r in zip(index[lead:], windows, rvars)]
            total = K.reduce("sum", K.cast(x(list(index[:lead]) + window), acc), rvars, acc, tag=box.id)
            return K.op("truediv", total, K.const(count, acc))

    box.fn = fn
    return box


@lowering("aten::max_pool2d")
def max_pool2d(ctx, x, kernel_size, stride=(), padding=(0, 0), dilation=(1, 1), ceil_mode=False):
    """Padding counts as -inf (lowest) and is never read: a window's loads are masked to the input. ceil_mode
    only adds output positions (TorchScript's output shape has them) whose windows hang past the input: masked too."""
    kernel, pad, dilation = _pair(kernel_size), _pair(padding), _pair(dilation)
    stride = _pair(stride) if stride else kernel
    box = make_box(ctx.out_shape, ctx.out_dtype, None, [x])

    def tap(index, offsets):
        value, inside = _tap(x, index, offsets, stride, dilation, pad)
        if inside is None:
            return value
        return K.op("where", inside, K.guarded(value, inside), _lowest(value.dtype))

    if math.prod(kernel) <= UNROLL_WINDOW:
        box.fn = lambda index: _tree("maximum", [tap(index, o) for o in itertools.product(*map(range, kernel))])
    else:
        require(ctx.device_type != "cuda", LARGE_WINDOW_ON_CUDA)
        rvars = ctx.rvars(kernel)

        def fn(index):
            value = tap(index, rvars)
            return K.reduce("max", value, rvars, value.dtype, tag=box.id)

        box.fn = fn
    return box


@lowering("aten::avg_pool2d")
def avg_pool2d(ctx, x, kernel_size, stride=(), padding=(0, 0), ceil_mode=False, count_include_pad=True,
               divisor_override=None):
    """Padding reads as zero. The divisor is the window's size (count_include_pad: without ceil_mode every window
    lies inside the padded input), the number of its positions inside the input (not count_include_pad), or the
    override."""
    kernel, pad = _pair(kernel_size), _pair(padding)
    stride = _pair(stride) if stride else kernel
    require(not ceil_mode, "average pooling with ceil_mode")
    require(math.prod(kernel) <= UNROLL_WINDOW or ctx.device_type != "cuda", LARGE_WINDOW_ON_CUDA)
    box = make_box(ctx.out_shape, ctx.out_dtype, None, [x])
    acc = "float64" if ctx.out_dtype == "float64" else "float32"
    zero = K.const(0, acc)
    unrolled = math.prod(kernel) <= UNROLL_WINDOW
    require(unrolled or count_include_pad or divisor_override or pad == [0, 0],
            "average pooling of a large padded window that excludes the padding from its divisor")
    rvars = None if unrolled else ctx.rvars(kernel)

    def fn(index):
        taps = [_tap(x, index, o, stride, (1, 1), pad)
                for o in (itertools.product(*map(range, kernel)) if unrolled else [rvars])]
        values = [K.cast(v, acc) if inside is None else K.op("where", inside, K.cast(K.guarded(v, inside), acc), zero)
                  for v, inside in taps]
        total = _tree("add", values) if unrolled else K.reduce("sum", values[0], rvars, acc, tag=box.id)
        if divisor_override:
            divisor = K.const(divisor_override, acc)
        elif count_include_pad or all(inside is None for _, inside in taps):
            divisor = K.const(math.prod(kernel), acc)
        else:
            divisor = _tree("add", [K.const(1, acc) if inside is None else K.cast(inside, acc) for _, inside in taps])
        return K.op("truediv", total, divisor)

    box.fn = fn
    return box


def _tap(x, index, offsets, stride, dilation, pad) -> tuple[K.KExpr, "K.KExpr | None"]:
    """The input at one window position (`offsets`: ints, or window loop variables) of the output at `index`, and
    the condition that the position lies inside the input (None when it always does)."""
    h, w = [o * s + r * d + (-p) for o, s, r, d, p in zip(index[-2:], stride, offsets, dilation, pad)]
    value = x(list(index[:-2]) + [h, w])
    inside = [c for c in (K.within(h, 0, x.shape[-2]), K.within(w, 0, x.shape[-1])) if c is not None]
    if not inside:
        return value, None
    return value, inside[0] if len(inside) == 1 else K.op("and", *inside)


def _tree(name: str, values: list[K.KExpr]) -> K.KExpr:
    """values combined pairwise by a binary op, as a balanced tree (a shorter dependency chain than a fold)."""
    while len(values) > 1:
        values = [K.op(name, *values[i:i + 2]) if i + 1 < len(values) else values[i] for i in range(0, len(values), 2)]
    return values[0]


def _pair(values) -> list[int]:
    """An int[2] argument as ATen reads it: one value stands for both dims."""
    values = [values] if isinstance(values, int) else list(values)
    return values * 2 if len(values) == 1 else values


def _lowest(dtype: str) -> K.KExpr:
    if dtype.startswith(("float", "bfloat")):
        return K.const(-math.inf, dtype)
    return K.const(torch.iinfo(getattr(torch, dtype)).min, dtype)
