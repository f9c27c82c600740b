"""Index bounds: a generated gather clamps its index so that a bad one never reads outside the tensor, where ATen
raises "index out of range". So before each embedding, index_select and gather this pass inserts
`all(0 <= index < size)` (ordinary pointwise and reduction ops: fusion makes them one small kernel) and an
`aten::_assert_async.msg` on the result. On the CPU a bad index then raises as ATen's does; on CUDA it is a
device-side assert, as in ATen's own index kernels, with no host sync (so CUDA graphs keep it)."""
from __future__ import annotations

from typing import Any

from .ir import Block, Graph, Node, Type, Value, literals as literals_of
from .op_table import lookup, schema_of

MESSAGE_LIMIT = 250


def check_indices(graph: Graph) -> Graph:
    constants = literals_of(graph)
    for block in _blocks(graph.body):
        out: list[Node] = []
        for node in block.nodes:
            if lookup(node.op).gather:
                out += _bounds_check(node, constants)
            out.append(node)
        block.nodes = out
    return graph


def _blocks(block: Block):
    yield block
    for node in block.nodes:
        for sub in node.blocks:
            yield from _blocks(sub)


def _bounds_check(node: Node, constants: dict[int, Any]) -> list[Node]:
    index_at, dim_at = lookup(node.op).gather  # the indexed tensor is the first input
    index, source = node.inputs[index_at], node.inputs[0]
    dim = constants.get(node.inputs[dim_at].id) if dim_at is not None else 0
    shape = source.type.shape
    if not (index.type.is_tensor and shape and isinstance(dim, int) and -len(shape) <= dim < len(shape)
            and isinstance(shape[dim], int)):
        return []  # nothing static to check against: ATen (or the kernel's clamp) is all there is
    size = shape[dim]
    # the failing step's error names the source line; CUDA's device assert takes at most 255 characters
    message = (f"index out of range in self: %{index.name} holds an index outside [0, {size}) for "
               f"{node.op}")[:MESSAGE_LIMIT]
    nodes: list[Node] = []

    def constant(name: str, value: Any, kind: str) -> Value:
        v = Value(f"{index.name}_{name}", Type(kind))
        nodes.append(Node("prim::Constant", [], [v], attrs={"value": value}))
        return v

    def op(name: str, args: list[Value], result: str) -> Value:
        out = [Value(f"{index.name}_{result}", Type("Tensor"))] if result else []
        nodes.append(Node(name, args, out, source=node.source,
                          attrs={"schema": schema_of(name), "synthetic": True}))
        return out[0] if out else None

    low = op("aten::ge.Scalar", [index, constant("zero", 0, "int")], "at_least_0")
    high = op("aten::lt.Scalar", [index, constant("size", size, "int")], "below_size")
    ok = op("aten::all", [op("aten::logical_and", [low, high], "in_range")], "all_in_range")
    op("aten::_assert_async.msg", [ok, constant("message", message, "str")], "")
    return nodes
