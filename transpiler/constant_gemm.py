"""GEMMs by a constant weight, as the GEMM rewrites (onednn_linear on the CPU, gemm_forms on CUDA) see them: a
`linear` whatever form the model wrote it in.

    linear(x, W, b)                   W stored [N, K]
    matmul(x, W), mm(x, W)            W stored [K, N]: linear's weight is its transpose
    addmm(b, x, W), beta = alpha = 1  the transformers Conv1D of GPT-2; b a constant vector

Constant means frozen: the same tensor on every call, so a rewrite may store it in another layout once.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .ir import Attr, Graph, Node, Type, Value
from .op_table import lookup


@dataclass
class ConstantGemm:
    x: Value
    weight: Value  # as the model holds it
    bias: Optional[Value]
    transposed: bool  # the weight is stored [K, N] (x @ W), linear's transpose


def constant_gemm(node: Node, weights: dict[int, str], literals: dict[int, object]) -> Optional[ConstantGemm]:
    """The GEMM `node` computes, when it is one by a constant 2-d weight of x's dtype; else None. (A linear's bias
    may be computed; addmm's must be a constant vector, as only then is it linear's bias.)"""
    inputs, form = node.inputs, lookup(node.op).gemm_form
    if form == "linear":
        x, w = inputs[0], inputs[1]
        bias = inputs[2] if len(inputs) > 2 and inputs[2].type.kind != "None" else None
        transposed = False
    elif form == "kn" and len(inputs) == 2:
        x, w, bias, transposed = inputs[0], inputs[1], None, True
    elif form == "addmm" and len(inputs) == 5 and all(
            literals.get(v.id, None) == 1 for v in inputs[3:]):
        bias, x, w, transposed = inputs[0], inputs[1], inputs[2], True
        if bias.id not in weights or bias.type.shape is None or len(bias.type.shape) != 1:
            return None
    else:
        return None
    dtype = x.type.dtype
    if (w.id not in weights or w.type.dtype != dtype
            or w.type.shape is None or len(w.type.shape) != 2 or x.type.shape is None or len(x.type.shape) < 2
            or (node.op == "aten::mm" and len(x.type.shape) != 2) or node.output.type.dtype != dtype
            or (bias is not None and bias.type.dtype != dtype)):
        return None
    return ConstantGemm(x, w, bias, transposed)


def features(gemm: ConstantGemm) -> int:
    """N: the GEMM's output features."""
    return gemm.weight.type.shape[1 if gemm.transposed else 0]


def transposed_weight(graph: Graph, weights: dict[int, str], weight: Value) -> tuple[Node, Value]:
    """A constant node for `weight`'s transpose, stored contiguous once per weight (a package holds only the
    weights its plan reads, so the original goes when nothing else reads it)."""
    name = f"{weights[weight.id]}.t"
    if name not in graph.weights:
        graph.weights[name] = graph.weights[weights[weight.id]].t().contiguous()
    t = graph.weights[name]
    value = Value(f"{weight.name}_t", Type("Tensor", weight.type.dtype, tuple(t.shape), weight.type.device,
                                           strides=tuple(t.stride())))
    return Node("prim::Constant", [], [value], attrs={Attr.WEIGHT: name}), value

