"""Lowerings of what in-place writes become once functional (`copy`, `fill.Tensor`: transpiler/functionalize.py)
and of a number made into a 0-d tensor (`torch.tensor(count)`), as Swin's attention mask is built."""
from __future__ import annotations

from . import kernel_ir as K
from .lowering import LowerContext, TensorBox, compute_dtype, is_box, lowering, make_box, require, value_at


@lowering("aten::copy")
def copy(ctx: LowerContext, x: TensorBox, src, non_blocking: bool = False) -> TensorBox:
    """x's shape and dtype, src's values (broadcast)."""
    shape, dtype = ctx.out_shape, compute_dtype(ctx.out_dtype)
    require(tuple(shape) == tuple(x.shape), "copy into another shape")
    return make_box(shape, ctx.out_dtype, lambda index: value_at(src, index, shape, dtype), [src])


@lowering("aten::fill.Tensor")
def fill_tensor(ctx: LowerContext, x: TensorBox, value: TensorBox) -> TensorBox:
    require(value.shape == (), "fill with a tensor of more than one element")
    dtype = compute_dtype(ctx.out_dtype)
    return make_box(ctx.out_shape, ctx.out_dtype, lambda index: K.cast(value([]), dtype), [value])


@lowering("aten::tensor.int", "aten::tensor.float", "aten::tensor.bool")
def tensor_of_number(ctx: LowerContext, number, *args) -> TensorBox:
    dtype = compute_dtype(ctx.out_dtype)
    if is_box(number):  # a runtime number, carried as a 0-d tensor
        return make_box((), ctx.out_dtype, lambda index: K.cast(number([]), dtype), [number])
    return make_box((), ctx.out_dtype, lambda index: K.const(number, dtype), [])
