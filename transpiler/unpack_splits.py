"""Rewrite `chunk` / `split` / `unbind` followed by `prim::ListUnpack` into one slice (or select) per piece.

The list between them is host bookkeeping that no kernel can see through; as separate slices every piece is a view
that lowers to indexing, so `q, k, v = qkv.chunk(3, -1)` costs nothing inside the kernels that read q, k and v.
"""
from __future__ import annotations

from collections import Counter
from typing import Optional

from .ir import Attr, Block, Graph, Node, Type, Value, literals
from .op_table import lookup

SLICE_SCHEMA = "aten::slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)"
SELECT_SCHEMA = "aten::select.int(Tensor(a) self, int dim, SymInt index) -> Tensor(a)"


def unpack_splits(graph: Graph) -> Graph:
    producer = {v.id: n for n in graph.walk() for v in n.outputs}
    uses = Counter(v.id for n in graph.walk() for v in n.inputs)
    uses.update(v.id for n in graph.walk() for b in n.blocks for v in b.outputs)
    uses.update(v.id for v in graph.outputs)
    _block(graph.body, producer, uses, literals(graph))
    return graph


def _block(block: Block, producer, uses, constants) -> None:
    out: list[Node] = []
    for node in block.nodes:
        for sub in node.blocks:
            _block(sub, producer, uses, constants)
        split = producer.get(node.inputs[0].id) if node.op == "prim::ListUnpack" else None
        if split is not None and split in out and uses[node.inputs[0].id] == 1:
            pieces = _pieces(split, constants, len(node.outputs))
            if pieces is not None:
                out.remove(split)
                out += _views(split, node, *pieces)
                continue
        out.append(node)
    block.nodes = out


def _pieces(split: Node, constants, count: int) -> Optional[tuple[int, list[tuple[int, int]], bool]]:
    """(dim, [(start, length)], one_element?) of each piece, when every argument is a constant and the dim split
    is static (the others may be dynamic: a batch)."""
    form = lookup(split.op).splits
    if not form or len(split.inputs) < 2:  # a list some other op made: `h, w = x.shape`, folded
        return None
    x = split.inputs[0]
    if x.type.shape is None:
        return None
    args = [constants.get(v.id, _UNKNOWN) for v in split.inputs[1:]]
    rank = len(x.type.shape)
    split_dim = args[0] if form == "unbind" else args[-1]  # every form takes the dim last
    if any(a is _UNKNOWN for a in args) or not isinstance(split_dim, int) or not rank \
            or not isinstance(x.type.shape[split_dim % rank], int):
        return None
    if form == "unbind":
        dim = args[0] % rank
        return dim, [(i, 1) for i in range(x.type.shape[dim])], True
    if form == "chunk":
        chunks, dim = args[0], args[1] % rank
        size = -(-x.type.shape[dim] // chunks)
        sizes = _fill(x.type.shape[dim], size)
    elif form == "size":
        dim = args[1] % rank
        sizes = _fill(x.type.shape[dim], args[0])
    elif form == "sizes":
        dim = args[1] % rank
        sizes = list(args[0])
    else:
        return None
    if len(sizes) != count:
        return None
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return dim, list(zip(starts, sizes)), False


_UNKNOWN = object()


def _fill(total: int, size: int) -> list[int]:
    sizes = [size] * (total // size) if size else []
    if size and total % size:
        sizes.append(total % size)
    return sizes


def _views(split: Node, unpack: Node, dim: int, pieces: list[tuple[int, int]], select: bool) -> list[Node]:
    nodes: list[Node] = []

    def constant(value: int) -> Value:
        v = Value("c", Type("int"))
        nodes.append(Node("prim::Constant", [], [v], attrs={Attr.VALUE: value}))
        return v

    x, dim_value = split.inputs[0], constant(dim)
    for (start, length), out in zip(pieces, unpack.outputs):
        if select:
            nodes.append(Node("aten::select.int", [x, dim_value, constant(start)], [out],
                              attrs={Attr.SCHEMA: SELECT_SCHEMA}, source=split.source))
        else:
            nodes.append(Node("aten::slice.Tensor", [x, dim_value, constant(start), constant(start + length),
                                                     constant(1)], [out],
                              attrs={Attr.SCHEMA: SLICE_SCHEMA}, source=split.source))
    return nodes
