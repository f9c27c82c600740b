"""Convolutions of channels-last nets as generated kernels: a 1x1 convolution (a GEMM over the pixels), a depthwise
one, and a small dense one (an edge net's stem: 3 channels in, 3x3), each from a fixed template
(emitters/cpp_conv.py) with the ops after it as its epilogue.

oneDNN's fused convolution (onednn_conv.py) is the CPU's default form. At the small shapes of edge nets its work
is a few tens of microseconds, and each call through torch also pays for building oneDNN's descriptors and its
output (the conv-BN/depthwise/SE net's 2x32x32x32 -> 64 1x1 convolution: 107 us in oneDNN, 87 here; its 3x3
depthwise convolution 60 against 48). onednn_conv.py times the two forms per convolution and marks the node
(`Attr.CONV_TEMPLATE`, the kernel it would be) where the template wins; the node stays an ATen convolution through
fusion, so the ops after it fuse into one kernel as after any convolution, and one this pass does not take (its
operands no longer channels-last, or verification took it out: `refused`) runs as the convolution it is. Here,
after fusion, each marked node becomes the kernel, reading its weight packed for the template at convert time,
and epilogues.py gives it the pointwise kernel after it (the activation, a residual add).
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from .conv_templates import pack
from .ir import KERNEL_OP, Attr, Graph, Node, Type, Value, blocks, provenance_line, weight_names
from .kernel_ir import ConvKernel, KernelBuffer


def conv_kernels(graph: Graph, refused: dict[int, str]) -> int:
    """Rewrite in place; returns how many convolutions became template kernels."""
    names = weight_names(graph)
    graph.weights = dict(graph.weights)  # (a copy of the graph's: the packed weights are this graph's own)
    made = 0
    for block in blocks(graph):
        nodes = []
        for node in block.nodes:
            template = node.attrs.get(Attr.CONV_TEMPLATE)
            made_here = None
            if template is not None and node.uid not in refused and node.inputs[1].id in names:
                made_here = _kernel(node, template, graph, names[node.inputs[1].id], made)
            if made_here is None:
                nodes.append(node)
                continue
            made += 1
            nodes += made_here
        block.nodes = nodes
    return made


def _kernel(node: Node, template: ConvKernel, graph: Graph, weight_name: str, number: int) -> Optional[list[Node]]:
    """[the packed weight's constant, the kernel node], where the operands are still as the template was timed."""
    x, out = node.inputs[0], node.output
    bias = node.inputs[2] if template.bias else None
    if not (_channels_last(x.type, template.inputs[0]) and _channels_last(out.type, template.outputs[0])):
        return None
    weight = graph.weights[weight_name]
    packed_name = f"{weight_name}_{template.kind}_packed"
    graph.weights[packed_name] = pack(template.kind, weight)
    w = template.inputs[1]
    packed = Value(packed_name.replace(".", "_"), Type("Tensor", w.dtype, w.shape, "cpu", strides=w.strides))
    constant = Node("prim::Constant", [], [packed], attrs={Attr.WEIGHT: packed_name})
    values = [x, packed] + ([bias] if bias is not None else [])
    buffers = [dataclasses.replace(b, name=f"buf{v.id}") for b, v in zip(template.inputs, values)]
    kernel = dataclasses.replace(
        template, name=f"c{number}_{template.kind}_conv", inputs=buffers,
        outputs=[dataclasses.replace(template.outputs[0], name=f"buf{out.id}")],
        provenance=[provenance_line(node)])
    return [constant, Node(KERNEL_OP, values, [out], source=node.source,
                           attrs={Attr.KERNEL: kernel, Attr.FUSED: [node]})]


def _channels_last(t: Type, buffer: KernelBuffer) -> bool:
    """The value is what the template reads or writes: its type, and dense channels-last (on dims longer than 1)."""
    if not (t.is_tensor and t.dtype == buffer.dtype and t.shape is not None and tuple(t.shape) == buffer.shape
            and t.strides is not None):
        return False
    return all(s == e for s, e, n in zip(t.strides, buffer.strides, buffer.shape) if n != 1)
