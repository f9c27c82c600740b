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
it then runs through ATen (fuse.py), so the kernels after a mask, a slice of the best 50 or an NMS take it. A
count first made in a loop's or branch's block is bound in each block that makes it, at each run of the block. In
a package without dynamic dims every opaque size is such a count: one the call sets itself, as a size that changes
from one run of a loop's body to the next does (a loop over images of different sizes: `images[i]` binds them).
Shape inference gave two sizes one symbol when they agreed at every draw; the runtime checks that what it binds and
the shapes of the ATen tensors kernels read agree with the table (SizeChangedError otherwise), and verification runs
the package at the ranges' ends and at draws between them.
"""
from __future__ import annotations

from typing import Optional

from .infer_shapes import ShapeRecorder
from .ir import Attr, Block, Graph, Node, Type, defined
from .op_table import HOST, lookup
from .symbolic import SymSize

BOUND_MIN = 1  # a bound size's least value: a tensor with an empty dim gives no work to the kernels that read it


def bind_opaque_sizes(graph: Graph, recorder: ShapeRecorder, dims: Optional[dict[str, tuple]]) -> dict[str, tuple]:
    """Bind what can be bound: each binding node gets `attrs["binds"]` ([(output index, axis, name)]), every type
    in the graph spells the bound symbols as dims, and `dims` (name -> (min, max, example)) gains them; -> the new
    dims. Without dynamic dims (`dims` None) every opaque size is one the call sets itself: a count read from data
    (graph.data_sizes), a size that changes from one run of a loop's body to the next (a detector's images of
    different sizes, its feature levels), a `cat` of a list of counts; each is bound as a count is, and joins
    graph.data_sizes (no CUDA graph bakes it in). The caller then passes the new dims on to fusion."""
    opaque = set(recorder.opaque_examples)
    counts = graph.data_sizes if dims is not None else opaque
    places = {name: where for name, where in _binding_places(graph, counts).items() if name in opaque}
    for name, carriers in places.items():
        for node, index, axis in carriers:
            node.attrs.setdefault(Attr.BINDS, []).append((index, axis, name))
    if not places:
        return {}
    if dims is None:
        graph.data_sizes |= places.keys()
    for value in defined(graph):
        value.type = _with_bound(value.type, places, recorder.dense_orders.get(value.id))
    # a count may be 0 (no box passes): a kernel over it launches no program
    added = {name: (0 if name in graph.data_sizes else BOUND_MIN, None, recorder.opaque_examples[name])
             for name in places}
    if dims is not None:
        dims.update(added)
    return added


def _binding_places(graph: Graph, counts: set[str]) -> dict[str, list[tuple[Node, int, int]]]:
    """Symbol -> the (node, output index, axis) places that bind it, for the symbols that can be bound. A symbol
    first made at the top level (in run order: a node's blocks run before its outputs exist) is bound there, once
    per call before every value computed from it, if the node making it never lowers and has no blocks, or the
    symbol is a count (its node then runs through ATen: fuse.py), made by a node without blocks or by an `if`,
    which binds it after whichever branch ran (a count a branch no example took may set: data_sizes.py). A count
    first made in a nested block is bound in each block whose nodes make a tensor carrying it (its homes), at the
    home's first carrier, so made: each run of a home binds it again before the home reads it (a detector's
    per-class count, then its gathers; its per-image sizes in each loop over the images). That takes a count no
    block's inputs or outputs carry (only containers take such a value out of its block, and their items are read
    again through a node that carries the size: `images[i]`) and no home inside another."""
    first: dict[str, dict[int, Optional[tuple]]] = {}  # symbol -> home block id -> its first carrier, or None
    crossing: set[str] = set()  # carried by a nested block's inputs or outputs
    parent: dict[int, Optional[int]] = {id(graph.body): None}

    def visit(block: Block, top: bool) -> None:
        # (a container's items are out of sight: a node that reads one out carries its sizes, and may bind them)
        for name in (name for v in block.inputs for _, name in _opaque_axes(v.type)):
            first.setdefault(name, {}).setdefault(id(block), None)  # (the graph's inputs: not bound from them)
        if not top:
            crossing.update(name for v in (*block.inputs, *block.outputs) for _, name in _opaque_axes(v.type))
        for node in block.nodes:
            for inner in node.blocks:
                parent[id(inner)] = id(block)
                visit(inner, False)
            for index, value in enumerate(node.outputs):
                for axis, name in _opaque_axes(value.type):
                    binds = (not node.blocks and (not top or _never_lowers(node.op))
                             or name in counts and (not node.blocks or node.op == "prim::If"))
                    first.setdefault(name, {}).setdefault(id(block), (node, index, axis) if binds else None)

    visit(graph.body, True)
    places = {}
    for name, homes in first.items():
        if next(iter(homes)) == id(graph.body):  # (dicts keep insertion order: the first home made it first)
            if homes[id(graph.body)] is not None:
                places[name] = [homes[id(graph.body)]]
        elif (None not in homes.values() and name in counts and name not in crossing
              and not any(_holds(home, homes, parent) for home in homes)):
            places[name] = list(homes.values())
    return places


def _holds(home: int, homes: dict, parent: dict[int, Optional[int]]) -> bool:
    """Whether a block enclosing `home` is a home too."""
    outer = parent.get(home)
    while outer is not None:
        if outer in homes:
            return True
        outer = parent.get(outer)
    return False


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
