"""On CUDA, a group or layer norm over few rows of huge extent computes its statistics in parallel pieces.

A generated norm kernel gives each normalized row one program: mean, variance and the normalized row in one pass
over it. With few rows that leaves the GPU idle: ConvTasNet's global layer norm (`GroupNorm(1, 512)` over 2 x 512 x
~4000 values) is two rows of two million, two programs on a 132-SM GPU, 775 us a call (ATen's is 433 us, for the
same reason), 47 of them in a call. Each such norm is written instead as

    xg = x.reshape(N, G, S, E // S)                  # each row in S pieces (a layer norm: (rows, S, E // S))
    mean = sum(sum(xg, -1), -2) / E                  # partial sums by N*G*S programs, then S of them per row
    d = xg - mean
    inv = rsqrt(sum(sum(d * d, -1), -2) / E + eps)   # two passes: the variance of the deviations, as exact as ATen's
    y = (d * inv).reshape(x.shape) * weight + bias   # pointwise: every program busy, fusing with what follows

with the partial sums and the two statistics stored (`attrs["store"]`: fusion writes them out instead of inlining
them into the kernels that read them, where each program would recompute them). Three reads of the input instead of
one, all at full parallelism. Through ATen those pieces are a dozen launches where the norm was one: where they do
not all reach kernels, fusion puts the norm back, and it runs through ATen (decompositions.py).

Only float32 norms over static shapes are rewritten; on the CPU, where a row per thread already fills the cores,
nothing is (MODE says so; tests force it).
"""
from __future__ import annotations

import math
from typing import Any, Optional

from .decompositions import constant_nodes, decomposition
from .ir import Attr, Graph, Node, Type, Value, blocks, literals as literals_of
from .op_table import is_view, schema_of

MODE = "auto"  # "auto": on CUDA only; "always" (tests); "never"
MAX_ROWS = 128  # fewer rows than this leaves SMs idle...
MIN_EXTENT = 1 << 15  # ... when each row is at least this long
TARGET_PIECES = 1024  # rows x pieces: enough programs to fill a GPU
MIN_PIECE = 512  # elements per piece, at least


def split_norms(graph: Graph, device_type: str) -> int:
    """Rewrite in place; returns how many norms were split."""
    if MODE == "never" or (MODE == "auto" and device_type != "cuda"):
        return 0
    constants, constant_producers = literals_of(graph), constant_nodes(graph)
    count = 0
    for block in blocks(graph):
        out: list[Node] = []
        for node in block.nodes:
            plan = _plan(node, constants)
            if plan is None:
                out.append(node)
                continue
            pieces = _rewrite(node, *plan)
            out += decomposition(node, "split_norms", constant_producers).mark(
                pieces, [n for n in pieces if n.op != "prim::Constant" and not is_view(n.op)])
            count += 1
        block.nodes = out
    return count


def _plan(node: Node, constants: dict[int, Any]) -> Optional[tuple]:
    """(rows, extent, pieces, weight, bias, eps, groups) for a norm worth splitting, else None."""
    if node.op == "aten::group_norm":
        groups = constants.get(node.inputs[1].id)
        x, weight, bias, eps = node.inputs[0], node.inputs[2], node.inputs[3], constants.get(node.inputs[4].id)
        shape = x.type.shape
        if not isinstance(groups, int) or not shape or len(shape) < 2 or not all(isinstance(n, int) for n in shape) \
                or groups <= 0 or shape[1] % groups:
            return None
        rows, extent = shape[0] * groups, math.prod(shape[1:]) // groups
    elif node.op == "aten::layer_norm":
        normalized = constants.get(node.inputs[1].id)
        x, weight, bias, eps = node.inputs[0], node.inputs[2], node.inputs[3], constants.get(node.inputs[4].id)
        shape, groups = x.type.shape, None
        if not isinstance(normalized, list) or not shape or not all(isinstance(n, int) for n in shape) \
                or len(normalized) > len(shape) or list(shape[len(shape) - len(normalized):]) != normalized:
            return None
        extent = math.prod(normalized)
        rows = math.prod(shape) // extent if extent else 0
    else:
        return None
    if x.type.dtype != "float32" or not isinstance(eps, (int, float)) or not rows or rows >= MAX_ROWS \
            or extent < MIN_EXTENT:
        return None
    pieces = 1
    while rows * pieces < TARGET_PIECES and extent % (pieces * 2) == 0 and extent // (pieces * 2) >= MIN_PIECE:
        pieces *= 2
    if pieces < 4:  # an extent without such factors: the norm stays as it is
        return None
    return rows, extent, pieces, weight, bias, float(eps), groups


def _rewrite(node: Node, rows: int, extent: int, pieces: int, weight: Value, bias: Value, eps: float,
             groups: Optional[int]) -> list[Node]:
    x, result = node.inputs[0], node.output
    shape, device = list(x.type.shape), x.type.device
    nodes: list[Node] = []

    def constant(name: str, value: Any, kind: str) -> Value:
        v = Value(f"{result.name}_{name}", Type(kind))
        nodes.append(Node("prim::Constant", [], [v], attrs={Attr.VALUE: value}))
        return v

    def op(name: str, args: list[Value], label: str, store: bool = False, out: Optional[Value] = None) -> Value:
        v = out or Value(f"{result.name}_{label}", Type("Tensor", "float32", None, device))
        attrs = {Attr.SCHEMA: schema_of(name), Attr.SYNTHETIC: True, Attr.FROM_OPS: [node.op]}
        if store:
            attrs[Attr.STORE] = True
        nodes.append(Node(name, args, [v], source=node.source, attrs=attrs))
        return v

    def summed(v: Value, dim: int, label: str, store: bool = False) -> Value:
        return op("aten::sum.dim_IntList", [v, constant(f"{label}_dims", [dim], "int[]"),
                                            constant(f"{label}_keep", True, "bool"),
                                            constant(f"{label}_dtype", None, "None")], label, store=store)

    def statistic(v: Value, label: str) -> Value:
        """sum(sum(v, -1), -2) / extent: the partial sums (stored), then each row's S of them."""
        total = summed(summed(v, -1, f"{label}_pieces", store=True), -2, f"{label}_total")
        return op("aten::div.Scalar", [total, constant(f"{label}_count", extent, "int")], label)

    leading = [shape[0], groups] if groups is not None else [rows]
    one = constant("one", 1, "int")
    xg = op("aten::reshape", [x, constant("pieces_shape", leading + [pieces, extent // pieces], "int[]")], "pieces")
    mean = statistic(xg, "mean")
    nodes[-1].attrs[Attr.STORE] = True
    d = op("aten::sub.Tensor", [xg, mean, one], "deviation")
    var = statistic(op("aten::mul.Tensor", [d, d], "squares"), "var")
    inv = op("aten::rsqrt", [op("aten::add.Scalar", [var, constant("eps", eps, "float"), one], "var_eps")], "inv_std",
             store=True)
    normed = op("aten::reshape", [op("aten::mul.Tensor", [d, inv], "normed"), constant("shape", shape, "int[]")],
                "normed_shaped")
    per_channel = [-1] + [1] * (len(shape) - 2) if groups is not None else None
    for label, param, combine in (("weight", weight, "aten::mul.Tensor"), ("bias", bias, "aten::add.Tensor")):
        if param.type.kind == "None":
            continue
        if per_channel is not None:  # group norm's affine parameters are per channel: (C, 1, ..., 1)
            param = op("aten::view", [param, constant(f"{label}_shape", per_channel, "int[]")], f"{label}_view")
        args = [normed, param] + ([one] if combine == "aten::add.Tensor" else [])
        normed = op(combine, args, f"with_{label}")
    last = nodes[-1]  # the norm's own node now: its result, counted as the TorchScript node it replaces
    last.outputs = [result]
    del last.attrs[Attr.SYNTHETIC]
    return nodes
