"""Library ops whose CPU kernel the runtime replaces with its own (deploy/cpp/src/native_ops.cpp, namespace j2t).

torchvision's CPU `roi_align` runs one thread and a channel at a time (a third of Faster R-CNN MobileNetV3-320's
call on one thread), and its `nms` compares boxes through the score order's indirection, one at a time (a fifth of
SSDlite's). The runtime's ops take the same arguments and give the same answer (the same operations in the same
order, no FMA contraction; tests/test_native_ops.py compares them exactly), `roi_align` vectorised over channels and
parallel over boxes, `nms` over boxes laid out in score order. A CPU plan names them in place of torchvision's where
the input's dtype is one whose answers were checked; the report counts them with the vendor calls. A plan that
names them needs no torchvision to load.
"""
from __future__ import annotations

from .ir import Attr, Graph, blocks

# the library's op -> (the runtime's, with the same schema but for its name; the dtypes of its first input whose
# answers were checked equal to the library's)
NATIVE = {"torchvision::roi_align": ("j2t::roi_align", ("float32",)),
          "torchvision::nms": ("j2t::nms", ("float32", "float64"))}


def native_ops(graph: Graph, refused: dict[int, str]) -> int:
    """Rename in place each CPU call the runtime computes itself; returns how many."""
    renamed = 0
    for block in blocks(graph):
        for node in block.nodes:
            native, dtypes = NATIVE.get(node.op, (None, ()))
            if native is None or node.uid in refused or not node.inputs or node.inputs[0].type.dtype not in dtypes:
                continue
            schema = node.attrs.get(Attr.SCHEMA, "")
            if schema.startswith(node.op):
                node.attrs[Attr.SCHEMA] = native + schema[len(node.op):]
            node.op = native
            node.attrs[Attr.EXTERN] = True
            node.attrs[Attr.NOT_LOWERED] = f"the runtime's own CPU kernel, {native}"
            renamed += 1
    return renamed
