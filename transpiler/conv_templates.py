"""The convolution templates' shapes: which convolutions a fixed template (emitters/cpp_conv.py) computes, the
layout its packed weight takes, and what its code depends on. Shared by the pass that times the templates against
oneDNN (onednn_conv.py), the pass that makes the kernels (conv_kernels.py) and the emitter, so none of them
imports another pass."""
from __future__ import annotations

from typing import Optional

import torch

from .ir import Type
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
