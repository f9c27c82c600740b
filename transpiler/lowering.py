"""Lowering: TorchScript ops to kernel-IR index functions, one small function per op, registered in the op table.

A tensor under lowering is a `TensorBox`: either *realized* (a runtime buffer a kernel loads from) or *virtual*
(a function from an output index to a `KExpr`). Pointwise ops, views and reductions build new virtual boxes from
old ones, so a chain of them is one expression: fusion falls out of the data flow. A box is realized, into a
generated kernel, only where something outside the kernel world needs its value (see `fuse.py`).

Inside a virtual box values are kept in their compute type (float32 for float16/bfloat16), and rounded to the
storage dtype only when a kernel stores them, as TorchInductor does.
"""
from __future__ import annotations


import importlib
import itertools
import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional, Sequence

import torch

from . import kernel_ir as K
from .kernel_ir import compute_dtype  # noqa: F401  (re-exported for the lowering modules)
from .op_table import OP_TABLE, lookup
from .symbolic import at_least_one

Index = list  # list[KExpr], one per dim
_box_ids = itertools.count(1)


# What a lowering gets for an argument that only decides the output's shape and is computed at run time over
# dynamic dims (a slice's end, an iota's end): the output's fitted shape stands for it (fuse.shape_argument)
RUNTIME_SIZE = type("RuntimeSize", (), {"__repr__": lambda self: "RUNTIME_SIZE"})()


class CannotLower(Exception):
    """This node (with these arguments) has no kernel lowering; it runs through ATen instead."""


class RunsAsExtern(CannotLower):
    """This node could lower, but ATen's own kernel does its work better than a fused one would (a join of many
    tensors, a copy ATen makes at memory speed): it runs through ATen, and the report counts it as extern (a
    vendor kernel chosen on purpose), not as a fallback."""


@dataclass(eq=False)
class TensorBox:
    shape: tuple[int, ...]
    dtype: str
    fn: Optional[Callable[[Index], K.KExpr]] = None  # virtual: index -> value in compute dtype
    buffer: Optional[str] = None  # realized: the runtime value a kernel loads from
    strides: tuple[int, ...] = ()
    nodes: list = field(default_factory=list)  # IR nodes whose work this virtual box still holds
    wrapped: str = ""  # a runtime scalar carried as a 0-d tensor: the Python type it promotes as (int/float/bool)
    id: int = field(default_factory=lambda: next(_box_ids))

    @property
    def realized(self) -> bool:
        return self.buffer is not None

    def __call__(self, index: Index) -> K.KExpr:
        if self.buffer is not None:
            flat = K.sum_terms(i * s for i, s, n in zip(index, self.strides, self.shape) if n != 1)
            return K.cast(K.load(self.buffer, flat, self.dtype), compute_dtype(self.dtype))
        return self.fn(index)

    def realize_as(self, buffer: str, strides: Sequence[int]) -> None:
        self.buffer, self.strides, self.fn, self.nodes = buffer, tuple(strides), None, []

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def realized_box(buffer: str, shape: Sequence[int], dtype: str, strides: Sequence[int]) -> TensorBox:
    return TensorBox(tuple(shape), dtype, buffer=buffer, strides=tuple(strides))


def contiguous_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, running = [], 1
    for d in reversed(shape):
        strides.append(running)
        running *= at_least_one(d)
    return tuple(reversed(strides))


def strides_in_order(shape, order: list[int]) -> tuple[int, ...]:
    """Dense strides for `shape` laid out with dims `order` from outermost to innermost."""
    strides = [0] * len(shape)
    running = 1
    for d in reversed(order):
        strides[d] = running
        running *= at_least_one(shape[d])
    return tuple(strides)


# --- the registry -----------------------------------------------------------------------------------------------

Lowering = Callable[..., Any]  # (ctx, *args) -> TensorBox | tuple of boxes


def lowering(*ops: str):
    """Register `fn` as the lowering of each op; every op must already have a category in the op table."""
    def register(fn: Lowering) -> Lowering:
        for name in ops:
            info = OP_TABLE.get(name)
            if info is None:
                raise KeyError(f"{name} has a lowering but no op table entry")
            OP_TABLE[name] = replace(info, lowering=fn)  # its other facts (data-dependent size, float32) stay
        return fn
    return register


@dataclass
class LowerContext:
    """What a lowering may know about the node it lowers: its output types, and a way to make fresh loop vars."""
    op: str
    out_dtypes: list[str]
    out_shapes: list[tuple[int, ...]]
    device_type: str = "cpu"  # where the kernel runs: a lowering may choose its form by it
    # the boxes a reduction made, by id (a reduce's tag): fusion may store one as its own kernel (fuse.py)
    reductions: dict = field(default_factory=dict)

    @property
    def out_dtype(self) -> str:
        return self.out_dtypes[0]

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.out_shapes[0]

    def rvars(self, sizes: Sequence[int]) -> tuple[K.KExpr, ...]:
        n = next(_reduction_names)
        return tuple(K.var(f"r{n}_{i}", s) for i, s in enumerate(sizes))


_reduction_names = itertools.count()


LOWERING_MODULES = ("lower_pointwise", "lower_views", "lower_reductions", "lower_pooling", "lower_cat", "lower_padding",
                    "lower_writes", "lower_gates", "lower_scatter")
_loaded = False


def load_lowerings() -> None:
    """Fill the op table's lowerings, once: every reader of a lowering goes through here, so none depends on which
    module happened to be imported first."""
    global _loaded
    if not _loaded:
        for name in LOWERING_MODULES:
            importlib.import_module(f"{__package__}.{name}")
        _loaded = True


def get_lowering(op: str) -> Optional[Lowering]:
    load_lowerings()
    return lookup(op).lowering


# --- helpers shared by the lowering modules -------------------------------------------------------------------


def is_box(x: Any) -> bool:
    return isinstance(x, TensorBox)


def broadcast_shapes(*shapes: Sequence) -> tuple:
    """torch's broadcast of shapes whose dims may be dynamic (SymSize): a dim broadcasts only from a static 1; two
    different dynamic sizes, or a dynamic and a static one, cannot be told equal here, so that node stays ATen."""
    rank = max(len(s) for s in shapes)
    result = []
    for d in range(rank):
        sizes = {s[d - rank + len(s)] for s in shapes if d - rank + len(s) >= 0} - {1}
        if len(sizes) > 1:
            if all(isinstance(n, int) for n in sizes):
                raise CannotLower(f"shapes {[list(s) for s in shapes]} do not broadcast")
            raise CannotLower(f"dims {sorted(map(str, sizes))} broadcast against each other")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def broadcast_index(box: TensorBox, index: Index, shape: Sequence[int]) -> Index:
    """The index into `box` for an element of the broadcast result of rank len(shape)."""
    offset = len(shape) - len(box.shape)
    return [K.const(0, K.INT) if n == 1 else index[offset + d] for d, n in enumerate(box.shape)]


def value_at(x: Any, index: Index, shape: Sequence[int], dtype: str) -> K.KExpr:
    """x (a box or a Python scalar) at `index` of a broadcast of rank len(shape), cast to `dtype`."""
    if is_box(x):
        return K.cast(x(broadcast_index(x, index, shape)), dtype)
    return K.const(x, dtype)


def make_box(shape: Sequence[int], dtype: str, fn: Callable[[Index], K.KExpr], sources: Sequence[Any]) -> TensorBox:
    nodes: list = []
    for s in sources:
        if is_box(s) and not s.realized:
            nodes.extend(n for n in s.nodes if n not in nodes)
    return TensorBox(tuple(shape), dtype, fn=fn, nodes=nodes)


def promoted_dtype(*args: Any) -> str:
    """torch's type promotion of tensor boxes (by rank) and Python scalars, as the eager op would do it."""
    probes = [_WRAPPED_PROBES[a.wrapped] if is_box(a) and a.wrapped else
              torch.empty((1,) * len(a.shape), dtype=getattr(torch, a.dtype), device="meta") if is_box(a) else a
              for a in args]
    result = probes[0]
    dtype = None
    for p in probes[1:]:
        dtype = torch.result_type(result, p)
        result = torch.empty((1,) * max(_rank(result), _rank(p)), dtype=dtype, device="meta")
    if dtype is None:
        dtype = result.dtype if isinstance(result, torch.Tensor) else torch.result_type(result, result)
    return str(dtype).removeprefix("torch.")


_WRAPPED_PROBES = {"int": 1, "float": 1.0, "bool": True}


def _rank(x: Any) -> int:
    return x.dim() if isinstance(x, torch.Tensor) else 0


def normalize_dim(dim: int, rank: int) -> int:
    if rank == 0:
        return 0
    return dim % rank


def require(condition: bool, why: str = "") -> None:
    if not condition:
        raise CannotLower(why)
