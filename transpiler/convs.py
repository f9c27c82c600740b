"""A 2-d convolution by a constant weight as the CPU rewrites see it (oneDNN's fused op, 1x1 convolutions of one
pixel as GEMMs): what it reads, its parameters, and what it folds in. Shared by those passes, so neither imports the
other."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .ir import Node, Value

DTYPES = ("float32", "bfloat16")  # what oneDNN's fused convolution runs on the CPU


@dataclass
class Conv:
    """A 2-d convolution by a constant weight and what it folds in."""
    node: Node
    x: Value
    weight: Value
    bias: Optional[Value]
    stride: list[int]
    padding: list[int]
    dilation: list[int]
    groups: int
    other: Optional[Value] = None  # a residual added to its output
    activation: str = ""  # oneDNN's post-op name
    scalars: list = field(default_factory=list)
    algorithm: str = ""
    folded: list[Node] = field(default_factory=list)  # the add and activation nodes it takes in, in order
    sizes: Optional[dict[str, int]] = None  # the example's dynamic dims


def as_conv(node: Node, weights: dict[int, str], literals: dict[int, object]) -> Optional[Conv]:
    """The convolution `node` computes, when oneDNN's fused op can run it: 2-d, batched, a constant weight and
    bias, float32 or bfloat16 on the CPU, not transposed, numeric padding."""
    ins = node.inputs
    if node.op == "aten::conv2d" and len(ins) == 7:
        params = [literals.get(v.id) for v in ins[3:7]]
    elif node.op == "aten::_convolution" and len(ins) >= 12 and literals.get(ins[6].id) is False:
        params = [literals.get(v.id) for v in (ins[3], ins[4], ins[5], ins[8])]
    else:
        return None
    x, weight, bias = ins[0], ins[1], ins[2]
    stride, padding, dilation, groups = params
    if not (all(_pair(p) for p in (stride, padding, dilation)) and isinstance(groups, int)):
        return None
    dtype = x.type.dtype
    if (dtype not in DTYPES or x.type.device != "cpu" or weight.id not in weights or weight.type.dtype != dtype
            or x.type.shape is None or len(x.type.shape) != 4 or weight.type.shape is None
            or len(weight.type.shape) != 4 or node.output.type.dtype != dtype):
        return None
    if bias.type.kind == "None":
        bias = None
    elif bias.id not in weights or bias.type.dtype != dtype:
        return None
    return Conv(node, x, weight, bias, _two(stride), _two(padding), _two(dilation), groups)


def _pair(p) -> bool:
    return isinstance(p, list) and len(p) in (1, 2) and all(isinstance(i, int) for i in p)


def _two(p: list[int]) -> list[int]:
    return p * 2 if len(p) == 1 else list(p)
