"""Building the plan: turn the IR into the execution plan, a flat list of steps per block over numbered slots.

The plan is plain data (dicts, lists, literals) so that `deploy/` can store it as JSON and run it without the
transpiler. A step is one of:
  call    an op run by the runtime: host bookkeeping, or an ATen op called by its schema
  if      structured `prim::If`: runs one of its two blocks
  loop    structured `prim::Loop`: runs its body while the trip count and condition allow
  kernel  a generated kernel: reads its input buffers, writes freshly allocated outputs
Arguments are references: ["s", slot] for a runtime value, ["c", literal] for a constant baked into the plan,
["w", name] for a weight, ["wl", [names]] for a list of weights, ["p", name] for a packed constant: one the plan's
"packed" list builds once at load from weights and literals (a quantized op's packed parameters, built by the op
that packs them; transpiler/packed_params.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .alias_analysis import near_writes
from .ir import KERNEL_OP, Attr, Block, Graph, Node, Type, Value, readers
from .op_table import EXTERN, lookup, writes_in_place
from .packed_params import AT_LOAD
from .assign_slots import Slots, assign_slots
from .symbolic import SymSize, size_json


@dataclass
class Plan:
    plan: dict[str, Any]
    node_table: list[dict[str, Any]]  # per planned node: op, category, source; stored for reports and errors
    nodes: list[Node]  # the IR node behind each node_table entry (step["node"] indexes both)
    weights: dict[str, torch.Tensor]  # what the plan's ["w", name] references name
    counts: frozenset = frozenset()  # the bound dims that are counts read from data (kept out of CUDA graphs)
    writes_inputs: bool = False  # an in-place write reaches an input (no whole-plan CUDA graph: it writes a copy)


def build_plan(graph: Graph) -> Plan:
    literals, packed = _literals(graph)
    memory = assign_slots(graph, lambda v: v.id not in literals)
    builder = _PlanBuilder(literals, memory)
    plan = {
        "inputs": [memory.slot[v.id] for v in graph.inputs],
        "steps": builder.steps(graph.body),
        "outputs": [builder.ref(v) for v in graph.outputs],
        "num_slots": memory.num_slots,
    }
    dims = _dim_sources(graph)
    if dims:
        plan["dims"] = dims
    bound = sorted(name for node in graph.walk() for _, _, name in node.attrs.get(Attr.BINDS, ()))
    if bound:
        plan["bound_dims"] = bound  # bound by the steps that make them, after the dims read from the inputs
    if packed:
        plan["packed"] = packed
    weights = _read_weights(graph)
    if graph.host_weights & weights.keys():
        plan["host_weights"] = sorted(graph.host_weights & weights.keys())  # they stay on the CPU at load
    near, writes_inputs = near_writes(graph)
    for entry, node in zip(builder.node_table, builder.nodes):
        if id(node) in near:
            entry["near_write"] = True  # no CUDA graph region may hold it (deploy/packaging/graph_regions.py)
    return Plan(plan, builder.node_table, builder.nodes, weights, frozenset(bound) & frozenset(graph.data_sizes),
                writes_inputs)


def _dim_sources(graph: Graph) -> list[list]:
    """Where each dynamic dim is read from per call: [name, input position, axis], for the runtimes to pass to
    kernels (the input check has already made every place a dim appears agree)."""
    found: dict[str, list] = {}
    for position, v in enumerate(graph.inputs):
        for axis, d in enumerate(v.type.shape or () if v.type.is_tensor else ()):
            if isinstance(d, SymSize) and len(d.terms) == 1 and d.terms[0][0] == 1 and len(d.terms[0][1]) == 1:
                found.setdefault(d.terms[0][1][0], [d.terms[0][1][0], position, axis])
    return sorted(found.values())


def _read_weights(graph: Graph) -> dict[str, torch.Tensor]:
    """The weights the plan reads: one that a rewrite replaced (stored transposed for a oneDNN GEMM) or whose
    readers all fused away is not packaged."""
    read = readers(graph)
    used = {name for node in graph.walk() if node.op == "prim::Constant" and node.output.id in read
            for name in ([node.attrs[Attr.WEIGHT]] if Attr.WEIGHT in node.attrs else node.attrs.get(Attr.WEIGHTS, ()))}
    return {name: w for name, w in graph.weights.items() if name in used}


def _literals(graph: Graph) -> tuple[dict[int, list], list[dict]]:
    """(constants, weights and packed constants by value id as the references that replace them in the plan, the
    packed constants' entries in the order they are built)."""
    refs: dict[int, list] = {}
    packed: list[dict] = []
    for node in graph.walk():
        if node.attrs.get(AT_LOAD) and all(v.id in refs for v in node.inputs):
            entry = {"name": f"{node.output.name}_{len(packed)}", "op": node.op,
                     "args": [refs[v.id] for v in node.inputs]}
            if Attr.QUANTIZED_ENGINE in node.attrs:
                entry["engine"] = node.attrs[Attr.QUANTIZED_ENGINE]
            packed.append(entry)
            refs[node.output.id] = ["p", entry["name"]]
        elif node.op == "prim::Constant":
            out = node.output
            if Attr.WEIGHT in node.attrs:
                refs[out.id] = ["w", node.attrs[Attr.WEIGHT]]
            elif Attr.WEIGHTS in node.attrs:
                refs[out.id] = ["wl", node.attrs[Attr.WEIGHTS]]
            else:
                refs[out.id] = ["c", node.attrs.get(Attr.VALUE)]
    return refs, packed


class _PlanBuilder:
    def __init__(self, literals: dict[int, list], memory: Slots) -> None:
        self.literals = literals
        self.memory = memory
        self.node_table: list[dict[str, Any]] = []
        self.nodes: list[Node] = []
        self.made_by_kernels: set[int] = set()  # value ids that generated kernels write, dense row-major

    def ref(self, v: Value) -> list:
        return self.literals.get(v.id) or ["s", self.memory.slot[v.id]]

    def steps(self, block: Block) -> list[dict[str, Any]]:
        return [self.step(node) for node in block.nodes
                if node.op != "prim::Constant" and not (node.outputs and node.outputs[0].id in self.literals)]

    def block(self, block: Block) -> dict[str, Any]:
        return {
            "inputs": [self.memory.slot[v.id] for v in block.inputs],
            "steps": self.steps(block),
            "outputs": [self.ref(v) for v in block.outputs],
        }

    def step(self, node: Node) -> dict[str, Any]:
        index = len(self.node_table)
        self.nodes.append(node)
        if node.op == KERNEL_OP:
            return self.kernel_step(node, index)
        info = lookup(node.op, node.attrs.get(Attr.SCHEMA, ""))
        entry = {
            "op": node.op,
            "category": ("alias" if node.attrs.get(Attr.ATEN_VIEW) else
                         "host" if node.attrs.get(Attr.SCALAR_CARRIER) else
                         EXTERN if node.attrs.get(Attr.EXTERN) else info.category),
            "source": str(node.source) if node.source else "",
            "outputs": [f"%{v.name}" for v in node.outputs],
        }
        if Attr.NOT_LOWERED in node.attrs:
            entry["why"] = node.attrs[Attr.NOT_LOWERED]
        if node.attrs.get(Attr.UNREACHED):
            entry["unreached"] = True  # no observed run reached it: the report counts such fallbacks apart
        if Attr.FROM_OPS in node.attrs:
            entry["from_ops"] = node.attrs[Attr.FROM_OPS]  # the TorchScript nodes a rewrite made it from
        if node.attrs.get(Attr.SYNTHETIC):
            entry["synthetic"] = True  # made by jit2triton, not a TorchScript node: the report does not count it
        self.node_table.append(entry)
        step: dict[str, Any] = {
            "kind": lookup(node.op).control_flow or "call",
            "op": node.op,
            "args": [self.ref(v) for v in node.inputs],
            "outs": [self.memory.slot[v.id] for v in node.outputs],
            "node": index,
        }
        if Attr.SCHEMA in node.attrs:
            step["kwnames"] = _kwarg_only_names(node.attrs[Attr.SCHEMA])
            writes = writes_in_place(node.attrs[Attr.SCHEMA])
            if writes:
                step["mutates"] = writes  # a CUDA graph region must not hold it (deploy/packaging/graph_regions.py)
        if lookup(node.op).builds_container in ("list", "dict"):
            step["type"] = _type_tag(node.outputs[0].type)  # a runtime that types its containers needs it
        if node.blocks:
            step["blocks"] = [self.block(b) for b in node.blocks]
        if node.attrs.get(Attr.BINDS):  # sizes read from its outputs into the call's size table (bind_sizes.py)
            step["binds"] = [[name, index, axis] for index, axis, name in node.attrs[Attr.BINDS]]
        free = self.memory.free_after.get(id(node))
        if free:
            step["free"] = sorted(free)
        if node.op == "prim::RaiseException" and node.source:
            step["where"] = str(node.source)
        return step


    def kernel_step(self, node: Node, index: int) -> dict[str, Any]:
        kernel = node.attrs[Attr.KERNEL]
        self.node_table.append({
            "op": KERNEL_OP,
            "category": "kernel",
            "kernel": kernel.name,
            "fused": [{"op": n.op, "uid": n.uid, "source": str(n.source) if n.source else "",
                       **({"synthetic": True} if n.attrs.get(Attr.SYNTHETIC) else {})} for n in node.attrs[Attr.FUSED]],
            "outputs": [f"%{v.name}" for v in node.outputs],
        })
        # Inputs that ATen made are expected to have the strides seen while converting; the runtime checks them
        # and copies any that differ into that layout, so a kernel never reads memory it does not expect.
        # Their shapes are checked too: a scalar input can change the shape an ATen op returns (x.repeat(n, 1)),
        # and a kernel generated for another shape would read past the tensor; the runtime refuses instead.
        in_strides = [None if v.id in self.made_by_kernels or v.id in self.literals or b.by_value else
                      list(b.strides) for v, b in zip(node.inputs, kernel.inputs)]
        in_strides = [None if s is None else [size_json(n) for n in s] for s in in_strides]
        in_shapes = [None if strides is None else [size_json(n) for n in b.shape]
                     for strides, b in zip(in_strides, kernel.inputs)]
        self.made_by_kernels.update(v.id for v in node.outputs)
        step = {
            "kind": "kernel",
            "kernel": kernel.name,
            "args": [self.ref(v) for v in node.inputs],
            "in_strides": in_strides,
            "in_shapes": in_shapes,
            "outs": [self.memory.slot[v.id] for v in node.outputs],
            "out_types": [[[size_json(n) for n in b.shape], b.dtype, [size_json(n) for n in b.strides]]
                          for b in kernel.outputs],
            "node": index,
        }
        if kernel.size_names:
            step["sizes"] = list(kernel.size_names)  # the dynamic dims it takes (plan["dims"] says where they are)
        by_value = [i for i, b in enumerate(kernel.inputs) if b.by_value]
        if by_value:
            step["by_value"] = by_value  # the args that are host numbers, passed by value (as its kernel says)
        free = self.memory.free_after.get(id(node))
        if free:
            step["free"] = sorted(free)
        return step


def _type_tag(t: Type) -> list:
    """A value's TorchScript type as nested lists: List[Optional[Tensor]] -> ["List", ["Optional", ["Tensor"]]]."""
    return [t.kind, *(_type_tag(e) for e in t.elems)]


def _kwarg_only_names(schema: str) -> list[str]:
    return [a.name for a in torch._C.parse_schema(schema).arguments if a.kwarg_only]
