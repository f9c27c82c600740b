"""Lowerings of scatters: scatter_add, index_add and scatter_reduce (sum, mean, amax, amin; with or without the
destination's own values), what graph networks aggregate their messages with.

A scatter is no index function of its inputs (an output element is the reduction of however many updates its index
sends there), so its box is a `ScatterBox`: the output's first values, and per point of the scattered space the
update and the position it goes to along `dim`. fuse.py stores it at once as one `K.ScatterKernel`; the update is a
virtual expression, so the message computed for each edge (a gather by the edge list, scaled) runs inside the
scatter's kernel and is never stored. The target is clamped into the dim, so a kernel never writes outside its
output; check_indices.py asserts before the scatter that every index is in [0, size), so a bad one raises as ATen's
does (a negative one too: ATen's scatters do not count from the end).

A sum (scatter_add, index_add, scatter_reduce "sum" with the destination's values) has two forms. On the CPU
(emitters/cpp_scatter.py) each thread owns whole columns and adds in index order, as ATen's CPU kernels do. In Triton
(emitters/triton_scatter.py) a program takes a block of updates, as ATen's CUDA kernel does: the launcher zeroes the
output, and the first values and the updates are atomically added into it in any order (a graph network's 16-128
feature columns are then as many programs as its edges need, not a few sweeping every edge). Max, min, a mean, and a
sum without the destination's values keep one owner per output element in Triton too: programs own whole columns
and combine with atomics, so on the GPU they need many columns (MIN_GPU_COLUMNS). Triton has atomic max and min only
for 32- and 64-bit numbers and adds in float16/bfloat16 with a rounding per add, so scatters of other dtypes run
through ATen (reduced-precision packages keep scatters in float32: op_table's keeps_fp32).

The count of updates may be a size the data sets (a graph's edges after a mask drops its self loops): the source's
size along `dim` may be a dynamic dim; the destination's sizes, and the source's other sizes, are fixed.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import kernel_ir as K
from .lower_views import in_bounds
from .lowering import TensorBox, compute_dtype, is_box, lowering, normalize_dim, require

REDUCTIONS = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min"}  # scatter_reduce's names -> the kernel's
SCATTERED_DTYPES = ("float32", "float64", "int32", "int64")  # those every renderer's atomics take
# On the GPU a column-owner kernel (max, min, mean) has columns / 8..32 programs, each sweeping every update: a
# graph network's 64-128 features gave 4-16 programs on an H100's 132 SMs, and GraphSAGE (2708 nodes, 10556 edges)
# ran at 0.78x TorchScript against ATen's edge-parallel scatter. Below this many columns those stay ATen's; a sum is
# edge-parallel in Triton (kernel_ir.update_parallel) and takes any number of columns.
MIN_GPU_COLUMNS = 4096


@dataclass(eq=False)
class ScatterBox(TensorBox):
    """A scatter's result: `init` at every output index, then each point of `source_shape` combines `update(point)`
    into the output at the point's coordinates with `dim` replaced by `target(point)` (K.ScatterKernel). fuse.py
    gives it its nodes (those of its inputs still virtual when it is stored)."""
    init: Optional[Callable] = None
    source_shape: tuple = ()
    dim: int = 0
    target: Optional[Callable] = None
    update: Optional[Callable] = None
    reduce: str = "sum"
    include_self: bool = True


def _scatter(ctx, x: TensorBox, dim: int, source_shape: tuple, target: Callable, update: Callable,
             reduce: str = "sum", include_self: bool = True) -> ScatterBox:
    shape = tuple(ctx.out_shape)
    require(all(isinstance(n, int) for n in shape), "a scatter into a destination of a dynamic size")
    require(all(isinstance(n, int) for d, n in enumerate(source_shape) if d != dim),
            "a scatter whose source has a dynamic size along a dim other than the scattered one")
    require(x.dtype in SCATTERED_DTYPES, f"a scatter of {x.dtype}: generated scatters take 32- and 64-bit numbers "
            "(Triton's atomics have no max or min of narrower ones, and round a float16/bfloat16 sum at every add)")
    require(len(shape) >= 1 and len(source_shape) == len(shape), "a scatter of a 0-d tensor")
    require(all(s == n for d, (s, n) in enumerate(zip(source_shape, shape)) if d != dim),
            "a scatter whose index is smaller than its destination along another dim")
    columns = 1
    for d, n in enumerate(shape):
        columns *= n if d != dim else 1
    require(ctx.device_type != "cuda" or K.update_parallel(reduce, include_self) or columns >= MIN_GPU_COLUMNS,
            f"a scatter over {columns} columns on the GPU: a program per few columns sweeps every update, slower "
            f"than ATen's edge-parallel scatter below {MIN_GPU_COLUMNS} columns")
    kind = compute_dtype(x.dtype)

    def unused(index):
        raise AssertionError("a scatter is read only once stored (fuse.py stores it as it is lowered)")

    return ScatterBox(shape, x.dtype, fn=unused, init=lambda index: K.cast(x(index), kind),
                      source_shape=tuple(source_shape), dim=dim, target=target,
                      update=lambda point: K.cast(update(point), kind), reduce=reduce, include_self=include_self)


def _index_of(index: TensorBox, size: int) -> Callable:
    return lambda point: in_bounds(index(point), size)


@lowering("aten::scatter_add")
def scatter_add(ctx, x, dim, index, src):
    return scatter_reduce(ctx, x, dim, index, src, "sum", True)


@lowering("aten::scatter_reduce.two")
def scatter_reduce(ctx, x, dim, index, src, reduce, include_self=True):
    require(is_box(index) and is_box(src) and not is_box(dim) and not is_box(include_self),
            "a scatter's dim or include_self computed at run time")
    require(reduce in REDUCTIONS, f"scatter_reduce {reduce!r}")
    require(index.dtype == "int64" and src.dtype == x.dtype, "a scatter's index not int64, or its source of another dtype")
    dim = normalize_dim(dim, len(x.shape))
    require(len(index.shape) == len(src.shape) and all(
        i == s or isinstance(i, int) and isinstance(s, int) and i <= s for i, s in zip(index.shape, src.shape)),
        "a scatter's index larger than its source (or of another dynamic size)")
    return _scatter(ctx, x, dim, tuple(index.shape), _index_of(index, x.shape[dim]) if x.shape else None, src,
                    REDUCTIONS[reduce], bool(include_self))


@lowering("aten::index_add")
def index_add(ctx, x, dim, index, source, alpha: Any = 1):
    require(is_box(index) and is_box(source) and not is_box(dim) and not is_box(alpha),
            "index_add's dim or alpha computed at run time")
    require(len(index.shape) == 1 and index.dtype in ("int64", "int32") and source.dtype == x.dtype,
            "index_add's index not a 1-d integer tensor, or its source of another dtype")
    dim = normalize_dim(dim, len(x.shape))
    position = _index_of(index, x.shape[dim]) if x.shape else None

    def update(point):
        value = source(point)
        return value if alpha == 1 else K.op("mul", value, K.const(alpha, value.dtype))

    return _scatter(ctx, x, dim, tuple(source.shape), lambda point: position([point[dim]]), update)
