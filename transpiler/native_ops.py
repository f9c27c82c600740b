"""Library ops whose CPU kernel the runtime replaces with its own (deploy/cpp/src/native_ops.cpp, namespace j2t).

torchvision's CPU `roi_align` runs one thread and a channel at a time (a third of Faster R-CNN MobileNetV3-320's
call on one thread); its `nms` compares each kept box with every later one through the score order's indirection
(29 ms of SSDlite's 132 ms). The runtime's `j2t::roi_align` and `j2t::nms` take the same arguments and give the same
answers (the same operations in the same order, no FMA contraction; tests/test_native_ops.py compares them exactly),
vectorised, and roi_align parallel over boxes. A CPU plan names them (the op table's `runtime_op`) in place of
torchvision's where the input's dtype is one whose answers were checked. The order of boxes of equal scores is
torchvision's version's (0.26 sorts scores stably, 0.28 built for torch 2.13 with ATen's unstable sort), and the
package must give the boxes the TorchScript model gives beside the torchvision it was converted with: a plan names
`j2t::nms` or `j2t::nms_unstable`, whichever gives the installed torchvision's order, and neither where neither
does. The report counts them with the vendor calls.
A plan that names them needs no torchvision to load.
"""
from __future__ import annotations

import functools

from .ir import Attr, Graph, blocks
from .op_table import lookup
from .nms_facts import torchvision_sorts_stably


@functools.lru_cache(maxsize=None)
def nms_variant() -> str:
    """The runtime's nms that keeps the installed torchvision::nms's order of boxes of equal scores: "j2t::nms"
    where it sorts scores stably, "j2t::nms_unstable" where it sorts them as ATen's unstable sort does, "" otherwise
    or where the op is missing."""
    stable = torchvision_sorts_stably("cpu")
    return "" if stable is None else "j2t::nms" if stable else "j2t::nms_unstable"


# the runtime's op a plan names, where it depends on more than the dtype ("" for none)
_CHOSEN = {"torchvision::nms": nms_variant}


def native_ops(graph: Graph, refused: dict[int, str]) -> int:
    """Rename in place each CPU call the runtime computes itself (the op table's `runtime_op`); returns how many."""
    renamed = 0
    for block in blocks(graph):
        for node in block.nodes:
            info = lookup(node.op)
            if not info.runtime_op or node.uid in refused or not node.inputs or \
                    node.inputs[0].type.dtype not in info.runtime_op_dtypes:
                continue
            native = _CHOSEN[node.op]() if node.op in _CHOSEN else info.runtime_op
            if not native:
                continue
            schema = node.attrs.get(Attr.SCHEMA, "")
            if schema.startswith(node.op):
                node.attrs[Attr.SCHEMA] = native + schema[len(node.op):]
            node.op = native
            node.attrs[Attr.EXTERN] = True
            node.attrs[Attr.NOT_LOWERED] = f"the runtime's own CPU kernel, {native}"
            renamed += 1
    return renamed
