"""A boolean mask that indexes several tensors is counted once: `score[keep]; box[keep]` becomes

    where = nonzero(keep)                  (the count: on CUDA, one host synchronisation)
    score[where[:, 0]]; box[where[:, 0]]   (gathers by integer indices: no synchronisation)

ATen turns each boolean index into its nonzero's columns itself (`expandTensors`), once per indexing: a detector's
per-class loop (torchvision's SSD: `score[keep_idxs]`, `boxes[keep_idxs]`, 90 classes a call) waited for the GPU
twice per class for one count. The gathers read the same elements in the same order, so the outputs are ATen's bit
for bit; the integer indices come from the mask itself, so they are in range and need no check (this pass runs
after check_indices.py).

A mask that may be written in place between its readers (it, or a view of it, is written anywhere) is left alone,
and so is one the block reads only once: there the rewrite would add an op and save no count.
"""
from __future__ import annotations

from collections import defaultdict

from .alias_analysis import written_values
from .ir import Attr, Graph, Node, Type, Value, blocks
from .op_table import schema_of


def share_mask_counts(graph: Graph) -> int:
    """Rewrite in place; returns how many indexings now read a shared count."""
    lists = {n.outputs[0].id: n for n in graph.walk() if n.op == "prim::ListConstruct"}
    written = written_values(graph)
    done = 0
    for block in blocks(graph):
        readers: dict[int, list[Node]] = defaultdict(list)  # mask value id -> the indexings in this block
        masks: dict[int, Value] = {}
        for node in block.nodes:
            listed = lists.get(node.inputs[1].id) if node.op == "aten::index.Tensor" and len(node.inputs) == 2 else None
            for v in listed.inputs if listed is not None else ():
                if _is_mask(v) and v.id not in written and node not in readers[v.id]:
                    readers[v.id].append(node)
                    masks[v.id] = v
        shared = {mask: nodes for mask, nodes in readers.items() if len(nodes) > 1}
        if not shared:
            continue
        first: dict[int, list[int]] = defaultdict(list)  # node uid -> the masks it is the first to read
        for mask, nodes in shared.items():
            first[nodes[0].uid].append(mask)
        columns: dict[int, list[Value]] = {}  # mask value id -> its nonzero's columns
        out: list[Node] = []
        for node in block.nodes:
            for mask in first.get(node.uid, ()):
                out += _count(masks[mask], node, columns)
            listed = lists.get(node.inputs[1].id) if node.op == "aten::index.Tensor" and len(node.inputs) == 2 else None
            if listed is not None and any(v.id in columns for v in listed.inputs):
                items = [c for v in listed.inputs for c in columns.get(v.id, [v])]
                # a list of its own: the old one may have other readers (the dead one is dropped later)
                rebuilt = Node("prim::ListConstruct", items, [Value(f"{listed.outputs[0].name}_counted",
                                                                     listed.outputs[0].type)],
                               attrs=dict(listed.attrs), source=node.source)
                out.append(rebuilt)
                node.inputs[1] = rebuilt.outputs[0]
                done += 1
            out.append(node)
        block.nodes = out
    return done


def _is_mask(v: Value) -> bool:
    return v.type.is_tensor and v.type.dtype == "bool" and v.type.shape is not None and len(v.type.shape) >= 1


def _count(mask: Value, at: Node, columns: dict[int, list[Value]]) -> list[Node]:
    """The nonzero of `mask` and its columns (the integer index of each of the mask's dims), before `at`."""
    device = mask.type.device
    index = Type("Tensor", "int64", None, device)
    pieces: list[Node] = []

    def constant(name: str, literal: int) -> Value:
        made = Value(f"{mask.name}_{name}", Type("int"))
        pieces.append(Node("prim::Constant", [], [made], attrs={Attr.VALUE: literal}))
        return made

    def call(op: str, inputs: list[Value], name: str) -> Value:
        made = Value(f"{mask.name}_{name}", index)
        pieces.append(Node(op, inputs, [made], source=at.source,
                           attrs={Attr.SCHEMA: schema_of(op), Attr.SYNTHETIC: True}))
        return made

    where = call("aten::nonzero", [mask], "where")
    one = constant("dim1", 1)
    columns[mask.id] = [call("aten::select.int", [where, one, constant(f"col{d}", d)], f"col{d}")
                        for d in range(len(mask.type.shape))]
    return pieces
