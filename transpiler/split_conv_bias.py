"""On CUDA, a convolution's bias moves out of the convolution into the generated kernel that reads its output.

ATen's cuDNN convolution adds a bias with a separate elementwise kernel after the convolution (an `add_` over the
whole output, about 6 us per call on resnet18's fp16 activations on an H100: a quarter of its GPU time, since
freezing folds every batch norm into a bias). As a pointwise `add` of the bias viewed per channel, it fuses into
the relu / residual add kernel that follows, which reads the output anyway:

    y = _convolution(x, w, b, ...)   ->   c = _convolution(x, w, None, ...); y = c + b.view(C, 1, 1)

On the CPU the bias stays in the convolution (oneDNN adds it in the convolution's own epilogue, for free). Where the
add does not reach a kernel, fusion puts the bias back into the convolution (decompositions.py).
"""
from __future__ import annotations

from .decompositions import constant_nodes, decomposition
from .ir import Attr, Graph, Node, Type, Value, blocks, weight_names
from .op_table import lookup

BIAS = 2  # a convolution's bias input (OpInfo.convolution)
_VIEW_SCHEMA = "aten::view(Tensor(a) self, SymInt[] size) -> Tensor(a)"
_ADD_SCHEMA = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"


def split_conv_bias(graph: Graph, device_type: str) -> int:
    """Rewrite in place; returns how many convolutions gave up their bias."""
    if device_type != "cuda":
        return 0
    weights, constants = weight_names(graph), constant_nodes(graph)
    split = 0
    for block in blocks(graph):
        out: list[Node] = []
        for node in block.nodes:
            out.append(node)
            if not lookup(node.op).convolution or len(node.inputs) <= BIAS or node.inputs[BIAS].id not in weights:
                continue
            result, weight, bias = node.output, node.inputs[1], node.inputs[BIAS]
            rank = len(result.type.shape or ())
            # batched only: an unbatched output (C, H, W) has one dim fewer than the weight (C_out, C_in, kH, kW)
            if (weight.type.shape is None or rank != len(weight.type.shape) or bias.type.shape is None
                    or len(bias.type.shape) != 1):
                continue
            none, size = Value(f"{result.name}_no_bias", Type("None")), Value(f"{bias.name}_size", Type("Any"))
            convolved = Value(f"{result.name}_convolved", result.type)
            per_channel = Value(f"{bias.name}_per_channel", Type("Tensor", bias.type.dtype, None, bias.type.device))
            alpha = Value(f"{result.name}_alpha", Type("int"))
            record = decomposition(node, "split_conv_bias", constants)
            node.inputs[BIAS], node.outputs[0] = none, convolved
            out[-1:] = pieces = [
                Node("prim::Constant", [], [none], attrs={Attr.VALUE: None}),
                node,
                Node("prim::Constant", [], [size], attrs={Attr.VALUE: [-1] + [1] * (rank - 2)}),
                Node("aten::view", [bias, size], [per_channel], source=node.source,
                     attrs={Attr.SCHEMA: _VIEW_SCHEMA, Attr.SYNTHETIC: True}),
                Node("prim::Constant", [], [alpha], attrs={Attr.VALUE: 1}),
                Node("aten::add.Tensor", [convolved, per_channel, alpha], [result], source=node.source,
                     attrs={Attr.SCHEMA: _ADD_SCHEMA, Attr.SYNTHETIC: True}),
            ]
            record.mark(pieces, pieces[-1:])
            split += 1
        block.nodes = out
    return split
