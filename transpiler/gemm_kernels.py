"""After fusion: each GEMM that `gemm_forms` gave the generated form ("skinny", few rows) becomes a kernel node, and
the pointwise kernel that alone reads its product becomes its epilogue.

The form is chosen before fusion, by timing; the node stays an ATen `linear` until here, so fusion treats it as
any GEMM (the ops after it fuse into one kernel reading its output) and so that a GEMM this pass does not take
runs as the `linear` it already is: one whose operands fusion left in a layout other than dense rows, or one
verification took out (`refused`, as for any kernel whose output disagreed with ATen's).

An epilogue (BERT's bias + GELU after its first FFN GEMM) saves its kernel's launch and the product's round trip
through memory: the template computes it on the product's tile, rounded first as ATen's GEMM output is. Taken
where the pointwise kernel iterates over exactly the product's elements in row-major order, reads the product
only at the element it computes, is the product's only reader, and nothing between the two writes memory.
"""
from __future__ import annotations

import dataclasses

from . import kernel_ir as K
from .alias_analysis import writes
from .fuse import provenance_line
from .gemm_forms import GENERATED
from .ir import KERNEL_OP, Attr, Block, Graph, Node, blocks, readers
from .kernel_ir import GemmKernel, KernelBuffer
from .lowering import contiguous_strides


def gemm_kernels(graph: Graph, refused: dict[int, str]) -> int:
    """Rewrite in place; returns how many GEMMs became kernels."""
    made = 0
    for block in blocks(graph):
        nodes = []
        for node in block.nodes:
            taken = node.attrs.get(Attr.GEMM_FORM) == GENERATED and node.uid not in refused
            kernel = _kernel(node, made) if taken else None
            if kernel is None:
                nodes.append(node)
                continue
            made += 1
            nodes.append(Node(KERNEL_OP, list(kernel_inputs(node)), list(node.outputs), source=node.source,
                              attrs={Attr.KERNEL: kernel, Attr.FUSED: [node]}))
        block.nodes = nodes
    read_by = readers(graph)
    for block in blocks(graph):
        _take_epilogues(block, read_by)
    return made


def _take_epilogues(block: Block, read_by: dict[int, list]) -> None:
    position = {id(n): i for i, n in enumerate(block.nodes)}
    dropped: set[int] = set()
    taken: set[int] = set()  # epilogues already joined to a GEMM (one reading two GEMMs' products joins one)
    for gemm in list(block.nodes):
        kernel = gemm.attrs.get(Attr.KERNEL)
        if not isinstance(kernel, GemmKernel) or kernel.epilogue is not None:
            continue
        users = read_by.get(gemm.output.id, [])
        after = users[0] if len(users) == 1 else None
        if (after is None or after.op != KERNEL_OP or id(after) in taken
                or position.get(id(after), -1) < position[id(gemm)]):
            continue
        between = block.nodes[position[id(gemm)] + 1:position[id(after)]]
        if any(writes(n) or n.blocks for n in between):
            continue
        product = after.attrs[Attr.KERNEL].inputs[after.inputs.index(gemm.output)].name
        if not _epilogue_fits(after.attrs[Attr.KERNEL], product, gemm.output):
            continue
        block.nodes[position[id(after)]] = _with_epilogue(gemm, after, product)
        dropped.add(id(gemm))
        taken.add(id(after))
    block.nodes = [n for n in block.nodes if id(n) not in dropped]


def _epilogue_fits(kernel, product: str, value) -> bool:
    """Whether `kernel` can be computed on the product's tile: pointwise over the product's elements in row-major
    order, every output dense, the product read only at the element computed."""
    if isinstance(kernel, GemmKernel) or any(K.reductions_in(v) for v in kernel.values):
        return False
    sizes = [r.arg[1] for r in kernel.ranges]
    if (kernel.index != kernel.ranges or tuple(sizes) != tuple(value.type.shape)
            or any(tuple(b.shape) != tuple(sizes) or tuple(b.strides) != contiguous_strides(sizes)
                   for b in kernel.outputs)):
        return False
    at = K.sum_terms(v * s for v, s in zip(kernel.ranges, contiguous_strides(sizes)) if v.arg[1] != 1)
    return all(n.args == (at,) for n in K.nodes_in(*kernel.values) if n.op == "load" and n.arg == product)


def _with_epilogue(gemm: Node, after: Node, product: str) -> Node:
    kernel, epilogue = gemm.attrs[Attr.KERNEL], after.attrs[Attr.KERNEL]
    others = [(v, b) for v, b in zip(after.inputs, epilogue.inputs) if b.name != product]
    combined = dataclasses.replace(
        kernel, name=f"{kernel.name}_{epilogue.name.split('_', 1)[-1]}", epilogue=epilogue, product=product,
        inputs=kernel.inputs + [b for _, b in others], outputs=list(epilogue.outputs),
        provenance=kernel.provenance + epilogue.provenance)
    return Node(KERNEL_OP, list(gemm.inputs) + [v for v, _ in others], list(after.outputs), source=gemm.source,
                attrs={Attr.KERNEL: combined, Attr.FUSED: gemm.attrs[Attr.FUSED] + after.attrs[Attr.FUSED]})


def kernel_inputs(node: Node) -> list:
    """x, the weight and the bias where there is one (a `linear`'s third input is None without)."""
    x, w, b = node.inputs[0], node.inputs[1], node.inputs[2] if len(node.inputs) > 2 else None
    return [x, w] if b is None or b.type.kind == "None" else [x, w, b]


def _kernel(node: Node, number: int) -> GemmKernel | None:
    """The template kernel for `node`, where each operand is dense in rows (the template's only layout)."""
    values = kernel_inputs(node) + list(node.outputs)
    if not all(_dense(v.type) for v in values):
        return None
    x, w = values[0], values[1]
    rows = 1
    for n in x.type.shape[:-1]:
        rows *= n
    buffers = [KernelBuffer(f"buf{v.id}", v.type.dtype, tuple(v.type.shape), contiguous_strides(v.type.shape))
               for v in values]
    return GemmKernel(name=f"g{number}_linear", ranges=(), inputs=buffers[:-1], outputs=buffers[-1:], values=[],
                      provenance=[provenance_line(node)], rows=rows, k=x.type.shape[-1], n=w.type.shape[0],
                      bias=len(values) == 4, config=node.attrs[Attr.GEMM_CONFIG])


def _dense(t) -> bool:
    """Static and dense in rows. A weight's strides are not observed: dense, as fusion takes it (the runtime checks
    the strides of every kernel input it did not make, and copies one that differs)."""
    return (t.is_tensor and t.shape is not None and all(isinstance(n, int) for n in t.shape)
            and (t.strides is None or tuple(t.strides) == contiguous_strides(t.shape)))
