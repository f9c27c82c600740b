"""Sibling kernels become one: pointwise kernels over the same iteration space that do not depend on each other
(`x + y`, `max(x, y)` and `sin(x)` of one model's three outputs) run as one kernel with several outputs.

Fusion makes one kernel per stored value, so values that only share inputs stay apart: each then costs a call of
its own (on the CPU a few hundred nanoseconds, on the GPU a launch) and another pass over the inputs they share.
Merging moves the later kernel up to the earlier one, which is sound when nothing between them defines one of its
inputs or may write memory (an in-place op, control flow, a side effect); both must be free of reductions, whose
kernels are shaped by their reductions (rows, split passes) more than by their outputs.
"""
from __future__ import annotations

from .alias_analysis import writes
from .ir import KERNEL_OP, Block, Graph, Node, blocks
from . import kernel_ir as K

MAX_OUTPUTS = 8  # a merged kernel's stores and live values stay within what one loop body holds well
MAX_INPUTS = 16
SIDE_EFFECTS = frozenset({"prim::RaiseException", "prim::Print", "aten::warn"})


def merge_kernels(graph: Graph) -> Graph:
    for block in blocks(graph):
        _merge_in(block)
    return graph


def _merge_in(block: Block) -> None:
    kept: list[Node] = []
    open_: list[tuple[Node, set[int]]] = []  # kernels a later one may join, and the values defined since each
    for node in block.nodes:
        if node.blocks or writes(node) or node.op in SIDE_EFFECTS:
            open_ = []  # nothing moves above a write, a branch or a side effect
        elif node.op == KERNEL_OP and _pointwise(node):
            inputs = {v.id for v in node.inputs}
            host = next((k for k, since in open_ if _joinable(k, node) and not inputs & since), None)
            if host is not None:
                _absorb(host, node)
                for _, since in open_:
                    since.update(v.id for v in node.outputs)
                continue
            open_.append((node, set()))
        kept.append(node)
        for _, since in open_:  # a kernel's own outputs too: what reads them cannot join it
            since.update(v.id for v in node.outputs)
    block.nodes = kept


def _pointwise(node: Node) -> bool:
    return not any(K.reductions_in(v) for v in node.attrs["kernel"].values)


def _joinable(host: Node, node: Node) -> bool:
    a, b = host.attrs["kernel"], node.attrs["kernel"]
    names = {x.name for x in a.inputs} | {x.name for x in b.inputs}
    return (a.ranges == b.ranges and a.index == b.index and len(a.outputs) + len(b.outputs) <= MAX_OUTPUTS
            and len(names) <= MAX_INPUTS)


def _absorb(host: Node, node: Node) -> None:
    """`node`'s kernel becomes part of `host`'s: its inputs join host's (each buffer once), its outputs follow."""
    a, b = host.attrs["kernel"], node.attrs["kernel"]
    have = {x.name for x in a.inputs}
    for value, buffer in zip(node.inputs, b.inputs):
        if buffer.name not in have:
            have.add(buffer.name)
            a.inputs.append(buffer)
            host.inputs.append(value)
    a.outputs += b.outputs
    a.values += b.values
    a.provenance += b.provenance
    host.outputs += node.outputs
    host.attrs["fused"] = host.attrs["fused"] + node.attrs["fused"]
