"""The arena: one buffer, sized at convert time, that generated kernels write their intermediate outputs into.

Without it every kernel step allocates its outputs on every call and frees them after their last reader; with it,
a runtime makes the arena once (per thread, so concurrent calls never share one) with each planned output as a
fixed view into it, and a call allocates nothing for them. Outputs whose lives never overlap share bytes, packed
once here, so the arena is no larger than the most bytes alive at once needs (up to packing's slack).

Which kernel outputs may live in the arena: those whose memory nothing outside this call can see, and whose last
reader is known. So the plan's top level only (a branch or loop body runs a variable number of times), static
shapes only (their byte size is known now), and a value is refused when it, or anything that may alias it, is
returned, read by a control-flow step, read by an op that is not ATen's (containers hold on to tensors), or kept
by an ATen op in a container (`aten::append.t`'s `t(c -> *) el`: a list of module state outlives the call). An
ATen op that may return its input or a view of it (`may_alias`, schema annotations, in-place writes) joins its
outputs to its inputs' family: the family lives until its last member's last reader.

CPU plans only: on CUDA, steps run inside CUDA graphs (whose pool is already planned by capture) or through the
caching allocator, which reuses blocks without a system call, and a shared arena would add stream hazards.

The plan records `plan["arena"] = {"bytes": n}` and on each kernel step `"arena": [byte offset or null per output]`.
"""
from __future__ import annotations

import bisect
import math
from collections import defaultdict
from typing import Iterator, Optional

import torch

from .ir import Attr, Node
from .op_table import may_alias, returns_alias, stores_argument, writes_in_place

ALIGN = 64  # bytes: a cache line, and more than any dtype's alignment
Key = tuple[int, int]  # (defining step's position, output index): one value, whatever slot it lives in


def plan_arena(plan: dict, nodes: list[Node]) -> None:
    """Annotate a CPU plan in place (see the module docstring); a plan with nothing to place is left unchanged."""
    steps = plan["steps"]
    families = _Families()
    candidates: dict[Key, int] = {}  # kernel outputs of static shape -> their bytes
    last_read: dict[Key, int] = {}
    escaped: set[Key] = set()
    in_slot: dict[int, Key] = {}
    for position, step in enumerate(steps):
        read = [in_slot[s] for s in _slots_read(step) if s in in_slot]
        for key in read:
            last_read[key] = position
        outputs = [(position, j) for j in range(len(step.get("outs", ())))]
        if step["kind"] == "call" and step["op"].startswith("aten::"):
            schema = nodes[step["node"]].attrs.get(Attr.SCHEMA, "")
            if stores_argument(schema):  # `self.seen.append(y)`: y lives on in the list, past this call
                escaped.update(read)
            elif may_alias(step["op"]) or returns_alias(schema) or writes_in_place(schema):
                for key in read:
                    for out in outputs:
                        families.join(key, out)
        elif step["kind"] != "kernel":
            escaped.update(read)  # control flow, containers, host ops: out of this analysis' sight
        for j, slot in enumerate(step.get("outs", ())):
            in_slot[slot] = (position, j)
        if step["kind"] == "kernel":
            for j, (shape, dtype, strides) in enumerate(step["out_types"]):
                nbytes = _static_bytes(shape, strides, dtype)
                if nbytes:
                    candidates[(position, j)] = nbytes
    escaped.update(in_slot[r[1]] for r in plan["outputs"] if r[0] == "s" and r[1] in in_slot)
    escaped_families = {families.find(k) for k in escaped}
    family_end: dict[Key, int] = {}
    for key, at in last_read.items():
        root = families.find(key)
        family_end[root] = max(family_end.get(root, -1), at)
    lives = {key: (key[0], family_end.get(families.find(key), key[0])) for key in candidates
             if families.find(key) not in escaped_families}
    if not lives:
        return
    offsets, total = _pack({key: candidates[key] for key in lives}, lives)
    plan["arena"] = {"bytes": total}
    for (position, j), offset in offsets.items():
        step = steps[position]
        step.setdefault("arena", [None] * len(step["outs"]))[j] = offset


class _Families:
    """Union-find over values that may share memory."""

    def __init__(self) -> None:
        self.parent: dict[Key, Key] = {}

    def find(self, key: Key) -> Key:
        while self.parent.get(key, key) != key:
            key = self.parent[key]
        return key

    def join(self, a: Key, b: Key) -> None:
        self.parent[self.find(b)] = self.find(a)


def _slots_read(step: dict) -> Iterator[int]:
    """Every slot a step reads, its nested blocks' reads included (they run inside it)."""
    for ref in step.get("args", ()):
        if ref[0] == "s":
            yield ref[1]
    for block in step.get("blocks", ()):
        for inner in block["steps"]:
            yield from _slots_read(inner)
        for ref in block["outputs"]:
            if ref[0] == "s":
                yield ref[1]
    for inner in step.get("steps", ()):  # a region's steps
        yield from _slots_read(inner)


def _static_bytes(shape: list, strides: list, dtype: str) -> Optional[int]:
    """The bytes a dense output of this static shape spans, rounded up to ALIGN; None over dynamic dims."""
    if not all(isinstance(n, int) for n in (*shape, *strides)):
        return None
    if any(n == 0 for n in shape):
        return None  # nothing to place
    span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
    return -(-span * getattr(torch, dtype).itemsize // ALIGN) * ALIGN


def _pack(sizes: dict[Key, int], lives: dict[Key, tuple[int, int]]) -> tuple[dict[Key, int], int]:
    """Offsets such that values alive at the same time never overlap: largest first, each at the lowest offset
    that clears every already placed value whose life overlaps its own (first fit, as TFLite's and Inductor's
    planners do). Lives are inclusive [defined, last read] step positions."""
    placed = _Placed(max((dies for _, dies in lives.values()), default=0) + 1)
    offsets: dict[Key, int] = {}
    total = 0
    for key in sorted(sizes, key=lambda k: (-sizes[k], k)):
        born, dies = lives[key]
        offset = 0
        for start, end in sorted(placed.overlapping(born, dies)):
            if offset + sizes[key] <= start:
                break
            offset = max(offset, end)
        offsets[key] = offset
        placed.add(born, dies, offset, offset + sizes[key])
        total = max(total, offset + sizes[key])
    return offsets, total


class _Placed:
    """The placed values' byte ranges, found by time: those alive when a new value is born (a segment tree over
    step positions holds each at the O(log steps) nodes that cover its life) and those born during its life (a
    list sorted by birth). Scanning every placed value for each new one was quadratic in the kernels (0.85 s for
    4,000)."""

    def __init__(self, steps: int) -> None:
        self.leaves = 1 << max(steps - 1, 1).bit_length()
        self.covering: dict[int, list[tuple[int, int]]] = defaultdict(list)  # tree node -> (offset, end)
        self.births: list[tuple[int, int, int]] = []  # (born, offset, end), sorted

    def add(self, born: int, dies: int, offset: int, end: int) -> None:
        low, high = born + self.leaves, dies + self.leaves + 1
        while low < high:
            if low & 1:
                self.covering[low].append((offset, end))
                low += 1
            if high & 1:
                high -= 1
                self.covering[high].append((offset, end))
            low, high = low >> 1, high >> 1
        bisect.insort(self.births, (born, offset, end))

    def overlapping(self, born: int, dies: int) -> Iterator[tuple[int, int]]:
        node = born + self.leaves
        while node:  # alive at `born`: stored on the path from its leaf to the root
            yield from self.covering.get(node, ())
            node >>= 1
        first = bisect.bisect_right(self.births, (born, math.inf, math.inf))
        last = bisect.bisect_right(self.births, (dies, math.inf, math.inf))
        for _, offset, end in self.births[first:last]:  # born after `born`, while it lives
            yield offset, end
