"""Library ops whose CPU kernel the runtime replaces with its own (deploy/cpp/src/native_ops.cpp, namespace j2t).

torchvision's CPU `roi_align` runs one thread and a channel at a time (a third of Faster R-CNN MobileNetV3-320's
call on one thread); its `nms` compares each kept box with every later one through the score order's indirection
(29 ms of SSDlite's 132 ms). The runtime's `j2t::roi_align` and `j2t::nms` take the same arguments and give the same
answers (the same operations in the same order, no FMA contraction; tests/test_native_ops.py compares them exactly),
vectorised, and roi_align parallel over boxes. A CPU plan names them (the op table's `runtime_op`) in place of
torchvision's where the input's dtype is one whose answers were checked, and `nms` only where the installed
torchvision keeps boxes of equal scores in their input order, as the runtime's does: that order is torchvision's
version's (0.26 sorts scores stably, 0.28 built for torch 2.13 does not), and the package must give the boxes the
TorchScript model gives beside the torchvision it was converted with. The report counts them with the vendor calls.
A plan that names them needs no torchvision to load.
"""
from __future__ import annotations

import functools

import torch

from .ir import Attr, Graph, blocks
from .op_table import lookup


@functools.lru_cache(maxsize=None)
def ties_in_input_order() -> bool:
    """Whether the installed torchvision::nms keeps 512 disjoint boxes, of four scores each shared by 128, in a
    stable sort's order (an unstable sort reorders the ties); False where the op is missing or fails."""
    corner = torch.arange(512, dtype=torch.float32)[:, None] * 10
    boxes = torch.cat([corner, corner, corner + 5, corner + 5], 1)
    scores = (torch.arange(512) % 4).float() / 4
    try:
        kept = torch.ops.torchvision.nms(boxes, scores, 0.5)
    except (AttributeError, RuntimeError):
        return False
    return torch.equal(kept, torch.sort(scores, descending=True, stable=True)[1])


# what must hold, besides the dtype, for a plan to name the runtime's op in place of the library's
_WHEN = {"torchvision::nms": ties_in_input_order}


def native_ops(graph: Graph, refused: dict[int, str]) -> int:
    """Rename in place each CPU call the runtime computes itself (the op table's `runtime_op`); returns how many."""
    renamed = 0
    for block in blocks(graph):
        for node in block.nodes:
            info = lookup(node.op)
            native = info.runtime_op
            if not native or node.uid in refused or not node.inputs or \
                    node.inputs[0].type.dtype not in info.runtime_op_dtypes or \
                    not _WHEN.get(node.op, lambda: True)():
                continue
            schema = node.attrs.get(Attr.SCHEMA, "")
            if schema.startswith(node.op):
                node.attrs[Attr.SCHEMA] = native + schema[len(node.op):]
            node.op = native
            node.attrs[Attr.EXTERN] = True
            node.attrs[Attr.NOT_LOWERED] = f"the runtime's own CPU kernel, {native}"
            renamed += 1
    return renamed
