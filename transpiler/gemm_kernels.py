"""After fusion: each GEMM that `gemm_forms` gave the generated form ("skinny", few rows) becomes a kernel node (and
then, in epilogues.py, takes the pointwise kernel that alone reads its product as its epilogue).

The form is chosen before fusion, by timing; the node stays an ATen `linear` until here, so fusion treats it as
any GEMM (the ops after it fuse into one kernel reading its output) and so that a GEMM this pass does not take
runs as the `linear` it already is: one whose operands fusion left in a layout other than dense rows, or one
verification took out (`refused`, as for any kernel whose output disagreed with ATen's).

The template computes an epilogue on the product's tile, rounded first as ATen's GEMM output is.
"""
from __future__ import annotations

import math

from .ir import GENERATED_GEMM, KERNEL_OP, Attr, Graph, Node, blocks, provenance_line
from .kernel_ir import INT32_LIMIT, GemmKernel, KernelBuffer
from .lowering import contiguous_strides


def gemm_kernels(graph: Graph, refused: dict[int, str]) -> int:
    """Rewrite in place; returns how many GEMMs became kernels."""
    made = 0
    for block in blocks(graph):
        nodes = []
        for node in block.nodes:
            taken = node.attrs.get(Attr.GEMM_FORM) == GENERATED_GEMM and node.uid not in refused
            kernel = _kernel(node, made) if taken else None
            if kernel is None:
                nodes.append(node)
                continue
            made += 1
            nodes.append(Node(KERNEL_OP, list(kernel_inputs(node)), list(node.outputs), source=node.source,
                              attrs={Attr.KERNEL: kernel, Attr.FUSED: [node]}))
        block.nodes = nodes
    return made


def kernel_inputs(node: Node) -> list:
    """x, the weight and the bias where there is one (a `linear`'s third input is None without)."""
    x, w, b = node.inputs[0], node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None
    return [x, w] if b is None or b.type.kind == "None" else [x, w, b]


def _kernel(node: Node, number: int) -> GemmKernel | None:
    """The template kernel for `node`, where each operand is dense in rows (the template's only layout) but x,
    whose rows may be apart (one token of each sequence) where each row is dense."""
    values = kernel_inputs(node) + list(node.outputs)
    x_row = row_stride(values[0].type)
    if x_row is None or not all(_dense(v.type) for v in values[1:]):
        return None
    x, w = values[0], values[1]
    rows = 1
    for n in x.type.shape[:-1]:
        rows *= n
    buffers = [KernelBuffer(f"buf{v.id}", v.type.dtype, tuple(v.type.shape), contiguous_strides(v.type.shape))
               for v in values]
    buffers[0] = KernelBuffer(buffers[0].name, x.type.dtype, tuple(x.type.shape), tuple(x.type.strides or
                                                                                     buffers[0].strides))
    return GemmKernel(name=f"g{number}_linear", ranges=(), inputs=buffers[:-1], outputs=buffers[-1:], values=[],
                      provenance=[provenance_line(node)], rows=rows, k=x.type.shape[-1], n=w.type.shape[0],
                      bias=len(values) == 4, config=node.attrs[Attr.GEMM_CONFIG],
                      x_row=0 if x_row == x.type.shape[-1] else x_row)


def row_stride(t) -> int | None:
    """The stride between x's rows (its dims but the last, flattened), where each row is dense and the rows are
    evenly apart; None otherwise."""
    if not (t.is_tensor and t.shape is not None and all(isinstance(n, int) for n in (*t.shape, *(t.strides or ())))):
        return None
    shape, strides = tuple(t.shape), tuple(t.strides or contiguous_strides(t.shape))
    if not shape or (shape[-1] != 1 and strides[-1] != 1):
        return None
    leading = [(n, s) for n, s in zip(shape[:-1], strides[:-1]) if n != 1]
    if not leading:
        return shape[-1]  # one row
    for (_, outer), (inner_n, inner) in zip(leading, leading[1:]):
        if outer != inner * inner_n:
            return None
    stride, rows = leading[-1][1], math.prod(n for n, _ in leading)
    return stride if shape[-1] <= stride and rows * stride <= INT32_LIMIT else None  # (the template's offsets)


def _dense(t) -> bool:
    """Static and dense in rows. A weight's strides are not observed: dense, as fusion takes it (the runtime checks
    the strides of every kernel input it did not make, and copies one that differs)."""
    return (t.is_tensor and t.shape is not None and all(isinstance(n, int) for n in t.shape)
            and (t.strides is None or tuple(t.strides) == contiguous_strides(t.shape)))
