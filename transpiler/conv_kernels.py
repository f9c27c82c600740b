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

import torch

from .fuse import provenance_line
from .ir import KERNEL_OP, Attr, Graph, Node, Type, Value, blocks, weight_names
from .kernel_ir import ConvKernel, KernelBuffer
from .lowering import contiguous_strides, strides_in_order

DTYPES = ("float32",)
BLOCK = 16  # output channels per tile of the pointwise template, channels per block of the depthwise one
MAX_WEIGHT = 256 * 256  # elements of a 1x1 or dense weight: past it, past what a register-tiled loop keeps in cache
MAX_PATCH = 1152  # a dense convolution's taps x channels in (its patch of 6 pixels is gathered on the stack)
MAX_TAPS = 9  # the depthwise template's kernel height and width at most
CHANNELS_LAST = (0, 2, 3, 1)  # NCHW dims, outermost in memory first


def template_kernel(x: Type, weight_shape: tuple, out: Type, stride, padding, dilation, groups: int,
                    bias: bool) -> Optional[ConvKernel]:
    """The template kernel computing this convolution (its buffers named "x", "w", "b", "y"), or None where no
    template does: float32, static, 2-d; a 1x1 convolution with stride 1 and no padding ("pointwise"), a depthwise
    one, or one of a single group whose patch (taps x channels in) and weight are small ("dense")."""
    if x.dtype not in DTYPES or out.dtype != x.dtype or not _static4(x.shape) or not _static4(out.shape):
        return None
    batch, cin, h, w = x.shape
    cout, per_group, kh, kw = weight_shape
    pairs = [tuple(p) for p in (stride, padding, dilation)]
    if any(len(p) != 2 for p in pairs) or min(batch, cin, cout, h, w) <= 0:
        return None
    stride, padding, dilation = pairs
    if groups == 1 and cin * kh * kw * cout > MAX_WEIGHT:
        return None
    if (kh, kw) == (1, 1) and stride == (1, 1) and padding == (0, 0) and groups == 1:
        kind = "pointwise"
    elif groups == cin == cout and per_group == 1 and max(kh, kw) <= MAX_TAPS:
        kind = "depthwise"
    elif groups == 1 and cin * kh * kw <= MAX_PATCH:
        kind = "dense"
    else:
        return None
    out_size = tuple(out.shape[2:])
    expected = tuple((n + 2 * p - d * (k - 1) - 1) // s + 1
                     for n, p, d, k, s in zip((h, w), padding, dilation, (kh, kw), stride))
    if out_size != expected or tuple(out.shape[:2]) != (batch, cout):
        return None
    buffers = [KernelBuffer("x", x.dtype, tuple(x.shape), strides_in_order(x.shape, list(CHANNELS_LAST))),
               KernelBuffer("w", x.dtype, packed_shape(kind, weight_shape), contiguous_strides(
                   packed_shape(kind, weight_shape)))]
    if bias:
        buffers.append(KernelBuffer("b", x.dtype, (cout,), (1,)))
    y = KernelBuffer("y", x.dtype, tuple(out.shape), strides_in_order(out.shape, list(CHANNELS_LAST)))
    return ConvKernel(name=f"{kind}_conv", ranges=(), inputs=buffers, outputs=[y], values=[], kind=kind,
                      batch=batch, cin=cin, cout=cout, size=(h, w), out_size=out_size, kernel_size=(kh, kw),
                      stride=stride, padding=padding, dilation=dilation, bias=bias)


def _static4(shape) -> bool:
    return shape is not None and len(shape) == 4 and all(isinstance(n, int) for n in shape)


def packed_shape(kind: str, weight_shape: tuple) -> tuple[int, ...]:
    cout, cin, kh, kw = weight_shape
    if kind == "depthwise":  # [tap][channel], channels innermost as the activation's
        return (kh * kw, cout)
    # [column block][k][16 columns], k = (tap row, tap column, channel in) as a patch of channels-last pixels is
    # laid out: each tile's weight panel contiguous, zero-padded past cout
    return (-(-cout // BLOCK), kh * kw * cin, BLOCK)


def pack(kind: str, weight: torch.Tensor) -> torch.Tensor:
    """The weight in the template's layout (`packed_shape`)."""
    cout, cin, kh, kw = weight.shape
    if kind == "depthwise":
        return weight.reshape(cout, kh * kw).t().contiguous()
    blocks_, k = -(-cout // BLOCK), kh * kw * cin
    padded = torch.zeros(blocks_ * BLOCK, k, dtype=weight.dtype)
    padded[:cout] = weight.permute(0, 2, 3, 1).reshape(cout, k)
    return padded.reshape(blocks_, BLOCK, k).transpose(1, 2).contiguous()


def shape_key(kernel: ConvKernel) -> tuple:
    """What the template's code depends on: kernels with equal keys compute the same function."""
    return (kernel.kind, kernel.batch, kernel.cin, kernel.cout, kernel.size, kernel.kernel_size, kernel.stride,
            kernel.padding, kernel.dilation, kernel.bias)


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
