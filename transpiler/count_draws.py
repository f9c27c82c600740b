"""Draws that change the counts a boolean mask sets, so that shape inference sees which sizes are counts.

A size computed from data (a mask's count, and whatever follows from it: a slice of the first 50, a pairwise
matrix, `arange(n)`) can come out the same at every value draw: a threshold every random draw passes, more than
50 candidates at every draw. Such a size is a count all the same, and a kernel fitted to it would refuse the first
input where it differs; while a size beside it (a box's 4 coordinates, the 2 of `[:, :2]`) is a constant, and a
kernel may be fitted to it. Telling the two apart by rules would take a shape rule per op. Here the run tells:
these draws run the example again with each mask that sets a count (the boolean index of `x[mask]`, the input of
`nonzero`, `where(c)`, `masked_select`) thinned as it is made (most of its true entries set false), and the boxes
NMS keeps cut to their best few, so every such count changes, and every size computed from one changes with it; a
size that stays put at every draw is not a count. The draws are for shapes only: their outputs are not the model's
answer for those inputs. (A model that holds its own invariant between a mask and a number it counted apart, and
fails when the mask alone is thinned, fails the draw: its counts then stay opaque, as before these draws.)

Counts set otherwise (unique's, a number read out of a tensor) are not changed here: data_sizes.py keeps
every size computed from them opaque.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .ir import Graph, Node
from .op_table import lookup

KEEP_FRACTIONS = (0.5, 0.1)  # of a mask's true entries, one draw each: counts at about half, and near none


def mask_values(graph: Graph) -> dict[int, Node]:
    """The value ids of the boolean tensors that set a count -> a node that counts them; empty when none does."""
    producers = {v.id: n for n in graph.walk() for v in n.outputs}
    found: dict[int, Node] = {}
    for node in graph.walk():
        if node.op == "aten::index.Tensor" and len(node.inputs) > 1:
            listed = producers.get(node.inputs[1].id)
            candidates = listed.inputs if listed is not None and listed.op == "prim::ListConstruct" else []
        elif _counts_masks(node):
            candidates = [node.inputs[i] for i in lookup(node.op).count_masks if i < len(node.inputs)]
        else:
            continue
        for v in candidates:  # (before the first run types the graph, a mask's dtype may not be known)
            if v.type.is_tensor and v.type.dtype in ("bool", None):
                found.setdefault(v.id, node)
    return found


def counted_only_by_masks(graph: Graph, thinned: set[int]) -> set[int]:
    """The uids of the data-dependent nodes whose count these draws changed: each mask op whose masks were all
    boolean tensors, thinned (a boolean index beside integer ones is one; `where(c, x, y)` sets no count)."""
    producers = {v.id: n for n in graph.walk() for v in n.outputs}
    covered = set()
    for node in graph.walk():
        if node.op == "aten::index.Tensor" and len(node.inputs) > 1:
            listed = producers.get(node.inputs[1].id)
            if listed is None or listed.op != "prim::ListConstruct":
                continue
            tensors = [v for v in listed.inputs if v.type.is_tensor]
            if any(v.id in thinned for v in tensors) and all(v.id in thinned or v.type.dtype in ("int64", "int32")
                                                             for v in tensors):
                covered.add(node.uid)
        elif _counts_masks(node) and all(node.inputs[i].id in thinned for i in lookup(node.op).count_masks
                                         if i < len(node.inputs)):
            covered.add(node.uid)
    return covered


def _counts_masks(node: Node) -> bool:
    """Whether the node's count is its masks' (`where(c, x, y)`, with three inputs, has no count)."""
    return bool(lookup(node.op).count_masks) and (node.op != "aten::where" or len(node.inputs) == 1)


class Thinner:
    """An observer that thins each counted mask as the run makes it (in place: every op reading the mask sees the
    same count) and then passes the values on to `observer`. `thinned` holds the ids of the boolean masks it met
    (a mask with no true entry stays as it is), `changed` whether it thinned any."""

    def __init__(self, observer: Callable, nodes: list[Node], masks: dict[int, Node], keep: float, seed: int) -> None:
        self.observer, self.nodes, self.masks, self.keep = observer, nodes, masks, keep
        self.generator = torch.Generator().manual_seed(seed)
        self.thinned: set[int] = set()
        self.truncated: set[int] = set()  # uids of the nodes whose kept list (`keeps_best`) it cut
        self.changed = False

    def thin(self, value_id: int, mask: object) -> None:
        if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
            return
        if mask.any():
            drop = torch.rand(mask.shape, generator=self.generator) >= self.keep
            try:
                mask.masked_fill_(drop.to(mask.device), False)
            except RuntimeError:  # (an expanded view cannot be written: its count is not changed)
                return
            self.changed = True
        self.thinned.add(value_id)

    def inputs(self, values: list, inputs: list) -> list:
        """The inputs with each input mask thinned, on copies."""
        out = []
        for value, x in zip(values, inputs):
            if value.id in self.masks and isinstance(x, torch.Tensor):
                x = x.clone()
                self.thin(value.id, x)
            out.append(x)
        return out

    def truncate(self, node: Node, kept: object) -> None:
        if not isinstance(kept, torch.Tensor) or kept.dim() != 1:
            return
        if kept.numel():
            try:
                kept.resize_(int(kept.numel() * self.keep))
            except RuntimeError:  # (a tensor that shares its storage cannot be resized: its count is not changed)
                return
            self.changed = True
        self.truncated.add(node.uid)

    def __call__(self, node_index: int, outputs: tuple) -> Optional[object]:
        node = self.nodes[node_index]
        if lookup(node.op).keeps_best and outputs:  # (its first output resized in place: every reader sees it cut)
            self.truncate(node, outputs[0])
        for value, x in zip(node.outputs, outputs):
            if value.id in self.masks:
                self.thin(value.id, x)
        return self.observer(node_index, outputs)
