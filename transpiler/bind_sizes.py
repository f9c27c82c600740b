"""Opaque sizes bound at run time, so that the ops over them still become kernels.

A size no polynomial in the dynamic dims explains (a strided convolution's `(L - 3) // 2 + 1`, a pooling's ceil)
is an opaque symbol after shape inference, and no kernel could take it: with a dynamic image size every op after
the first strided conv ran through ATen. But such a size is always a size of some tensor an ATen op made, and that
tensor is there at run time: the runtime reads the size from it, right after the op, into the call's size table,
and kernels take it as they take an input's dim.

A symbol is bound where it first appears, if that is a tensor a node that never lowers (a convolution, a GEMM, a
fallback op) makes at the top level of the graph: such a node runs once per call, before every value computed from
that size. Symbols first seen elsewhere (inside a branch or a loop, or on a value a kernel may make) stay opaque;
but a count read from data (data_sizes.py) is bound wherever the top level first makes it, and the node that makes
it then runs through ATen (fuse.py), so the kernels after a mask, a slice of the best 50 or an NMS take it.
Shape inference gave two sizes one symbol when they agreed at every draw; the runtime checks that what it binds and
the shapes of the ATen tensors kernels read agree with the table (SizeChangedError otherwise), and verification runs
the package at the ranges' ends and at draws between them.
"""
from __future__ import annotations

from typing import Optional

from .infer_shapes import ShapeRecorder
from .ir import Attr, Block, Graph, Type, defined, opaque_symbols
from .op_table import HOST, lookup
from .symbolic import SymSize

BOUND_MIN = 1  # a bound size's least value: a tensor with an empty dim gives no work to the kernels that read it


def bind_opaque_sizes(graph: Graph, recorder: ShapeRecorder, dims: Optional[dict[str, tuple]]) -> dict[str, tuple]:
    """Bind what can be bound: each binding node gets `attrs["binds"]` ([(output index, axis, name)]), every type
    in the graph spells the bound symbols as dims, and `dims` (name -> (min, max, example)) gains them; -> the new
    dims. Without dynamic dims (`dims` None) only counts read from data are opaque (graph.data_sizes), and only
    those are bound; the caller then passes the new dims on to fusion."""
    bindable = set(recorder.opaque_examples) if dims is not None else graph.data_sizes & set(recorder.opaque_examples)
    first: dict[str, Optional[tuple]] = {}  # symbol -> (node, output index, axis) of its first carrier, or None
    _first_carriers(graph.body, first, top=True, counts=graph.data_sizes, confined=_confined(graph))
    bound = {name: where for name, where in first.items() if where is not None and name in bindable}
    for name, (node, index, axis) in bound.items():
        node.attrs.setdefault(Attr.BINDS, []).append((index, axis, name))
    if not bound:
        return {}
    for value in defined(graph):
        value.type = _with_bound(value.type, bound, recorder.dense_orders.get(value.id))
    # a count may be 0 (no box passes): a kernel over it launches no program
    added = {name: (0 if name in graph.data_sizes else BOUND_MIN, None, recorder.opaque_examples[name])
             for name in bound}
    if dims is not None:
        dims.update(added)
    return added


def _first_carriers(block: Block, first: dict[str, Optional[tuple]], top: bool, counts: set[str],
                    confined: dict[str, int]) -> None:
    """Each symbol's first carrier in run order (a node's blocks run before its outputs exist), as a binding place
    when a top-level node that runs through ATen makes it, else None. A count read from data is bound where it is
    first made at the top level whatever the node (fusion then leaves that node to ATen: a slice `[:50]` of the
    sorted candidates is a view, no launch), so that the kernels after it can take it; and so is one made in a
    loop's or branch's block that no value outside that block carries (`confined`): each run of the block binds it
    again before the block reads it (a detector's per-class count, then its gathers)."""
    for name in (n for v in block.inputs for n in opaque_symbols(v.type)):
        first.setdefault(name, None)
    for node in block.nodes:
        for inner in node.blocks:
            _first_carriers(inner, first, top=False, counts=counts, confined=confined)
        binds = not node.blocks and lookup(node.op).category != HOST
        for index, value in enumerate(node.outputs):
            for axis, name in _opaque_axes(value.type):
                here = top or (name in counts and confined.get(name) == id(block))
                first.setdefault(name, (node, index, axis) if binds and here and (_never_lowers(node.op) or
                                                                                  name in counts) else None)
            for name in opaque_symbols(value.type):  # a container's tensors: not bound from it
                first.setdefault(name, None)


def _confined(graph: Graph) -> dict[str, int]:
    """Symbol -> id of the one nested block whose nodes make every value carrying it, where no block's inputs or
    outputs, no container and nothing outside carries it: bound there, it is read nowhere after the block, so the
    block's next run binds it again, and a block that never runs leaves nothing to read."""
    homes: dict[str, set] = {}

    def visit(block: Block, nested: bool) -> None:
        for v in (*block.inputs, *block.outputs):
            for name in opaque_symbols(v.type):
                homes.setdefault(name, set()).add(None)
        for node in block.nodes:
            for v in node.outputs:
                home = id(block) if nested and not v.type.elems else None  # (a container's items: out of sight)
                for name in opaque_symbols(v.type):
                    homes.setdefault(name, set()).add(home)
            for inner in node.blocks:
                visit(inner, True)

    visit(graph.body, False)
    return {name: next(iter(where)) for name, where in homes.items() if len(where) == 1 and None not in where}


def _never_lowers(op: str) -> bool:
    info = lookup(op)
    return info.lowering is None and info.category != HOST


def _opaque_axes(t: Type) -> list[tuple[int, str]]:
    if not t.is_tensor or t.shape is None:
        return []
    return [(axis, n) for axis, n in enumerate(t.shape) if isinstance(n, str)]


def _with_bound(t: Type, bound: dict, order: Optional[tuple[int, ...]]) -> Type:
    """`t` with its bound symbols as dims; a tensor whose strides fit no polynomial gets the dense strides of the
    order it had at every draw, now that every size in them can be spelled (a runtime copies an ATen tensor that
    comes in another layout into the one a kernel indexes)."""
    if t.elems:
        return Type(t.kind, t.dtype, t.shape, t.device, elems=tuple(_with_bound(e, bound, None) for e in t.elems),
                    strides=t.strides)
    if not t.is_tensor or t.shape is None or not any(isinstance(n, str) and n in bound for n in t.shape):
        return t
    shape = tuple(SymSize.symbol(n) if isinstance(n, str) and n in bound else n for n in t.shape)
    strides = t.strides
    if strides is None and order is not None and not any(isinstance(n, str) for n in shape):
        dense, step = [0] * len(shape), 1
        for d in reversed(order):
            dense[d] = step
            step = step * shape[d]
        strides = tuple(dense)
    return Type(t.kind, t.dtype, shape, t.device, strides=strides)
