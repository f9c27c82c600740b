"""Specialise shape arithmetic to constants: the package's input shapes are fixed, so is everything computed from
them (`x.size(0)`, `n // heads`, the lists passed to `view`).

Traced models carry such arithmetic as `aten::size -> prim::NumToTensor -> aten::floor_divide -> aten::Int`; once
folded, the views that read it have literal shapes and can be lowered into kernels. A node is folded only when
every input is itself constant (or, for shape readers, a tensor of static shape), its value never changed while
the plan ran on the example inputs, and it is a pure function: host bookkeeping, or math on 0-d tensors.
"""
from __future__ import annotations

from typing import Any

import torch

from .infer_shapes import ShapeRecorder
from .ir import Block, Graph, Node, literals
from .op_table import HOST, POINTWISE, lookup

SHAPE_READERS = {"aten::size", "aten::size.int", "aten::dim", "aten::numel", "prim::dtype", "prim::device",
                 "aten::len.Tensor", "prim::shape"}
_UNPACKS = ("prim::ListUnpack", "prim::TupleUnpack")
_IMPURE = ("rand", "normal", "bernoulli", "dropout", "uniform", "multinomial", "randperm", "empty")


def fold_shapes(graph: Graph, recorder: ShapeRecorder) -> Graph:
    mutated = {n.inputs[0].id for n in graph.walk() if n.inputs and "!" in n.attrs.get("schema", "").split("->")[0]}
    folder = _Folder(graph, recorder, mutated)
    folder.block(graph.body)
    return graph


class _Folder:
    def __init__(self, graph: Graph, recorder: ShapeRecorder, mutated: set[int]) -> None:
        self.graph, self.recorder, self.mutated = graph, recorder, mutated
        self.constant: set[int] = {n.output.id for n in graph.walk() if n.op == "prim::Constant"}
        self.literals = literals(graph)
        self.folded: dict[int, Any] = {}  # value id -> the literal this pass folded it to

    def block(self, block: Block) -> None:
        out: list[Node] = []
        for node in block.nodes:
            for sub in node.blocks:
                self.block(sub)
            if node.op in _UNPACKS and self.literal_items(node):  # `B, H, W, C = x.shape` once x.shape is folded
                out += [self.item_node(node, v, item) for v, item in zip(node.outputs, self.literal_items(node))]
                continue
            if node.blocks or node.op == "prim::Constant" or not self.foldable(node):
                out.append(node)
                continue
            seen, value = self.recorder.constant_value(node.output)
            out.append(self.constant_node(node, value) if seen else node)
        block.nodes = out

    def literal_items(self, node: Node) -> list:
        """The items of an unpacked list or tuple that is a literal of as many numbers as the node has outputs."""
        source = node.inputs[0]
        value = self.folded.get(source.id, self.literals.get(source.id))
        if source.id not in self.constant or not isinstance(value, (list, tuple)) or len(value) != len(node.outputs):
            return []
        return list(value) if all(isinstance(item, (int, float, bool)) for item in value) else []

    def item_node(self, node: Node, out, value: Any) -> Node:
        self.constant.add(out.id)
        self.folded[out.id] = value
        return Node("prim::Constant", [], [out], source=node.source,
                    attrs={"value": value, "folded_from": node.op})

    def foldable(self, node: Node) -> bool:
        if len(node.outputs) != 1 or node.output.id in self.mutated or any(s in node.op for s in _IMPURE):
            return False
        if "!" in node.attrs.get("schema", "").split("->")[0]:
            return False
        if node.op in SHAPE_READERS:
            t = node.inputs[0].type
            if not all(v.id in self.constant for v in node.inputs[1:]):
                return False
            if node.op in ("aten::size.int", "prim::dtype", "prim::device", "aten::dim"):
                # one dim's size (a static dim of a tensor whose batch is dynamic), or what no dim changes
                return t.is_tensor and t.shape is not None and (node.op != "aten::size.int"
                                                                or self.static_dim(node, t.shape))
            return t.is_tensor and t.shape is not None and all(isinstance(d, int) for d in t.shape)
        category = lookup(node.op, node.attrs.get("schema", "")).category
        scalar_math = category == POINTWISE and node.output.type.is_tensor and node.output.type.shape == ()
        if category != HOST and not scalar_math:
            return False
        return all(v.id in self.constant for v in node.inputs)

    def static_dim(self, node: Node, shape: tuple) -> bool:
        dim = self.literals.get(node.inputs[1].id)
        return isinstance(dim, int) and -len(shape) <= dim < len(shape) and isinstance(shape[dim], int)

    def constant_node(self, node: Node, value: Any) -> Node:
        out = node.output
        self.constant.add(out.id)
        folded = Node("prim::Constant", [], [out], source=node.source, uid=node.uid)
        if isinstance(value, torch.Tensor):
            name = f"folded_{out.name}"
            self.graph.weights[name] = value.detach().clone()
            folded.attrs["weight"] = name
        else:
            folded.attrs["value"] = value
            self.folded[out.id] = value
        folded.attrs["folded_from"] = node.op
        return folded
