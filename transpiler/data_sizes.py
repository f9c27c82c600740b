"""Sizes computed from data: every value that flows from an op whose output size depends on its inputs' values
(boolean-mask indexing, nonzero, unique, NMS), or from an input that is a list or dict of numbers (split sizes),
gets opaque sizes, and no number read from such a value is folded into a constant.

Shape inference runs the model on other values at the example's shapes, so a count usually varies and becomes
opaque on its own; but a count can come out the same in every run (`argsort(...)[:50]` over more than 50
candidates, a threshold every draw passes), and a kernel fitted to it would refuse the first input where it
differs. Opaque sizes keep those ops on ATen, which takes any size; a size mistaken for data-dependent (a box's 4
coordinates) costs only a kernel, never a wrong answer.
"""
from __future__ import annotations

import itertools

import torch

from .infer_shapes import ShapeRecorder
from .ir import Attr, Graph, Node, Type
from .op_table import lookup, schema_of, writes_in_place

_symbols = (f"u{i}" for i in itertools.count())  # opaque, like shape inference's own: only their identity matters


def mark_data_dependent(graph: Graph, recorder: ShapeRecorder) -> set[int]:
    """Give every value computed from a data-dependent size opaque sizes; -> the ids of those values."""
    tainted: set[int] = {v.id for v in graph.inputs if _numbers_container(v.type)}
    producers = {v.id: node for node in graph.walk() for v in node.outputs}
    weights = graph.weights
    changed = True
    while changed:  # a loop carries a value back to its start: go round until nothing new is found
        changed = False
        for node in graph.walk():
            if _spreads(node, tainted, producers, weights):
                for value in _written(node):
                    if value.id not in tainted:
                        tainted.add(value.id)
                        changed = True
            for block in node.blocks:  # block inputs: a loop's carried values are its inputs and its body's outputs
                carried = list(zip(block.inputs[1:], node.inputs[2:], block.outputs[1:])) if node.op == "prim::Loop" \
                    else []
                for inner, initial, result in carried:
                    if inner.id not in tainted and (initial.id in tainted or result.id in tainted):
                        tainted.add(inner.id)
                        changed = True
            if lookup(node.op).control_flow:
                for i, out in enumerate(node.outputs):
                    offset = 0 if node.op == "prim::If" else 1
                    if out.id not in tainted and any(b.outputs[i + offset].id in tainted for b in node.blocks):
                        tainted.add(out.id)
                        changed = True
    values = {v.id: v for node in graph.walk() for v in node.outputs} | {
        v.id: v for node in graph.walk() for b in node.blocks for v in b.inputs}
    for value_id in tainted:
        value = values.get(value_id)
        if value is None:
            continue
        recorder.varying.add(value_id)  # a number read from it is not a constant
        value.type = _opaque(value.type)
    return tainted


def _numbers_container(t: Type) -> bool:
    """A list, tuple or dict input of numbers (`splits: List[int]`, lengths, a config dict): sizes computed from
    its values or its length (a split into len(splits) parts, stacked) are set by each call's values, which value
    draws cannot vary as they vary an int (a list's items must fit the tensor they split), so they count as data."""
    if t.kind not in ("List", "Tuple", "Dict"):
        return False
    inner = list(t.elems)
    while inner:
        e = inner.pop()
        if e.kind in ("Tensor", "Any") or e.kind.startswith("__torch__"):
            return False
        inner += e.elems
    return True


def _spreads(node: Node, tainted: set[int], producers: dict, weights: dict) -> bool:
    """Whether the node's outputs (and what it writes in place) carry a data-dependent size."""
    if any(v.id in tainted for v in node.inputs):
        return True
    kind = lookup(node.op).data_dependent_size
    if kind != "tensor":
        return False
    if node.op == "aten::index.Tensor":  # only a boolean mask's count is data; integer indices give their own size
        indices = producers.get(node.inputs[1].id) if len(node.inputs) > 1 else None
        if indices is not None and Attr.WEIGHTS in indices.attrs:  # a frozen list of constant indices
            return any(weights[name].dtype in (torch.bool, torch.uint8) for name in indices.attrs[Attr.WEIGHTS])
        listed = indices.inputs if indices is not None and indices.op == "prim::ListConstruct" else []
        return not listed or any(v.type.dtype in ("bool", "uint8") or v.type.dtype is None for v in listed
                                 if v.type.is_tensor)
    return True


def _written(node: Node) -> list:
    """The node's outputs, and its first input where it writes that in place (a list it appends to)."""
    outs = list(node.outputs)
    if node.inputs and writes_in_place(schema_of(node.op)):
        outs.append(node.inputs[0])
    return outs


def _opaque(t: Type) -> Type:
    if t.is_tensor and t.shape is not None:
        return Type("Tensor", t.dtype, tuple(next(_symbols) for _ in t.shape), t.device)
    if t.elems:
        return Type(t.kind, t.dtype, t.shape, t.device, elems=tuple(_opaque(e) for e in t.elems))
    return t
