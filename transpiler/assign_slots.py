"""Slot assignment: give every runtime value a slot, reusing slots by liveness, and say when each dies.

Positions number the nodes in program order, nested blocks included. A value lives from its definition to its last
use. Everything a control-flow node reads (its inputs, the outputs its blocks yield, and any outer value its loop
body reads again on every iteration) counts as used when that node ends, and the node's own outputs are defined
then too, so they never share a slot with what the node reads. Two values share a slot when their lives do not
overlap; a value's slot is cleared right after its last user runs, so its memory goes back to the allocator while
the call is still running.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

from .ir import Block, Graph, Node, Value

FOREVER = float("inf")


@dataclass
class Slots:
    slot: dict[int, int] = field(default_factory=dict)  # value id -> slot
    free_after: dict[int, list[int]] = field(default_factory=dict)  # id(node) -> slots dead once it has run
    num_slots: int = 0


def assign_slots(graph: Graph, needs_slot: Callable[[Value], bool]) -> Slots:
    """`needs_slot(value)` is false for values baked into the plan (constants, weights)."""
    live = _Liveness(needs_slot)
    for v in graph.inputs:
        live.define(v, 0, depth=0)
    live.block(graph.body, loops=[])
    for v in graph.outputs:
        live.use(v, FOREVER, None)
    return live.assign()


@dataclass
class _Life:
    start: float
    depth: int  # how many loops enclose the definition
    end: float = -1.0
    last_user: Optional[Node] = None


class _Liveness:
    def __init__(self, needs_slot) -> None:
        self.needs_slot = needs_slot
        self.pos = 0
        self.lives: dict[int, _Life] = {}
        self.read_by_loop: dict[int, list[Value]] = {}  # id(loop) -> outer values its body reads

    def define(self, v: Value, at: float, depth: int) -> None:
        if self.needs_slot(v):
            self.lives[v.id] = _Life(at, depth, at)

    def use(self, v: Value, at: float, user: Optional[Node]) -> None:
        life = self.lives.get(v.id)
        if life is not None and at >= life.end:
            life.end, life.last_user = at, user

    def block(self, block: Block, loops: list[Node]) -> None:
        for node in block.nodes:
            if node.blocks:
                self.control(node, loops)
            else:
                self.pos += 1
                for v in node.inputs:
                    self.use_in(v, self.pos, node, loops)
                for v in node.outputs:
                    self.define(v, self.pos, len(loops))

    def control(self, node: Node, loops: list[Node]) -> None:
        self.pos += 1
        inner = loops + [node] if node.op == "prim::Loop" else loops
        reads: list[Value] = list(node.inputs)
        self.read_by_loop[id(node)] = []
        for sub in node.blocks:
            for v in sub.inputs:
                self.define(v, self.pos, len(inner))
            self.block(sub, inner)
            reads += sub.outputs
        self.pos += 1
        for v in reads + self.read_by_loop.pop(id(node)):
            self.use_in(v, self.pos, node, loops)
        for v in node.outputs:
            self.define(v, self.pos, len(loops))

    def use_in(self, v: Value, at: float, user: Node, loops: list[Node]) -> None:
        """A use inside loops that `v` was defined outside of lasts until the outermost of those loops ends."""
        life = self.lives.get(v.id)
        if life is None:
            return
        if len(loops) > life.depth:
            self.read_by_loop[id(loops[life.depth])].append(v)
        else:
            self.use(v, at, user)

    def assign(self) -> Slots:
        plan = Slots()
        free_slots: list[int] = []
        busy: list[tuple[float, int]] = []  # (end of life, slot)
        for vid, life in sorted(self.lives.items(), key=lambda item: item[1].start):
            busy.sort()
            while busy and busy[0][0] < life.start:
                free_slots.append(busy.pop(0)[1])
            slot = free_slots.pop() if free_slots else plan.num_slots
            plan.num_slots = max(plan.num_slots, slot + 1)
            plan.slot[vid] = slot
            busy.append((life.end, slot))
            if life.last_user is not None and life.end != FOREVER:
                plan.free_after.setdefault(id(life.last_user), []).append(slot)
        return plan
