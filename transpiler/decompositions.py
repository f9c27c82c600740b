"""Rewrites that write one op as pieces for fusion, made undoable where the pieces do not reach kernels.

split_norms writes a group or layer norm as partial sums, statistics and a pointwise normalization; split_conv_bias
takes a convolution's bias out into an add. Each pays only where its pieces run in generated kernels: through ATen
they are several launches where the model ran one op. (HDemucs on an H100, its kernels lost to a renderer's bug,
ran its 16 split group norms as 64 sums, 48 muls, 32 divs, 16 rsqrts, 16 subs and 16 adds through ATen where
TorchScript ran 16 group norms, and the package ran at 0.66x TorchScript.)

So a rewrite records, on every piece (`Attr.DECOMPOSES`), the `Decomposition` it belongs to: the node as the model
had it, the constants it read, and which pieces must run in kernels for the rewrite to pay. Then

  - fusion (fuse.py) undoes a decomposition one of whose kernel pieces the ladder refused (a kernel that failed to
    build or to verify: transpiler/fallbacks.py) or that did not lower, and fuses again; the op runs through ATen
    as one node, with the reason in the report (not as a per-row kernel: the split exists because that one is
    slower here);
  - a plan built without kernels (the ladder's every-kernel-out rungs, or kernel generation failing) undoes them
    all (`undecomposed`).

A decomposition is undone only while every one of its pieces, and every node it names as an anchor, is still in
the graph as the rewrite left it. A rewrite that renamed values (functionalize: later reads of a tensor written in
place read the scatter's result) records the renaming to take back and the types its original's outputs had.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Callable

from .ir import Attr, Graph, Node, Type, Value, blocks, clone_graph, defined


@dataclass(eq=False)
class Decomposition:
    """One op a rewrite wrote as pieces: `original` as the model had it (a copy, with the node's uid), the constant
    nodes it read (put back where the graph no longer has them), the uids of all pieces and of those that must run
    in generated kernels, and the rewrite's name for the report. `anchors`: uids of nodes outside the pieces that
    the original needs as the rewrite found them (the view an in-place write goes through, the tensor it writes);
    `renames`: value id -> the value its readers read once undone; `output_types`: value id -> the type the
    original's output had, where the rewrite retyped it."""
    original: Node
    constants: list[Node]
    rewrite: str
    pieces: set[int] = field(default_factory=set)
    kernel_pieces: set[int] = field(default_factory=set)
    anchors: set[int] = field(default_factory=set)
    renames: dict[int, Value] = field(default_factory=dict)
    output_types: dict[int, Type] = field(default_factory=dict)

    def mark(self, pieces: list[Node], kernel_pieces: list[Node]) -> list[Node]:
        """Record `pieces` (every node the rewrite made or changed in the op's place, constants included) as this
        decomposition's, `kernel_pieces` among them as those that must reach kernels. -> `pieces`."""
        self.pieces = {n.uid for n in pieces}
        self.kernel_pieces = {n.uid for n in kernel_pieces}
        assert self.kernel_pieces <= self.pieces
        for node in pieces:
            node.attrs[Attr.DECOMPOSES] = self
        return pieces


def constant_nodes(graph: Graph) -> dict[int, Node]:
    """value id -> the constant node that gives it (what `decomposition` needs to record an op's constants)."""
    return {n.outputs[0].id: n for n in graph.walk() if n.op == "prim::Constant" and len(n.outputs) == 1}


def decomposition(node: Node, rewrite: str, constants: dict[int, Node]) -> Decomposition:
    """A record of `node` as it is now: call it before a rewrite changes the node, then `mark` the pieces."""
    original = dataclasses.replace(node, inputs=list(node.inputs), outputs=list(node.outputs),
                                   attrs={k: v for k, v in node.attrs.items() if k != Attr.DECOMPOSES})
    read = [constants[v.id] for v in node.inputs if v.id in constants]
    return Decomposition(original, [dataclasses.replace(c, attrs=dict(c.attrs)) for c in read], rewrite)


def undo(graph: Graph, which: Callable[[Decomposition], bool]) -> list[Decomposition]:
    """Put back, in place, the original node of each intact decomposition `which` picks (at its first piece's place,
    after the constants it reads that the graph no longer gives), its pieces removed. -> those undone."""
    found: dict[int, set[int]] = {}
    present = {node.uid for node in graph.walk()}
    for node in graph.walk():
        record = node.attrs.get(Attr.DECOMPOSES)
        if record is not None:
            found.setdefault(record.original.uid, set()).add(node.uid)
    chosen: dict[int, Decomposition] = {}
    for node in graph.walk():
        record = node.attrs.get(Attr.DECOMPOSES)
        if (record is not None and found[record.original.uid] == record.pieces and record.anchors <= present
                and which(record)):
            chosen[record.original.uid] = record
    if not chosen:
        return []
    given = {v.id for v in defined(graph)}
    placed: set[int] = set()
    for block in blocks(graph):
        out: list[Node] = []
        for node in block.nodes:
            record = node.attrs.get(Attr.DECOMPOSES)
            if record is None or record.original.uid not in chosen:
                out.append(node)
                continue
            if record.original.uid not in placed:
                placed.add(record.original.uid)
                out += [c for c in record.constants if c.outputs[0].id not in given] + [record.original]
        block.nodes = out
    renames = {old: new for record in chosen.values() for old, new in record.renames.items()}
    for record in chosen.values():
        for v in record.original.outputs:
            v.type = record.output_types.get(v.id, v.type)
    if renames:
        _read_instead(graph, renames)
    return list(chosen.values())


def _read_instead(graph: Graph, renames: dict[int, Value]) -> None:
    """Every read of a renamed value (nodes' inputs, blocks' outputs) reads its new value, followed to the end of a
    chain of renames (two writes to one tensor: the second's scatter read the first's)."""
    def final(v: Value) -> Value:
        while v.id in renames:
            v = renames[v.id]
        return v

    for block in blocks(graph):
        for node in block.nodes:
            node.inputs = [final(v) for v in node.inputs]
        block.outputs[:] = [final(v) for v in block.outputs]


def undo_refused(graph: Graph, refused: dict[int, str]) -> dict[int, str]:
    """Undo, in place, each decomposition one of whose kernel pieces is refused a kernel. -> the refusals of the
    original nodes put back (uid -> why: they run through ATen)."""
    ids = set(refused)

    def why(record: Decomposition) -> str:
        uid = min(record.kernel_pieces & ids)
        return (f"{record.rewrite} wrote it as pieces for kernels, and one could not be a kernel ({refused[uid]}): "
                "it runs through ATen as one op")
    return {record.original.uid: why(record)
            for record in undo(graph, lambda record: bool(record.kernel_pieces & ids))}


def kernel_pieces_outside_kernels(fused: Graph, refused: dict[int, str]) -> dict[int, str]:
    """In a fused graph, the kernel pieces of decompositions that run through ATen all the same (they did not
    lower), other than those already refused: uid -> why, to refuse them and fuse again."""
    return {node.uid: node.attrs.get(Attr.NOT_LOWERED, "it did not lower") for node in fused.walk()
            if Attr.DECOMPOSES in node.attrs and node.uid in node.attrs[Attr.DECOMPOSES].kernel_pieces
            and node.uid not in refused}


def undecomposed(graph: Graph) -> Graph:
    """The graph with every decomposition undone (a copy; the graph itself where it has none): for a plan that runs
    every op through ATen."""
    if not any(Attr.DECOMPOSES in node.attrs for node in graph.walk()):
        return graph
    copy = clone_graph(graph)
    undo(copy, lambda record: True)
    return copy
