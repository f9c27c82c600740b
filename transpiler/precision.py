"""Reduced precision: rewrite a typed float32 graph to compute in float16 or bfloat16, by rule.

Every float32 value of the model becomes a value of the reduced type, but where a node runs in float32: an op whose
table entry says it keeps float32 (`OpInfo.keeps_fp32`: softmax, norms' statistics, large sums, exp/log/pow), or a
node that accuracy enforcement moved back (`PrecisionPlan.keep`, by the node's position). Casts go on the edges
between the two: a float32 node reads its inputs upcast and its outputs stay float32 until a reduced node reads
them (downcast there, so a sum that is large stays large up to the node that makes it small again). Weights are
stored in the reduced type unless only float32 nodes read them; dtype arguments (`x.to(torch.float32)`, `dtype=`)
name the reduced type in reduced nodes. The graph's inputs and outputs keep the model's dtypes: the casts sit at
the boundary. Inside generated kernels both renderers already load float16/bfloat16 as float32, compute in float32
and round when they store, so what this pass decides is the type of every tensor that crosses a kernel boundary
or an ATen op.

The pass runs on a typed graph (after `observe`) and leaves types stale: the pipeline observes again after it.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import Optional

import torch

from .ir import Attr, Block, Graph, Node, Type, Value, literals, readers
from .op_table import lookup, schema_of

PRECISIONS = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}
SCALAR_TYPE = {"float32": 6, "float16": 5, "bfloat16": 15}  # c10::ScalarType codes, as TorchScript passes dtypes


@dataclass
class PrecisionPlan:
    dtype: str  # "float16" or "bfloat16"
    keep: dict[int, str] = field(default_factory=dict)  # node position -> why accuracy keeps it in float32
    io_reduced: bool = False  # the package takes and gives the model's float32 inputs and outputs in `dtype`
    # filled by the pass: the float32 nodes (position, op, source, why) and the positions that could move back
    fp32_nodes: list[dict] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)


def reduce_precision(graph: Graph, plan: PrecisionPlan) -> Graph:
    """Rewrite `graph` (typed, float32) to compute in `plan.dtype` but where float32 is kept (see the module)."""
    rewrite = _Rewrite(graph, plan)
    if plan.io_reduced:  # they arrive in the reduced type (the pipeline observes again with such inputs)
        rewrite.current.update((v.id, plan.dtype) for v in graph.inputs if rewrite.is_float(v) and v.type.is_tensor)
    rewrite.weights()
    rewrite.block(graph.body, boundary=True)
    return graph


class _Rewrite:
    def __init__(self, graph: Graph, plan: PrecisionPlan) -> None:
        self.graph, self.plan, self.reduced = graph, plan, plan.dtype
        self.boundary = plan.dtype if plan.io_reduced else "float32"  # what the graph's float32 outputs leave as
        self.position = {node.uid: i for i, node in enumerate(graph.walk())}
        self.observed = {v.id: v.type for node in graph.walk() for v in node.outputs} | \
            {v.id: v.type for v in graph.inputs} | \
            {v.id: v.type for node in graph.walk() for b in node.blocks for v in b.inputs}
        self.current: dict[int, str] = {}  # float32 value id -> the dtype it has after the rewrite
        self.casts: dict[tuple[int, int, str], Value] = {}  # (block, value, dtype) -> the cast made in that block
        self.constants: dict[object, Value] = {}
        self.literals = literals(graph)
        self.readers = readers(graph)
        plan.fp32_nodes.clear()
        plan.candidates.clear()

    # --- what a node runs in --------------------------------------------------------------------------------

    def why_fp32(self, node: Node) -> str:
        rule = lookup(node.op).keeps_fp32
        if rule and not self.is_attention_softmax(node):
            return f"rule: {rule}"
        beyond = self.constant_beyond_range(node)
        if beyond is not None:
            return f"rule: a constant ({beyond:g}) beyond {self.reduced}'s range"
        return self.plan.keep.get(self.position[node.uid], "")

    def constant_beyond_range(self, node: Node) -> Optional[float]:
        """A float constant the node takes that the reduced type cannot hold (transformers masks with
        `torch.finfo(torch.float32).min`): ATen refuses to convert it, so the node stays float32."""
        limit = torch.finfo(getattr(torch, self.reduced)).max
        for v in node.inputs:
            value = self.literals.get(v.id)
            if isinstance(value, float) and math.isfinite(value) and abs(value) > limit:
                return value
        return None

    def is_attention_softmax(self, node: Node) -> bool:
        """A softmax whose probabilities only matmuls read: attention, which fuse_attention makes one fused kernel
        that computes the softmax in float32 itself (and which a cast between the two would hide from it)."""
        found = self.readers.get(node.outputs[0].id, [None])
        return node.op == "aten::softmax.int" and all(r is not None and lookup(r.op).batched_matmul for r in found)

    def is_float(self, v: Value) -> bool:
        t = self.observed.get(v.id)
        return t is not None and _holds_float32(t)

    # --- the rewrite ----------------------------------------------------------------------------------------

    def weights(self) -> None:
        """Store float32 weights in the reduced type, unless only float32 nodes read them."""
        for node in self.graph.walk():
            name = node.attrs.get(Attr.WEIGHT) if node.op == "prim::Constant" else None
            tensor = self.graph.weights.get(name) if name else None
            if tensor is None or str(tensor.dtype) != "torch.float32":
                continue
            read_by = self.readers.get(node.output.id, [])
            if read_by and all(r is not None and self.why_fp32(r) for r in read_by):
                continue
            self.graph.weights[name] = tensor.to(getattr(torch, self.reduced))
            node.outputs[0].type = replace(node.output.type, dtype=self.reduced)  # (observe types no constant)
            self.current[node.output.id] = self.reduced

    def block(self, block: Block, boundary: bool = False, mode: Optional[str] = None) -> None:
        """Rewrite `block`'s nodes; its outputs leave in the model's dtypes (`boundary`, the graph's) or in `mode`."""
        nodes, block.nodes = block.nodes, []
        for node in nodes:
            if node.op == "prim::Constant":
                block.nodes.append(node)
            elif node.blocks:
                self.control_flow(node, block)
            else:
                self.compute(node, block, boundary and self._makes_output(node))
        outputs_need = self.boundary if boundary else (mode or self.reduced)
        block.outputs[:] = [self.cast(v, outputs_need, block) for v in block.outputs]

    def _makes_output(self, node: Node) -> bool:
        """A container the graph returns: its tensors are outputs, which keep the model's dtype."""
        return bool(lookup(node.op).builds_container) and any(v in self.graph.outputs for v in node.outputs)

    def compute(self, node: Node, block: Block, output_container: bool) -> None:
        why = "output" if output_container else self.why_fp32(node)
        mode = self.boundary if output_container else "float32" if why else self.reduced
        if not why and not node.op.startswith("prim::") and any(self.is_float(v) for v in node.outputs):
            self.plan.candidates.append(self.position[node.uid])
        if why and why != "output" and any(self.is_float(v) for v in node.outputs):
            self.plan.fp32_nodes.append({"position": self.position[node.uid], "op": node.op,
                                         "source": str(node.source) if node.source else "", "why": why})
        carries = self.read_inputs(node, block, mode)
        for v in node.outputs:
            if self.is_float(v):
                self.current[v.id] = mode if carries else "float32"
        block.nodes.append(node)

    def read_inputs(self, node: Node, block: Block, mode: str) -> bool:
        """Cast `node`'s float inputs to `mode` and name `mode` in its dtype arguments; whether any of them carries
        floats of `mode` into the node (then its float outputs are of `mode` too)."""
        carries = False
        scalar_types = _scalar_type_positions(node.op) if mode != "float32" else ()
        for i, v in enumerate(node.inputs):
            if self.is_float(v):
                node.inputs[i] = self.cast(v, mode, block)
                carries = True
            elif i in scalar_types and self.literals.get(v.id) == SCALAR_TYPE["float32"]:
                node.inputs[i] = self.constant(SCALAR_TYPE[mode], "int")
                carries = True
        return carries

    def control_flow(self, node: Node, block: Block) -> None:
        """prim::If and prim::Loop run in the reduced type: what enters and leaves their blocks is cast to it."""
        self.read_inputs(node, block, self.reduced)
        for sub in node.blocks:
            for v in sub.inputs:
                if self.is_float(v):
                    self.current[v.id] = self.reduced
            self.block(sub, mode=self.reduced)
        for v in node.outputs:
            if self.is_float(v):
                self.current[v.id] = self.reduced
        block.nodes.append(node)

    # --- casts and constants ----------------------------------------------------------------------------------

    def cast(self, v: Value, dtype: str, block: Block) -> Value:
        """`v` as `dtype`: itself when it is already, else one cast per block (tensors only: a list of tensors
        keeps what its maker gave it)."""
        if not self.is_float(v) or not self.observed[v.id].is_tensor or self.current.get(v.id, "float32") == dtype:
            return v
        key = (id(block), v.id, dtype)
        if key not in self.casts:
            made = Value(f"{v.name}_{_SHORT[dtype]}", Type("Tensor"))
            block.nodes.append(Node("aten::to.dtype", [v, self.constant(SCALAR_TYPE[dtype], "int"),
                                                       self.constant(False, "bool"), self.constant(False, "bool"),
                                                       self.constant(None, "None")], [made]))
            self.observed[made.id] = Type("Tensor", "float32")
            self.current[made.id] = dtype
            self.casts[key] = made
        return self.casts[key]

    def constant(self, value, kind: str) -> Value:
        key = (kind, value)
        if key not in self.constants:
            made = Value(f"c_{kind}_{value}".lower(), Type(kind))
            self.graph.body.nodes.insert(0, Node("prim::Constant", [], [made], {Attr.VALUE: value}))
            self.constants[key] = made
        return self.constants[key]


_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


def cast_floats(value, source: str, target: str):
    """`value` (a tensor, or a tuple, list or dict of them) with its `source`-dtype tensors cast to `target`."""
    if isinstance(value, torch.Tensor):
        return value.to(getattr(torch, target)) if value.dtype == getattr(torch, source) else value
    if isinstance(value, (tuple, list)):
        return type(value)(cast_floats(v, source, target) for v in value)
    if isinstance(value, dict):
        return {k: cast_floats(v, source, target) for k, v in value.items()}
    return value


def _holds_float32(t: Type) -> bool:
    """A float32 tensor, or a container of them (a list a cat reads)."""
    if t.is_tensor:
        return t.dtype == "float32"
    return any(_holds_float32(e) for e in t.elems)


@functools.lru_cache(maxsize=None)
def _scalar_type_positions(op: str) -> tuple[int, ...]:
    """The positions of an op's dtype arguments (`ScalarType dtype`, `ScalarType? dtype`), by its schema."""
    schema = schema_of(op)
    if not schema:
        return ()
    return tuple(i for i, a in enumerate(torch._C.parse_schema(schema).arguments) if "ScalarType" in str(a.real_type))
