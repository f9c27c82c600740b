"""Lowerings of view and layout ops: each is an index transform, so a view costs nothing inside a kernel.

A reshape of any box (even a permuted one) is exact: the new index is flattened row-major and unflattened in the
old shape with div/mod, which `kernel_ir` simplifies away where the dims line up.
"""
from __future__ import annotations

import math
from typing import Sequence

from . import kernel_ir as K
from .symbolic import SymSize
from .lowering import (RUNTIME_SIZE, LowerContext, TensorBox, broadcast_index, broadcast_shapes, is_box, lowering,
                       make_box, normalize_dim, require)


def view_of(ctx: LowerContext, x: TensorBox, shape: Sequence[int], index_map) -> TensorBox:
    """A box of `shape` whose element at `index` is x at `index_map(index)`."""
    return make_box(tuple(shape), x.dtype, lambda index: x(index_map(index)), [x])


def reshape_index(old_shape: Sequence[int], new_shape: Sequence[int]):
    def index_map(index):
        flat = K.const(0, K.INT)
        for i, n in zip(index, new_shape):
            flat = flat * n + i
        old = []
        for n in reversed(old_shape):
            old.append(flat % n)
            flat = flat // n
        return list(reversed(old))
    return index_map


@lowering("aten::view", "aten::reshape", "aten::flatten.using_ints", "aten::unflatten.int", "aten::view_as",
          "aten::reshape_as", "aten::squeeze", "aten::squeeze.dim", "aten::unsqueeze")
def reshape(ctx, x, *args):
    shape = ctx.out_shape
    require(x.numel == math.prod(shape), "reshape to another number of elements")
    return view_of(ctx, x, shape, reshape_index(x.shape, shape))


@lowering("aten::permute")
def permute(ctx, x, dims):
    rank = len(x.shape)
    dims = [normalize_dim(d, rank) for d in dims]
    inverse = [dims.index(d) for d in range(rank)]
    return view_of(ctx, x, [x.shape[d] for d in dims], lambda index: [index[inverse[d]] for d in range(rank)])


@lowering("aten::transpose.int")
def transpose(ctx, x, dim0, dim1):
    rank = len(x.shape)
    dims = list(range(rank))
    if rank:
        a, b = normalize_dim(dim0, rank), normalize_dim(dim1, rank)
        dims[a], dims[b] = dims[b], dims[a]
    return permute(ctx, x, dims)


@lowering("aten::t")
def t(ctx, x):
    return transpose(ctx, x, 0, 1) if len(x.shape) == 2 else permute(ctx, x, list(range(len(x.shape))))


@lowering("aten::numpy_T")
def numpy_t(ctx, x):
    return permute(ctx, x, list(reversed(range(len(x.shape)))))


@lowering("aten::expand", "aten::expand_as")
def expand(ctx, x, *args):
    shape = ctx.out_shape
    offset = len(shape) - len(x.shape)
    return view_of(ctx, x, shape, lambda index: [K.const(0, K.INT) if n == 1 else index[offset + d]
                                                 for d, n in enumerate(x.shape)])


def _dynamic_position(n: SymSize, index: int, what: str):
    """A position along a dynamic dim of size `n` as an index expression: `index`, or `n + index` when negative;
    refused unless it lies inside the dim at every size of its range."""
    smallest = K.bounds(K.size(n))[0]
    require(-smallest <= index < smallest, f"{what} {index} is outside the dim at some of its sizes")
    return index if index >= 0 else K.size(n + index)


@lowering("aten::slice.Tensor")
def slice_(ctx, x, dim=0, start=None, end=None, step=1):
    dim = normalize_dim(dim, len(x.shape))
    n = x.shape[dim]
    if isinstance(ctx.out_shape[dim], SymSize) and not is_box(start) and not is_box(step):
        # a length that follows a dynamic dim (x[:, :seq], or any slice of a dynamic dim) is shape inference's
        # (fitted): the end decides nothing else
        if isinstance(n, SymSize):  # (a start from the front is inside the dim whenever the slice is not empty)
            first = start or 0 if (start or 0) >= 0 else _dynamic_position(n, start, "slice start")
        else:  # a dynamic length out of a static dim must fit it at the range's largest size
            first = range(n)[slice(start, None, step)].start if n else 0
            longest = K.bounds(K.size(ctx.out_shape[dim]))[1]
            require(first + (longest - 1) * step < n, "a slice whose dynamic length can run past its dim")
        return view_of(ctx, x, ctx.out_shape, lambda index: [first + i * step if d == dim else i
                                                             for d, i in enumerate(index)])
    require(not any(is_box(v) for v in (start, end, step)) and end is not RUNTIME_SIZE,
            "slice bounds computed at run time")
    first = range(n)[slice(start, end, step)].start if n else 0

    def index_map(index):
        return [first + i * step if d == dim else i for d, i in enumerate(index)]

    return view_of(ctx, x, ctx.out_shape, index_map)


@lowering("aten::narrow")
def narrow(ctx, x, dim, start, length):
    return slice_(ctx, x, dim, start, start + length, 1)


@lowering("aten::select.int")
def select(ctx, x, dim, index_value):
    require(not is_box(index_value), "select index computed at run time")
    dim = normalize_dim(dim, len(x.shape))
    n = x.shape[dim]
    position = _dynamic_position(n, index_value, "select index") if isinstance(n, SymSize) else index_value % n
    return view_of(ctx, x, ctx.out_shape,
                   lambda index: list(index[:dim]) + [K.as_index(position)] + list(index[dim:]))


# --- scatters: a tensor with a view of it replaced (what an in-place write through a view becomes) -------------

@lowering("aten::select_scatter")
def select_scatter(ctx, x, src, dim, index_value):
    require(not is_box(index_value), "select index computed at run time")
    dim = normalize_dim(dim, len(x.shape))
    position = index_value % x.shape[dim]

    def fn(index):
        hit = K.op("eq", index[dim], K.const(position, K.INT))
        return K.op("where", hit, K.cast(src(list(index[:dim]) + list(index[dim + 1:])), x.dtype), x(index))

    return make_box(ctx.out_shape, x.dtype, fn, [x, src])


@lowering("aten::slice_scatter")
def slice_scatter(ctx, x, src, dim=0, start=None, end=None, step=1):
    require(not any(is_box(v) for v in (start, end, step)), "slice bounds computed at run time")
    require(step == 1, "a strided slice_scatter")
    dim = normalize_dim(dim, len(x.shape))
    first = range(x.shape[dim])[slice(start, end, step)].start if x.shape[dim] else 0
    stop = first + src.shape[dim]

    def fn(index):
        inside = list(index[:dim]) + [index[dim] + (-first)] + list(index[dim + 1:])
        hit = K.within(index[dim], first, stop)
        if hit is None:  # every index lies in the slice (the whole dim, or a reader's own slice of it)
            return K.cast(src(inside), x.dtype)
        return K.op("where", hit, K.cast(K.guarded(src(inside), hit), x.dtype), x(index))

    return make_box(ctx.out_shape, x.dtype, fn, [x, src])


@lowering("aten::movedim.int")
def movedim(ctx, x, source, destination):
    rank = len(x.shape)
    order = [d for d in range(rank) if d != normalize_dim(source, rank)]
    order.insert(normalize_dim(destination, rank), normalize_dim(source, rank))
    return permute(ctx, x, order)


# --- gathers: a load whose index is itself loaded --------------------------------------------------------------

@lowering("aten::embedding")
def embedding(ctx, weight, indices, padding_idx=-1, scale_grad=False, sparse=False):
    def fn(index):
        return weight([in_bounds(indices(index[:-1]), weight.shape[0]), index[-1]])

    return make_box(ctx.out_shape, weight.dtype, fn, [weight, indices])


@lowering("aten::index_select")
def index_select(ctx, x, dim, indices):
    dim = normalize_dim(dim, len(x.shape))

    def fn(index):
        position = in_bounds(indices([index[dim]]), x.shape[dim])
        return x(list(index[:dim]) + [position] + list(index[dim + 1:]))

    return make_box(ctx.out_shape, x.dtype, fn, [x, indices])


@lowering("aten::gather")
def gather(ctx, x, dim, indices, sparse_grad=False):
    dim = normalize_dim(dim, len(x.shape))

    def fn(index):
        position = in_bounds(indices(index), x.shape[dim])
        return x(list(index[:dim]) + [position] + list(index[dim + 1:]))

    return make_box(ctx.out_shape, x.dtype, fn, [x, indices])


@lowering("aten::index.Tensor")
def index_tensor(ctx, x, indices):
    """x[i, :, j] with integer index tensors (None: a whole dim), as ATen's advanced indexing: the index tensors
    broadcast together, and their dims take the place of the indexed dims when those are adjacent, else come first.
    A negative index counts from the end. (A boolean mask's result has a size its values decide: ATen keeps it.)"""
    tensors = {d: t for d, t in enumerate(indices) if t is not None}
    require(len(indices) <= len(x.shape) and tensors and
            all(is_box(t) and t.dtype in ("int64", "int32") for t in tensors.values()),
            "an index that is not an integer tensor")
    dims = sorted(tensors)
    batch = broadcast_shapes(*(t.shape for t in tensors.values()))
    rest = [d for d in range(len(x.shape)) if d not in tensors]
    before = [d for d in rest if d < dims[0]] if dims == list(range(dims[0], dims[-1] + 1)) else []
    after = [d for d in rest if d not in before]

    def fn(index):
        full = [None] * len(x.shape)
        for d, i in zip(before + after, index[:len(before)] + index[len(before) + len(batch):]):
            full[d] = i
        at = index[len(before):len(before) + len(batch)]
        for d, t in tensors.items():
            position = K.cast(t(broadcast_index(t, at, batch)), K.INT)
            wrapped = K.op("where", K.op("lt", position, K.const(0, K.INT)), position + K.size(x.shape[d]), position)
            full[d] = in_bounds(wrapped, x.shape[d])
        return x(full)

    shape = tuple(x.shape[d] for d in before) + tuple(batch) + tuple(x.shape[d] for d in after)
    return make_box(shape, x.dtype, fn, [x, *tensors.values()])


def in_bounds(position: K.KExpr, size) -> K.KExpr:
    """A loaded index clamped into [0, size) (an int, or a SymSize: a dynamic dim or a count read from data): a bad
    index must never read outside the tensor."""
    position = K.cast(position, K.INT)
    return K.op("minimum", K.op("maximum", position, K.const(0, K.INT)), K.size(size) + (-1))
