"""Shape and dtype inference from example inputs.

The plan is run once on the example inputs (see `jit2triton.api`), and every value it produces is observed here.
A value seen with different sizes across loop iterations gets a named symbol for that dim; a value never produced
(a branch not taken) keeps the type TorchScript gave it.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

from .ir import Graph, Node, Type, Value, tensor_type


class ShapeRecorder:
    """Collects observed runtime values per IR value, then writes the merged types into the graph."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.seen: dict[int, tuple[Value, Type]] = {}
        self.symbols = (f"s{i}" for i in itertools.count())

    def observe_values(self, values: list[Value], runtime_values) -> None:
        for value, obj in zip(values, runtime_values):
            observed = type_of(obj, value.type)
            known = self.seen.get(value.id)
            self.seen[value.id] = (value, observed if known is None else self.merge(known[1], observed))

    def __call__(self, node_index: int, outputs: tuple) -> None:
        self.observe_values(self.nodes[node_index].outputs, outputs)

    def merge(self, a: Type, b: Type) -> Type:
        if a == b or not (a.is_tensor and b.is_tensor) or a.shape is None or b.shape is None:
            return a
        if len(a.shape) != len(b.shape) or a.dtype != b.dtype:
            return Type("Tensor", a.dtype if a.dtype == b.dtype else None, None, a.device)
        dims = tuple(x if x == y else (x if isinstance(x, str) else next(self.symbols)) for x, y in zip(a.shape, b.shape))
        return Type("Tensor", a.dtype, dims, a.device, strides=a.strides if a.strides == b.strides else None)

    def annotate(self, graph: Graph) -> None:
        for value, observed in self.seen.values():
            value.type = observed


def type_of(obj: Any, declared: Type) -> Type:
    if isinstance(obj, torch.Tensor):
        return tensor_type(obj)
    if isinstance(obj, (list, tuple)) and declared.kind in ("List", "Tuple"):
        if declared.kind == "Tuple":
            elems = tuple(type_of(o, d) for o, d in zip(obj, declared.elems))
            return Type("Tuple", elems=elems)
        return declared
    return declared
