"""Lowerings of activations that read a second tensor besides their input: PReLU's learnt slopes (one per channel,
or one for all) and GLU's gate (the input's second half along a dim)."""
from __future__ import annotations

from . import kernel_ir as K
from .lowering import LowerContext, TensorBox, compute_dtype, lowering, make_box, normalize_dim, require


@lowering("aten::prelu")
def prelu(ctx: LowerContext, x: TensorBox, weight: TensorBox) -> TensorBox:
    slopes = weight.numel
    require(slopes == 1 or (len(x.shape) >= 2 and slopes == x.shape[1] and len(weight.shape) == 1),
            "slopes neither one nor one per channel")
    dtype = compute_dtype(ctx.out_dtype)

    def fn(index):
        v = K.cast(x(index), dtype)
        at = [K.const(0, K.INT)] * len(weight.shape) if slopes == 1 else [index[1]]
        slope = K.cast(weight(at), dtype)
        return K.op("where", K.op("gt", v, K.const(0, dtype)), v, K.op("mul", v, slope))

    return make_box(ctx.out_shape, ctx.out_dtype, fn, [x, weight])


@lowering("aten::glu")
def glu(ctx: LowerContext, x: TensorBox, dim: int = -1) -> TensorBox:
    dim = normalize_dim(dim, len(x.shape))
    half = x.shape[dim] // 2
    require(isinstance(x.shape[dim], int) and x.shape[dim] % 2 == 0, "an odd or dynamic dim halved")
    dtype = compute_dtype(ctx.out_dtype)

    def fn(index):
        gate = [i + half if d == dim else i for d, i in enumerate(index)]
        return K.op("mul", K.cast(x(index), dtype), K.op("sigmoid", K.cast(x(gate), dtype)))

    return make_box(ctx.out_shape, ctx.out_dtype, fn, [x])
