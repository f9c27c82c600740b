"""Library ops whose CPU kernel the runtime replaces with its own (deploy/cpp/src/native_ops.cpp, namespace j2t).

torchvision's CPU `roi_align` runs one thread and a channel at a time (a third of Faster R-CNN MobileNetV3-320's
call on one thread). The runtime's `j2t::roi_align` takes the same arguments and gives the same bits (the same
operations in the same order, no FMA contraction; tests/test_native_ops.py compares them exactly), vectorised over
channels and parallel over boxes. A CPU plan names it (the op table's `runtime_op`) in place of torchvision's where the
input's dtype is one whose answers were checked; the report counts it with the vendor calls. A plan that names it needs no torchvision to
load.
"""
from __future__ import annotations

from .ir import Attr, Graph, blocks
from .op_table import lookup


def native_ops(graph: Graph, refused: dict[int, str]) -> int:
    """Rename in place each CPU call the runtime computes itself (the op table's `runtime_op`); returns how many."""
    renamed = 0
    for block in blocks(graph):
        for node in block.nodes:
            info = lookup(node.op)
            native = info.runtime_op
            if not native or node.uid in refused or not node.inputs or \
                    node.inputs[0].type.dtype not in info.runtime_op_dtypes:
                continue
            schema = node.attrs.get(Attr.SCHEMA, "")
            if schema.startswith(node.op):
                node.attrs[Attr.SCHEMA] = native + schema[len(node.op):]
            node.op = native
            node.attrs[Attr.EXTERN] = True
            node.attrs[Attr.NOT_LOWERED] = f"the runtime's own CPU kernel, {native}"
            renamed += 1
    return renamed
