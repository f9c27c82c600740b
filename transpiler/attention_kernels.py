"""After fusion: each `scaled_dot_product_attention` over a short key sequence becomes a generated kernel where the
GPU ran the template faster than ATen's attention at convert time (emitters/triton_attention.py).

The call site is timed at its own shapes, layouts and mask (ATen pads an additive mask whose keys are not a
multiple of 16 with a fill and a copy; the template reads it where it is), once per distinct call site and
process. Verification checks the kernel against ATen like any other, and one it takes out (`refused`) runs as the
ATen call it was. The package records the choice; a load never times anything. With choices="fixed", ATen.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, Optional

import torch

from . import timing
from .ir import KERNEL_OP, Attr, Graph, Node, Value, blocks, literals as literals_of, provenance_line
from .kernel_ir import INT32_LIMIT, AttentionKernel, KernelBuffer
from .lowering import contiguous_strides

SDPA = "aten::scaled_dot_product_attention"
MODE = "auto"  # "auto": timed on CUDA; "never"; "generated": every call site the template fits, any device (tests)
MARGIN = 0.97  # the template must take at most this share of ATen's time (~1% noise)
# The backend's hook: (AttentionKernel.spec(), timed) -> ({"aten": s, "generated": s} or None, configuration), or
# None where the template does not fit the call site
Generated = Callable[[tuple, bool], Optional[tuple[Optional[dict], dict]]]


def attention_kernels(graph: Graph, refused: dict[int, str], generated: Optional[Generated]) -> int:
    """Rewrite in place; returns how many call sites became kernels."""
    if generated is None or MODE == "never":
        return 0
    literals = literals_of(graph)
    made = 0
    for block in blocks(graph):
        nodes = []
        for node in block.nodes:
            kernel = _kernel(node, literals, made) if node.op == SDPA and node.uid not in refused else None
            config = _chosen(kernel, node.output.type.device, generated) if kernel is not None else None
            if config is None:
                nodes.append(node)
                continue
            kernel = dataclasses.replace(kernel, config=config)
            made += 1
            nodes.append(Node(KERNEL_OP, node.inputs[:4 if kernel.mask in ("additive", "boolean") else 3],
                              list(node.outputs), source=node.source,
                              attrs={Attr.KERNEL: kernel, Attr.FUSED: [node]}))
        block.nodes = nodes
    return made


def _chosen(kernel: AttentionKernel, device: Optional[str], generated: Generated) -> Optional[dict]:
    """The template's configuration where the call site takes it (the mode forces it, or it was timed faster than
    ATen's call); None where it keeps ATen's."""
    if MODE == "auto" and not (device == "cuda" and torch.cuda.is_available()):
        return None
    spec = kernel.spec()
    if generated(spec, False) is None:  # the template does not fit it: no choice to make
        return None
    what = (f"attention form, {'x'.join(map(str, kernel.batch))} x {kernel.l} queries x {kernel.s} keys, head "
            f"{kernel.d}, {kernel.inputs[0].dtype}{', ' + kernel.mask + ' mask' if kernel.mask else ''}")
    if MODE == "auto" and timing.fixed():
        timing.take_fixed(what, "aten", "aten")
        return None
    try:
        answer = generated(spec, MODE == "auto")
    except Exception:  # noqa: BLE001 - a template this Triton cannot build here costs this call site its form only
        return None
    if answer is None:
        return None
    seconds, config = answer
    if MODE != "auto":
        return config
    chosen = seconds is not None and timing.settle(what, seconds, "aten", MARGIN).chosen == "generated"
    return config if chosen else None


def _kernel(node: Node, literals: dict, number: int) -> Optional[AttentionKernel]:
    """The template kernel for this call site (its configuration still to choose), where the template covers it:
    static shapes and strides, no dropout, no grouped heads, batch dims q, k and v share, a mask that broadcasts."""
    q, k, v = node.inputs[:3]
    mask, dropout, causal = node.inputs[3], literals.get(node.inputs[4].id), literals.get(node.inputs[5].id)
    scale = literals.get(node.inputs[6].id) if len(node.inputs) > 6 else None
    gqa = literals.get(node.inputs[7].id) if len(node.inputs) > 7 else False
    if dropout not in (0, 0.0) or causal not in (True, False) or gqa is not False or (
            len(node.inputs) > 6 and node.inputs[6].id not in literals):
        return None
    if not all(_static(t.type) for t in (q, k, v, node.output)) or len({q.type.dtype, k.type.dtype, v.type.dtype,
                                                                        node.output.type.dtype}) != 1:
        return None
    rank = len(q.type.shape)
    batch = tuple(q.type.shape[:-2])
    if rank < 3 or len(k.type.shape) != rank or len(v.type.shape) != rank or tuple(k.type.shape[:-2]) != batch \
            or tuple(v.type.shape[:-2]) != batch or k.type.shape[-2] != v.type.shape[-2] \
            or k.type.shape[-1] != q.type.shape[-1]:
        return None
    l, d = q.type.shape[-2:]
    s, e = v.type.shape[-2:]
    if tuple(node.output.type.shape) != batch + (l, e):
        return None
    kind = _mask_kind(mask, q.type.dtype, batch + (l, s))
    if kind is None or (kind and causal):
        return None
    kind = kind or ("causal" if causal else "")
    values = [q, k, v] + ([mask] if kind in ("additive", "boolean") else []) + [node.output]
    buffers = [KernelBuffer(f"buf{x.id}", x.type.dtype, tuple(x.type.shape),
                            tuple(x.type.strides) if x.type.strides is not None else contiguous_strides(x.type.shape))
               for x in values]
    if any(sum((n - 1) * st for n, st in zip(b.shape, b.strides)) > INT32_LIMIT for b in buffers):
        return None  # (the template's offsets are int32)
    return AttentionKernel(name=f"a{number}_attention", ranges=(), inputs=buffers[:-1], outputs=buffers[-1:],
                           values=[], provenance=[provenance_line(node)], batch=batch, l=l, s=s, d=d, e=e,
                           scale=float(scale) if scale is not None else 1.0 / math.sqrt(d), mask=kind)


def _mask_kind(mask: Value, dtype: str, full: tuple[int, ...]) -> Optional[str]:
    """"" without a mask, "additive" or "boolean" for one that broadcasts to `full`, None for any other."""
    t = mask.type
    if t.kind == "None":
        return ""
    if not _static(t) or len(t.shape) > len(full):
        return None
    if any(n not in (1, m) for n, m in zip(t.shape, full[len(full) - len(t.shape):])):
        return None
    return "boolean" if t.dtype == "bool" else "additive" if t.dtype == dtype else None


def _static(t) -> bool:
    return (t.is_tensor and t.shape is not None and all(isinstance(n, int) for n in t.shape)
            and (t.strides is None or all(isinstance(n, int) for n in t.strides)))
