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
from .ir import Attr, Block, Graph, Node, literals, walk_block
from .op_table import HOST, POINTWISE, lookup


def fold_shapes(graph: Graph, recorder: ShapeRecorder) -> Graph:
    mutated = {n.inputs[0].id for n in graph.walk() if n.inputs and "!" in n.attrs.get(Attr.SCHEMA, "").split("->")[0]}
    folder = _Folder(graph, recorder, mutated, _value_dependent(graph))
    folder.block(graph.body)
    folder.rename_reads()
    return graph


class _Folder:
    def __init__(self, graph: Graph, recorder: ShapeRecorder, mutated: set[int], value_dependent: set[int]) -> None:
        self.graph, self.recorder, self.mutated = graph, recorder, mutated
        self.value_dependent = value_dependent
        self.graph_inputs = {v.id for v in graph.inputs}
        self.constant: set[int] = {n.output.id for n in graph.walk() if n.op == "prim::Constant"}
        self.literals = literals(graph)
        self.folded: dict[int, Any] = {}  # value id -> the literal this pass folded it to
        self.renamed: dict[int, Any] = {}  # an output of a branch folded away -> the value its taken block gave

    def block(self, block: Block) -> None:
        out: list[Node] = []
        for node in block.nodes:
            for sub in node.blocks:
                self.block(sub)
            if node.op == "prim::If" and isinstance(self.literal_of(node.inputs[0]), bool):
                taken = node.blocks[0 if self.literal_of(node.inputs[0]) else 1]  # a condition on sizes: the
                out += taken.nodes  # other branch can never run in this package
                self.renamed.update({v.id: b for v, b in zip(node.outputs, taken.outputs)})
                continue
            if node.op == "prim::Loop" and self.host_loop_folds(node):  # F.group_norm's size check, per call
                out += [self.item_node(node, v, self.recorder.constant_value(v)[1]) for v in node.outputs]
                continue
            if lookup(node.op).unpacks and self.literal_items(node):  # `B, H, W, C = x.shape` once x.shape is folded
                out += [self.item_node(node, v, item) for v, item in zip(node.outputs, self.literal_items(node))]
                continue
            if node.blocks or node.op == "prim::Constant" or not self.foldable(node):
                out.append(node)
                continue
            seen, value = self.recorder.constant_value(node.output)
            out.append(self.constant_node(node, value) if seen else node)
        block.nodes = out

    def literal_of(self, v) -> Any:
        return self.folded.get(v.id, self.literals.get(v.id)) if v.id in self.constant else None

    def rename_reads(self) -> None:
        """Reads of a folded branch's outputs read what its taken block gave them."""
        def final(v):
            while v.id in self.renamed:
                v = self.renamed[v.id]
            return v

        if not self.renamed:
            return
        for node in self.graph.walk():
            node.inputs = [final(v) for v in node.inputs]
            for sub in node.blocks:
                sub.outputs[:] = [final(v) for v in sub.outputs]
        self.graph.body.outputs[:] = [final(v) for v in self.graph.body.outputs]

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
                    attrs={Attr.VALUE: value, Attr.FOLDED_FROM: node.op})

    def host_loop_folds(self, node: Node) -> bool:
        """A loop of host arithmetic over fixed numbers (a product of sizes): it computes the same every call."""
        body = [n for sub in node.blocks for n in walk_block(sub)]
        return (all(self.fixed(v) for v in node.inputs)
                and all(lookup(n.op, n.attrs.get(Attr.SCHEMA, "")).category == HOST and not n.blocks
                        and "!" not in n.attrs.get(Attr.SCHEMA, "").split("->")[0]
                        and not any(v.type.is_tensor for v in n.outputs) for n in body)
                and all(self.recorder.constant_value(v)[0] for v in node.outputs))

    def fixed(self, v) -> bool:
        return v.id in self.constant or (not v.type.is_tensor and v.id not in self.value_dependent)

    def foldable(self, node: Node) -> bool:
        info = lookup(node.op, node.attrs.get(Attr.SCHEMA, ""))
        if len(node.outputs) != 1 or node.output.id in self.mutated or info.impure:
            return False
        if "!" in node.attrs.get(Attr.SCHEMA, "").split("->")[0]:
            return False
        if info.reads_shape:
            t = node.inputs[0].type
            if not all(v.id in self.constant for v in node.inputs[1:]):
                return False
            if info.reads_shape != "sizes":
                # one dim's size (a static dim of a tensor whose batch is dynamic), or what no dim changes
                return t.is_tensor and t.shape is not None and (info.reads_shape != "size"
                                                                or self.static_dim(node, t.shape))
            return t.is_tensor and t.shape is not None and all(isinstance(d, int) for d in t.shape)
        if info.none_test:  # `residual is not None` of a value an op made: a tensor, never None
            made = node.inputs[0].id not in self.graph_inputs and node.inputs[0].id not in self.value_dependent
            return made and all(self.fixed(v) for v in node.inputs[1:])
        category = info.category
        scalar_math = category == POINTWISE and node.output.type.is_tensor and node.output.type.shape == ()
        if category != HOST and not scalar_math:
            return False
        # a host number made only from shapes and constants is fixed too, even read out of a list the model
        # changed (Swin's `shift = self.shift.copy(); shift[0] = 0` under a condition on sizes)
        return all(v.id in self.constant or (category == HOST and not v.type.is_tensor
                                             and v.id not in self.value_dependent) for v in node.inputs)

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
            folded.attrs[Attr.WEIGHT] = name
        else:
            folded.attrs[Attr.VALUE] = value
            self.folded[out.id] = value
        folded.attrs[Attr.FOLDED_FROM] = node.op
        return folded


def _value_dependent(graph: Graph) -> set[int]:
    """The ids of host values that may differ between calls: the model's non-tensor inputs, numbers read out of
    tensors (`item`, `int(t)`), random draws, sizes of dims that are not fixed (_Sizes), and whatever is computed
    from them, written into a list by them, or decided under a condition on them."""
    tainted = {v.id for v in graph.inputs if not v.type.is_tensor}
    sizes = _Sizes(literals(graph))
    changed = True
    while changed:  # a loop carries values back to its start, and a list written late taints earlier reads
        before = len(tainted)
        _taint_block(graph.body, tainted, under_taint=False, sizes=sizes)
        changed = len(tainted) != before
    return tainted


class _Sizes:
    """Which size reads give a number that can change between calls: a dim that is not an int in the IR (a dynamic
    dim, a size the state or the data sets) may take values no observed run had, so a condition on it that every run
    answered alike (`if cache.size(0) > 20`, first true on the seventh call) must stay a condition."""

    def __init__(self, literal: dict) -> None:
        self.literal = literal
        self.lists: dict[int, tuple] = {}  # an `aten::size(t)` list's id -> t's IR shape

    def varying(self, node: Node, kind: str) -> bool:
        t = node.inputs[0].type if node.inputs else None
        shape = t.shape if t is not None and t.is_tensor else None
        if kind == "meta":  # rank, dtype, device: no dim changes them
            return False
        if kind == "size":
            dim = self.literal.get(node.inputs[1].id) if len(node.inputs) > 1 else None
            return not (shape is not None and isinstance(dim, int) and -len(shape) <= dim < len(shape)
                        and isinstance(shape[dim], int))
        if node.op == "aten::size" and shape is not None:
            self.lists[node.output.id] = shape
        return shape is None or not all(isinstance(d, int) for d in shape)

    def static_item(self, node: Node) -> bool:
        """`x.shape[i]` of a dim that is an int, read out of a list of sizes some of which vary."""
        if node.op != "aten::__getitem__.t" or node.inputs[0].id not in self.lists:
            return False
        shape, index = self.lists[node.inputs[0].id], self.literal.get(node.inputs[1].id)
        return isinstance(index, int) and -len(shape) <= index < len(shape) and isinstance(shape[index], int)


def _taint_block(block: Block, tainted: set[int], under_taint: bool, sizes: _Sizes) -> None:
    for node in block.nodes:
        info = lookup(node.op, node.attrs.get(Attr.SCHEMA, ""))
        source = info.data_dependent_size or info.impure or info.reads_values or (
            info.reads_shape and sizes.varying(node, info.reads_shape))
        dirty = under_taint or source or (
            any(v.id in tainted for v in node.inputs if not v.type.is_tensor) and not sizes.static_item(node))
        if dirty:
            tainted.update(v.id for v in node.outputs)
            if node.inputs and "!" in node.attrs.get(Attr.SCHEMA, "").split("->")[0]:
                tainted.add(node.inputs[0].id)  # a list written with such a value, or under such a condition
        for sub in node.blocks:
            _taint_block(sub, tainted, dirty, sizes)
            if any(v.id in tainted for v in sub.outputs):
                tainted.update(v.id for v in node.outputs)
