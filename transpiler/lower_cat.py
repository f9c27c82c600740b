"""Lowerings of cat and stack: a piecewise load, so joining tensors fuses with whatever reads the result.

The output's index along the joined dim says which input an element comes from: a `where` chain over the
inputs' offsets picks it. Every input's expression is guarded by its own range (`kernel_ir.guarded`): its loads
are masked, so no input is ever read at an index outside it, on either backend, though the chain computes every
input's expression at every index. stack is cat of the inputs, each unsqueezed at the new dim.

A join of more than MAX_FUSED_INPUTS tensors runs as ATen's cat instead (as Inductor's max_pointwise_cat_inputs):
the chain's code and its work per element grow with the number of inputs, so DenseNet's dense blocks (a cat of
every earlier feature map, 2 to 49 inputs) made kernels whose C++ grew with the square of the depth (755 KB and
12 s of compiling for one 48-layer block) and that loaded every input at every element. ATen's cat copies each
input once, at memory speed, and what reads the result fuses over one buffer, the same kernel at every depth.
"""
from __future__ import annotations

from typing import Callable, Sequence

from . import kernel_ir as K
from .lowering import (LowerContext, RunsAsExtern, TensorBox, compute_dtype, is_box, lowering, make_box,
                       normalize_dim, require)

MAX_FUSED_INPUTS = 8

# (box, offset along the joined dim, extent along it); take(index, local position) -> the box's own index
Piece = tuple[TensorBox, int, int]
Take = Callable[[list, K.KExpr], list]


@lowering("aten::cat")
def cat(ctx: LowerContext, tensors, dim: int = 0) -> TensorBox:
    require(isinstance(tensors, list) and all(is_box(t) for t in tensors), "its inputs are not a list of tensors")
    rank = len(ctx.out_shape)
    require(rank > 0, "a 0-d result")
    kept = [t for t in tensors if not _legacy_empty(t, rank)]  # ATen skips 1-D empty tensors of shape [0]
    dim = normalize_dim(dim, rank)
    for t in kept:
        require(len(t.shape) == rank and _without(t.shape, dim) == _without(ctx.out_shape, dim),
                f"input shape {list(t.shape)} does not fit the result {list(ctx.out_shape)}")
    pieces, offset = [], 0
    for t in kept:
        pieces.append((t, offset, t.shape[dim]))
        offset += t.shape[dim]
    require(offset == ctx.out_shape[dim], "the inputs do not add up to the result")
    return _joined(ctx, pieces, dim, lambda index, local: index[:dim] + [local] + index[dim + 1:], kept)


@lowering("aten::stack")
def stack(ctx: LowerContext, tensors, dim: int = 0) -> TensorBox:
    require(isinstance(tensors, list) and all(is_box(t) for t in tensors), "its inputs are not a list of tensors")
    rank = len(ctx.out_shape)
    dim = normalize_dim(dim, rank)
    for t in tensors:
        require(tuple(t.shape) == _without(ctx.out_shape, dim),
                f"input shape {list(t.shape)} does not fit the result {list(ctx.out_shape)}")
    pieces = [(t, k, 1) for k, t in enumerate(tensors)]
    return _joined(ctx, pieces, dim, lambda index, local: index[:dim] + index[dim + 1:], tensors)


def _joined(ctx: LowerContext, pieces: Sequence[Piece], dim: int, take: Take, sources) -> TensorBox:
    if len(pieces) > MAX_FUSED_INPUTS:
        raise RunsAsExtern(f"a join of {len(pieces)} tensors (more than {MAX_FUSED_INPUTS}) is a copy ATen's cat "
                           "makes at memory speed; fused, every element would load every input")
    dtype = compute_dtype(ctx.out_dtype)  # the promoted dtype TorchScript typed the result with

    def fn(index):
        position = index[dim]
        low, high = K.bounds(position)
        value = None
        for box, start, size in reversed(pieces):  # the last piece is the chain's innermost default
            if size == 0 or high < start or low >= start + size:
                continue  # this index never falls in the piece (an empty input, or a slice of the result)
            piece = K.cast(box(take(list(index), position + (-start))), dtype)
            inside = K.within(position, start, start + size)
            if inside is None:
                return piece  # every index falls in this piece
            piece = K.guarded(piece, inside)
            value = piece if value is None else K.op("where", inside, piece, value)
        return K.const(0, dtype) if value is None else value  # None: the result is empty, nothing reads it

    return make_box(ctx.out_shape, ctx.out_dtype, fn, sources)


def _legacy_empty(t: TensorBox, rank: int) -> bool:
    return tuple(t.shape) == (0,) and rank != 1


def _without(shape: Sequence[int], dim: int) -> tuple[int, ...]:
    return tuple(shape[:dim]) + tuple(shape[dim + 1:])
