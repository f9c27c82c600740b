"""After epilogues: the kernel that makes a few-row GEMM's input (BERT's residual add + LayerNorm before the next
layer's QKV projection and before the FFN) is computed inside the GEMM's kernel, one launch instead of two.

At 9 rows a transformer layer is latency-bound: each kernel costs its launch and the ramp of its programs more than
its work. A GEMM template's programs each need every row of x, so no program can compute only its share of a
LayerNorm; each computes the whole producer instead (a few thousand elements, read from L2), stores it (every
program stores the same bits, so the stores race harmlessly), and reads it back after a barrier, as the template
reads x. Its output is stored for its other readers too (the residual that the layer adds later).

Taken where the producer is a kernel of expressions with one output, x itself (dense rows), directly before the
GEMM in its block, static, small (`MAX_ELEMENTS`: the redundant work grows with it), reading nothing the GEMM's
other operands or its epilogue read, and where the GEMM (with its epilogue) does not read x again.
`JIT2TRITON_GEMM_PROLOGUES=0` turns it off (for A/B timing).
"""
from __future__ import annotations

import dataclasses
import os

from . import kernel_ir as K
from .ir import KERNEL_OP, Attr, Block, Graph, Node, blocks
from .kernel_ir import GemmKernel

MAX_ELEMENTS = 16 * 4096  # the producer's output and each of its reductions: 16 rows of 4096


def take_prologues(graph: Graph) -> int:
    """Rewrite in place; returns how many GEMM kernels took their input's producer."""
    if os.environ.get("JIT2TRITON_GEMM_PROLOGUES", "1") == "0":
        return 0
    return sum(_take(block) for block in blocks(graph))


def _take(block: Block) -> int:
    taken, nodes = 0, []
    for node in block.nodes:
        before = nodes[-1] if nodes else None
        if before is not None and _fits(before, node):
            nodes[-1] = _with_prologue(node, before)
            taken += 1
        else:
            nodes.append(node)
    block.nodes = nodes
    return taken


def _fits(producer: Node, gemm: Node) -> bool:
    kernel, made = gemm.attrs.get(Attr.KERNEL), producer.attrs.get(Attr.KERNEL)
    if not (gemm.op == KERNEL_OP and isinstance(kernel, GemmKernel) and kernel.prologue is None
            and kernel.x_row == 0 and producer.op == KERNEL_OP and type(made) is K.Kernel):
        return False
    x = gemm.inputs[0]
    if len(producer.outputs) != 1 or producer.outputs[0] is not x or len(made.outputs) != 1:
        return False
    if made.size_names or any(b.by_value for b in made.inputs) or _elements(made.outputs[0].shape) > MAX_ELEMENTS:
        return False
    if any(_elements([v.arg[1] for v in r.arg[1]]) > MAX_ELEMENTS for r in _reductions(made)):
        return False
    others = {v.id for v in gemm.inputs[1:] if v is not None}
    return x.id not in others and not others & {v.id for v in producer.inputs if v is not None}


def _reductions(kernel: K.Kernel) -> list[K.KExpr]:
    return [r for v in kernel.values for r in K.reductions_in(v)]


def _elements(shape) -> float:
    total = 1
    for n in shape:
        if not isinstance(n, int):
            return float("inf")
        total *= n
    return total


def _with_prologue(gemm: Node, producer: Node) -> Node:
    kernel, made = gemm.attrs[Attr.KERNEL], producer.attrs[Attr.KERNEL]
    number, ops = kernel.name.split("_", 1)
    combined = dataclasses.replace(
        kernel, name=f"{number}_{made.name.split('_', 1)[-1]}_{ops}", prologue=made,
        inputs=list(made.inputs) + kernel.inputs[1:], outputs=list(made.outputs) + kernel.outputs,
        provenance=made.provenance + kernel.provenance)
    return Node(KERNEL_OP, list(producer.inputs) + list(gemm.inputs[1:]),
                list(producer.outputs) + list(gemm.outputs), source=gemm.source,
                attrs={Attr.KERNEL: combined, Attr.FUSED: producer.attrs[Attr.FUSED] + gemm.attrs[Attr.FUSED]})
