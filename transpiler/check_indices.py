"""Index bounds: a generated gather clamps its index so that a bad one never reads outside the tensor, and a generated
scatter so that it never writes outside it, where ATen raises "index out of range". So before each embedding,
index_select, gather, scatter (scatter_add, index_add, scatter_reduce: into [0, size), as ATen's, which count no
index from the end) and integer-tensor indexing (`x[i, j]`, where a negative index counts from the end) this pass
inserts `all(low <= index < size)` (ordinary pointwise and reduction ops: fusion makes them one small kernel) and
an `aten::_assert_async.msg` on the result.
On the CPU a bad index then raises as ATen's does; on CUDA it is a device-side assert, as in ATen's own index
kernels, with no host sync (so CUDA graphs keep it).

An index that is a view of a frozen weight (a transformer's `position_ids[:, :seq]`, its `token_type_ids` buffer
expanded to the batch) or a tensor filled with one number can only hold values known here: those are checked once,
at conversion, and such a gather gets no check at run time (BERT-base had four checks and four device asserts a
call, three of them on buffers). An index that fails that check keeps the run-time check, so the error is raised
where ATen raises it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Optional

import torch

from .ir import Attr, Block, Graph, Node, Type, Value, literals as literals_of, weight_names
from .op_table import is_view, lookup, schema_of, writes_in_place

MESSAGE_LIMIT = 250


def check_indices(graph: Graph) -> Graph:
    constants = literals_of(graph)
    weights = _weights_by_value(graph)
    producers = {v.id: n for n in graph.walk() for v in n.outputs}
    lists = {n.outputs[0].id: n for n in graph.walk() if n.op == "prim::ListConstruct"}

    def indexings(node: Node) -> Iterator[tuple[Value, Any, Optional[int]]]:
        """(index, dim, least value) of each index the node reads a tensor at."""
        if lookup(node.op).gather:
            index_at, dim_at = lookup(node.op).gather  # the indexed tensor is the first input
            yield node.inputs[index_at], constants.get(node.inputs[dim_at].id) if dim_at is not None else 0, 0
        elif node.op == "aten::index.Tensor" and node.inputs[1].id in lists:
            for dim, index in enumerate(lists[node.inputs[1].id].inputs):
                if index.type.is_tensor and index.type.dtype in ("int64", "int32"):
                    yield index, dim, None

    for block in _blocks(graph.body):
        # One check per index and size in a stretch of the block with no in-place write (a graph network reads
        # one edge list five times): at its first reader, with the least value the strictest reader allows (0
        # where a later one is a scatter or index_select, which would refuse a negative index there anyway:
        # nothing between can leave the block). It guards every reader; fusion drops it where every one runs
        # through ATen, which checks its own indices (drop_unread.py).
        checks: dict[tuple, _Check] = {}
        before: dict[int, list[_Check]] = {}  # id(node) -> the checks made just before it
        for node in block.nodes:
            if writes_in_place(node.attrs.get(Attr.SCHEMA, "")):
                checks = {}  # (it may have written an index checked before)
            for index, dim, low in indexings(node):
                shape = node.inputs[0].type.shape
                if (_known_in_range(node, index, dim, low, constants, weights, producers) or not shape
                        or not isinstance(dim, int) or not -len(shape) <= dim < len(shape)
                        or not isinstance(shape[dim], int)):
                    continue  # known in range, or no static size to check against (ATen's or the clamp is all)
                covered = _covered(index, producers)
                key = (covered.id, shape[dim])
                if key not in checks:
                    checks[key] = _Check(node, covered, dim, low)
                    before.setdefault(id(node), []).append(checks[key])
                elif low == 0:
                    checks[key].low = 0
                checks[key].guards.append(node.uid)
        out: list[Node] = []
        for node in block.nodes:
            for check in before.get(id(node), ()):
                out += _bounds_check(check)
            out.append(node)
        block.nodes = out
    return graph


@dataclass
class _Check:
    node: Node  # the first reader: the check's source line, and where the size is read
    index: Value
    dim: int
    low: Optional[int]  # None: -size (integer-tensor indexing counts from the end)
    guards: list[int] = field(default_factory=list)  # the uids of every reader it checks for


def _weights_by_value(graph: Graph) -> dict[int, torch.Tensor]:
    return {vid: graph.weights[name] for vid, name in weight_names(graph).items() if name in graph.weights}


def _known_in_range(node: Node, index: Value, dim: Any, low: Optional[int], constants: dict[int, Any],
                    weights: dict[int, torch.Tensor], producers: dict[int, Node]) -> bool:
    """Whether every value `index` can hold is known at conversion and within [low, size) of the source's `dim`
    (low None: -size)."""
    bounds = _known_bounds(index, constants, weights, producers)
    shape = node.inputs[0].type.shape
    if bounds is None or not shape or not isinstance(dim, int) or not -len(shape) <= dim < len(shape) \
            or not isinstance(shape[dim], int):
        return False
    size = shape[dim]
    return bounds == () or ((-size if low is None else low) <= bounds[0] and bounds[1] < size)


def _known_bounds(value: Value, constants: dict[int, Any], weights: dict[int, torch.Tensor],
                  producers: dict[int, Node]) -> Optional[tuple]:
    """(least, largest) of the values a tensor can hold when conversion knows them: a view of an integer weight,
    or a tensor filled with one integer; () for an empty weight; None when they depend on the inputs."""
    while value.id not in weights:
        producer = producers.get(value.id)
        if producer is None:
            return None
        at = lookup(producer.op).fills
        if at is not None:  # transformers' token types when the caller gives none
            filled = constants.get(producer.inputs[at].id) if at >= 0 else 0
            return (filled, filled) if type(filled) is int else None
        if not _holds_its_input(producer.op) or not producer.inputs:
            return None
        value = producer.inputs[0]
    weight = weights[value.id]
    if weight.is_floating_point() or weight.is_complex():
        return None
    return (int(weight.min()), int(weight.max())) if weight.numel() else ()


def _covered(index: Value, producers: dict[int, Node]) -> Value:
    """The smallest tensor holding exactly the values `index` holds: through reshapes and expands (a graph network's
    `edge_index[1].view(-1, 1).expand_as(messages)` is checked on its E values, not on E x features)."""
    while True:
        producer = producers.get(index.id)
        shape = index.type.shape
        if (producer is None or not lookup(producer.op).covers_input or not producer.inputs
                or not producer.inputs[0].type.is_tensor or not shape or 0 in shape):  # (an expand to 0 elements)
            return index
        index = producer.inputs[0]


def _holds_its_input(op: str) -> bool:
    """A view (a slice, an expand, a reshape) or a copy in another layout holds only elements of its first input."""
    return is_view(op) or lookup(op).asks_layout


def _blocks(block: Block):
    yield block
    for node in block.nodes:
        for sub in node.blocks:
            yield from _blocks(sub)


def _bounds_check(check: _Check) -> list[Node]:
    """Nodes asserting `low <= index < size` of the source's `dim` (low None: -size)."""
    node, index, low = check.node, check.index, check.low
    if not index.type.is_tensor:
        return []
    size = node.inputs[0].type.shape[check.dim]
    low = -size if low is None else low
    # the failing step's error names the source line; CUDA's device assert takes at most 255 characters
    message = (f"index out of range in self: %{index.name} holds an index outside [{low}, {size}) for "
               f"{node.op}")[:MESSAGE_LIMIT]
    nodes: list[Node] = []

    def constant(name: str, value: Any, kind: str) -> Value:
        v = Value(f"{index.name}_{name}", Type(kind))
        nodes.append(Node("prim::Constant", [], [v], attrs={Attr.VALUE: value}))
        return v

    def op(name: str, args: list[Value], result: str) -> Value:
        out = [Value(f"{index.name}_{result}", Type("Tensor"))] if result else []
        nodes.append(Node(name, args, out, source=node.source,
                          attrs={Attr.SCHEMA: schema_of(name), Attr.SYNTHETIC: True}))
        return out[0] if out else None

    above = op("aten::ge.Scalar", [index, constant("low", low, "int")], "at_least_low")
    below = op("aten::lt.Scalar", [index, constant("size", size, "int")], "below_size")
    ok = op("aten::all", [op("aten::logical_and", [above, below], "in_range")], "all_in_range")
    op("aten::_assert_async.msg", [ok, constant("message", message, "str")], "")
    nodes[-1].attrs[Attr.GUARDS] = list(check.guards)
    return nodes
