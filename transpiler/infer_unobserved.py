"""Types for the values the example run never produced (a branch not taken), from ATen's meta kernels.

Shape inference observes the plan running on the example inputs, so an `if` branch those inputs never took keeps
TorchScript's shapeless types, and nothing in it can fuse. Where every tensor input of such a node has a static
type and every other input is a constant, the op runs on meta tensors of those shapes, dtypes and strides: no
data, no device, just the output's dtype, shape and strides, which ATen's meta kernels compute as the real op
would. Nodes are visited in program order, so a chain of them inside the branch is typed link by link.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .ir import Attr, QUANTIZED_DTYPES, Graph, Node, Type, dtype_name, torch_dtype


def infer_unobserved(graph: Graph) -> int:
    """Types every unobserved tensor output it can; returns how many values it typed."""
    known: dict[int, Any] = {}  # value id -> a meta tensor or a constant standing for it
    for node in graph.walk():
        if node.op == "prim::Constant":
            if Attr.VALUE in node.attrs:
                known[node.output.id] = node.attrs[Attr.VALUE]
            elif Attr.WEIGHT in node.attrs and _static(node.output.type):
                known[node.output.id] = _meta(node.output.type)
    typed = 0
    for node in graph.walk():
        for v in node.inputs:
            if v.id not in known and _static(v.type):
                known[v.id] = _meta(v.type)
        if node.blocks or node.op == "prim::Constant" or Attr.SCHEMA not in node.attrs:
            continue
        tensors_out = [v for v in node.outputs if v.type.kind == "Tensor"]
        if not tensors_out or all(_static(v.type) for v in tensors_out) or any(v.id not in known for v in node.inputs):
            continue
        results = _run_on_meta(node, [known[v.id] for v in node.inputs])
        if results is None:
            continue
        for v, r in zip(node.outputs, results):
            if isinstance(r, torch.Tensor) and v.type.kind == "Tensor" and not _static(v.type):
                device = next((t.device for t in (u.type for u in node.inputs) if t.is_tensor and t.device), None)
                v.type = Type("Tensor", dtype_name(r.dtype), tuple(r.shape), device, strides=tuple(r.stride()))
                known[v.id] = r
                typed += 1
    return typed


def _static(t: Type) -> bool:
    """A tensor type a meta tensor can stand for (none of a quantized dtype: a meta tensor carries no quantizer)."""
    return (t.is_tensor and t.dtype is not None and t.dtype not in QUANTIZED_DTYPES and t.shape is not None
            and t.strides is not None and all(isinstance(d, int) for d in (*t.shape, *t.strides)))  # dynamic strides have no meta tensor


def _meta(t: Type) -> torch.Tensor:
    return torch.empty_strided(t.shape, t.strides, dtype=torch_dtype(t.dtype), device="meta")


def _run_on_meta(node: Node, args: list) -> Optional[tuple]:
    namespace, _, rest = node.op.partition("::")
    name, _, overload = rest.partition(".")
    try:
        fn = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
        schema = torch._C.parse_schema(node.attrs[Attr.SCHEMA])
        kwnames = [a.name for a in schema.arguments if a.kwarg_only]
        npos = len(args) - len(kwnames)
        args = [torch.device("meta") if isinstance(a, torch.device) else a for a in args]
        result = fn(*args[:npos], **dict(zip(kwnames, args[npos:])))
    except Exception:  # noqa: BLE001 - an op without a meta kernel, or arguments it refuses: leave the node untyped
        return None
    return tuple(result) if isinstance(result, (tuple, list)) else (result,)
