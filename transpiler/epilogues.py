"""After the template kernels are made (gemm_kernels.py, conv_kernels.py): the pointwise kernel that alone reads a
template's product becomes its epilogue, computed on the product's tile in registers.

An epilogue saves a kernel's launch and the product's round trip through memory: BERT's bias + GELU after its
first FFN GEMM, a conv net's residual add, ReLU6 or SiLU after each convolution. Taken where the pointwise kernel
iterates over exactly the product's elements in the product's memory order (row-major for a GEMM, channels
innermost for a channels-last convolution), reads the product only at the element it computes, is the product's
only reader, and nothing between the two writes memory.
"""
from __future__ import annotations

import dataclasses

from . import kernel_ir as K
from .alias_analysis import sole_kernel_reader
from .ir import KERNEL_OP, Attr, Block, Graph, Node, Value, blocks, readers
from .kernel_ir import TemplateKernel
from .lowering import contiguous_strides


def take_epilogues(graph: Graph) -> int:
    """Rewrite in place; returns how many template kernels took an epilogue."""
    read_by = readers(graph)
    return sum(_take(block, read_by) for block in blocks(graph))


def _take(block: Block, read_by: dict[int, list]) -> int:
    position = {id(n): i for i, n in enumerate(block.nodes)}
    dropped: set[int] = set()
    taken: set[int] = set()  # epilogues already joined to a template (one reading two products joins one)
    for template in list(block.nodes):
        kernel = template.attrs.get(Attr.KERNEL)
        if not isinstance(kernel, TemplateKernel) or kernel.epilogue is not None:
            continue
        after = sole_kernel_reader(template, block, position, read_by)
        if after is None or id(after) in taken:
            continue
        product = after.attrs[Attr.KERNEL].inputs[after.inputs.index(template.output)].name
        if not fits(after.attrs[Attr.KERNEL], product, template.output, kernel.inner_dim):
            continue
        block.nodes[position[id(after)]] = _with_epilogue(template, after, product)
        dropped.add(id(template))
        taken.add(id(after))
    block.nodes = [n for n in block.nodes if id(n) not in dropped]
    return len(dropped)


def memory_order(value: Value) -> list[int]:
    """The value's dims, outermost in memory first: its size-1 dims (which say nothing of the layout), then the
    others by stride, larger first (a tie keeps dim order)."""
    shape, strides = value.type.shape, value.type.strides or contiguous_strides(value.type.shape)
    return sorted(range(len(shape)), key=lambda d: (shape[d] != 1, -strides[d], d))


def fits(kernel: K.Kernel, product: str, value: Value, inner_dim: int) -> bool:
    """Whether `kernel` can be computed on the product's tile: pointwise over the product's elements in the
    product's memory order (its loop variables, outermost first, are the product's dims so ordered), innermost
    the dim the template's tile sweeps (`inner_dim`), every output laid out as the product, the product read only
    at the element computed."""
    if isinstance(kernel, TemplateKernel) or any(K.reductions_in(v) for v in kernel.values):
        return False
    if any(b.by_value for b in kernel.inputs):  # (the templates' renderers take tensors only)
        return False
    shape = tuple(value.type.shape)
    strides = tuple(value.type.strides or contiguous_strides(shape))
    order = memory_order(value)
    if order[-1] != inner_dim % len(shape):
        return False
    sizes = [r.arg[1] for r in kernel.ranges]
    if (len(kernel.index) != len(shape) or tuple(kernel.ranges) != tuple(kernel.index[d] for d in order)
            or tuple(sizes) != tuple(shape[d] for d in order)
            or any(tuple(b.shape) != shape or _long(b.strides or contiguous_strides(shape), shape)
                   != _long(strides, shape) for b in kernel.outputs)):
        return False
    at = K.sum_terms(v * s for v, s in zip(kernel.ranges, contiguous_strides(sizes)) if v.arg[1] != 1)
    terms = sorted(map(id, K.split_terms(at)))  # (hash-consed: equal terms are one node, in any order of the sum)
    return all(len(n.args) == 1 and sorted(map(id, K.split_terms(n.args[0]))) == terms
               for n in K.nodes_in(*kernel.values) if n.op == "load" and n.arg == product)


def _long(strides, shape) -> tuple:
    """The strides of the dims longer than 1: a size-1 dim's stride says nothing about the layout."""
    return tuple(s for s, n in zip(strides, shape) if n != 1)


def _with_epilogue(template: Node, after: Node, product: str) -> Node:
    kernel, epilogue = template.attrs[Attr.KERNEL], after.attrs[Attr.KERNEL]
    others = [(v, b) for v, b in zip(after.inputs, epilogue.inputs) if b.name != product]
    combined = dataclasses.replace(
        kernel, name=f"{kernel.name}_{epilogue.name.split('_', 1)[-1]}", epilogue=epilogue, product=product,
        inputs=kernel.inputs + [b for _, b in others], outputs=list(epilogue.outputs),
        provenance=kernel.provenance + epilogue.provenance)
    return Node(KERNEL_OP, list(template.inputs) + [v for v, _ in others], list(after.outputs),
                source=template.source,
                attrs={Attr.KERNEL: combined, Attr.FUSED: template.attrs[Attr.FUSED] + after.attrs[Attr.FUSED]})
