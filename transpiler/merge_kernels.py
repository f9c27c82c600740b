"""Sibling kernels become one: pointwise kernels over the same iteration space that do not depend on each other
(`x + y`, `max(x, y)` and `sin(x)` of one model's three outputs) run as one kernel with several outputs.

Fusion makes one kernel per stored value, so values that only share inputs stay apart: each then costs a call of
its own (on the CPU a few hundred nanoseconds, on the GPU a launch) and another pass over the inputs they share.
Merging moves the later kernel up to the earlier one, which is sound when nothing between them defines one of its
inputs or may write memory (an in-place op, control flow, a side effect); both must be free of reductions, whose
kernels are shaped by their reductions (rows, split passes) more than by their outputs.
"""
from __future__ import annotations

import bisect

from .alias_analysis import writes
from .ir import Attr, KERNEL_OP, Block, Graph, Node, blocks
from .op_table import lookup
from . import kernel_ir as K

MAX_OUTPUTS = 8  # a merged kernel's stores and live values stay within what one loop body holds well
MAX_INPUTS = 16


def merge_kernels(graph: Graph) -> Graph:
    for block in blocks(graph):
        _merge_in(block)
    return graph


def _merge_in(block: Block) -> None:
    """One pass over the block. A kernel looks for a host only among the open kernels over its own iteration space,
    and only after the newest of its inputs was defined (positions ascend, so that is a bisection): checking every
    open kernel, and keeping for each the values defined since, was quadratic in the kernels (a chain of 1,000
    pointwise+cat layers spent 6.9 s here)."""
    kept: list[Node] = []
    open_: dict[tuple, tuple[list[int], list[Node]]] = {}  # iteration space -> (positions, kernels) a later may join
    defined_at: dict[int, int] = {}  # value id -> position of the node defining it (a kernel's own outputs too)
    for position, node in enumerate(block.nodes):
        if node.blocks or writes(node) or lookup(node.op).host_effect:
            open_ = {}  # nothing moves above a write, a branch or a side effect
        elif node.op == KERNEL_OP and _pointwise(node):
            kernel = node.attrs[Attr.KERNEL]
            positions, hosts = open_.setdefault((kernel.ranges, kernel.index), ([], []))
            newest_input = max((defined_at.get(v.id, -1) for v in node.inputs), default=-1)
            first = bisect.bisect_right(positions, newest_input)  # hosts defined after every input
            host = next((k for k in hosts[first:] if _joinable(k, node)), None)
            if host is not None:
                _absorb(host, node)
                defined_at.update((v.id, position) for v in node.outputs)  # what reads them cannot join `host`
                continue
            positions.append(position)
            hosts.append(node)
        kept.append(node)
        defined_at.update((v.id, position) for v in node.outputs)
    block.nodes = kept


def _pointwise(node: Node) -> bool:
    return not any(K.reductions_in(v) for v in node.attrs[Attr.KERNEL].values)


def _joinable(host: Node, node: Node) -> bool:
    """Whether `host` (over the same iteration space) has room for `node`'s outputs and inputs."""
    a, b = host.attrs[Attr.KERNEL], node.attrs[Attr.KERNEL]
    names = {x.name for x in a.inputs} | {x.name for x in b.inputs}
    return len(a.outputs) + len(b.outputs) <= MAX_OUTPUTS and len(names) <= MAX_INPUTS


def _absorb(host: Node, node: Node) -> None:
    """`node`'s kernel becomes part of `host`'s: its inputs join host's (each buffer once), its outputs follow."""
    a, b = host.attrs[Attr.KERNEL], node.attrs[Attr.KERNEL]
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
    host.attrs[Attr.FUSED] = host.attrs[Attr.FUSED] + node.attrs[Attr.FUSED]
