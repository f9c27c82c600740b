"""Drop kernels, ATen views and shape bookkeeping whose outputs nothing reads (fusion leaves some: see
`drop_unread`)."""
from __future__ import annotations

from collections import Counter

from .ir import Attr, KERNEL_OP, Graph, blocks
from .op_table import is_view, lookup


def drop_unread(graph: Graph) -> None:
    """Kernels and ATen views whose outputs nothing reads. Before an op that writes a tensor in place, every value
    still virtual is stored (it may read that tensor, and must see it as it was); one whose readers all fused it
    into their own kernels is then stored for nobody. A view whose readers all lowered is left unread the same way.
    Neither writes anything but its own fresh output, so dropping it changes nothing else.

    An index check (check_indices.py) guards gathers and scatters a kernel may compute, whose clamp would not
    raise; where every one it guards runs through ATen, which checks its own indices, it is dropped too, and then
    the kernel computing its condition, read by nobody."""
    lowered = {n.uid for k in graph.walk() if k.op == KERNEL_OP for n in k.attrs[Attr.FUSED]}
    for block in blocks(graph):
        block.nodes = [n for n in block.nodes if not n.attrs.get(Attr.GUARDS) or lowered & set(n.attrs[Attr.GUARDS])]
    while True:
        read = Counter(v.id for n in graph.walk() for v in n.inputs)
        read.update(v.id for n in graph.walk() for b in n.blocks for v in b.outputs)
        read.update(v.id for v in graph.outputs)
        dropped = 0
        for block in blocks(graph):
            kept = [n for n in block.nodes
                    if not (n.op == KERNEL_OP or is_view(n.op) or lookup(n.op).shape_bookkeeping
                            or n.attrs.get(Attr.SCALAR_CARRIER)) or any(read[v.id] for v in n.outputs)]
            dropped += len(block.nodes) - len(kept)
            block.nodes = kept
        if not dropped:
            return
