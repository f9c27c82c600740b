"""Which kernel inputs may start at an address a GPU kernel cannot assume aligned.

Triton compiles a kernel for pointers that are 16-byte aligned (fresh allocations are), so that it can load 4 floats
at once; the runtime copies an input that is not into fresh memory before the launch. Where an input is a view
that starts elsewhere at every call (row `i` of a matrix in a loop, `x[1:]`), that is a copy per launch: Mask R-CNN
made 1,000 a call. Such inputs were seen unaligned while the example ran (infer_shapes.ShapeRecorder.misaligned),
so their kernels are compiled without the assumption instead (scalar loads of that input, no copy). An input never
seen unaligned keeps it; if it breaks it at run time, the runtime's copy still keeps the launch correct.
"""
from __future__ import annotations

import dataclasses

from .ir import KERNEL_OP, Attr, Graph


def mark_misaligned_inputs(graph: Graph) -> None:
    for node in graph.walk():
        if node.op != KERNEL_OP:
            continue
        kernel = node.attrs[Attr.KERNEL]
        kernel.inputs = [dataclasses.replace(b, aligned=False) if i < len(node.inputs) and
                         node.inputs[i].id in graph.misaligned else b for i, b in enumerate(kernel.inputs)]
