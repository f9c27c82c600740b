"""Sizes computed from data: every value that flows from an op whose output size depends on its inputs' values
(boolean-mask indexing, nonzero, unique, NMS), or from an input that is a list or dict of numbers (split sizes),
is marked, and no number read from it is folded into a constant.

Shape inference runs the model on other values at the example's shapes, so a count usually varies and becomes a
symbol on its own; but a count can come out the same in every run (`argsort(...)[:50]` over more than 50
candidates, a threshold every draw passes), and a kernel fitted to it would refuse the first input where it
differs. So a value computed from a count gets opaque sizes (ATen, which takes any size, runs what reads it),
unless the count is a mask's: count_draws.py's draws thin every such mask, so that shape inference saw those
counts, and the sizes computed from them, change; there the observed sizes stand (a count a symbol, bound at run
time by bind_sizes.py where ATen makes it, and a box's 4 coordinates a constant), and kernels take them.
"""
from __future__ import annotations

import itertools
from typing import Optional

import torch

from .infer_shapes import ShapeRecorder
from .ir import Attr, Graph, Node, Type, opaque_symbols, walk_block
from .op_table import HOST, lookup, schema_of, writes_in_place

_symbols = (f"u{i}" for i in itertools.count())  # opaque, like shape inference's own: only their identity matters
META_KINDS = ("Device", "ScalarType", "Layout", "str", "None")  # what a value computed from data may be and no count


def mark_data_dependent(graph: Graph, recorder: ShapeRecorder, counted: frozenset = frozenset()) -> set[int]:
    """Mark every value computed from a data-dependent size: no number read from it is folded into a constant, and
    its sizes are opaque, but where its only data-dependent sizes are counts that `counted` nodes set (the masks
    count_draws.py thinned, so shape inference saw each count and every size computed from one vary): there the
    observed type stands, its counts the symbols shape inference gave them (one symbol for sizes equal at every
    draw) and its other sizes constants. -> the ids of the marked values; `graph.data_sizes` gains the symbols
    that are counts."""
    values = {v.id: v for node in graph.walk() for v in node.outputs} | {
        v.id: v for node in graph.walk() for b in node.blocks for v in b.inputs}
    unlinked = _unlinked_branches(graph, recorder, values)
    opaque = _tainted(graph, {v.id for v in graph.inputs if _numbers_container(v.type)}, counted, unlinked)
    observed = _tainted(graph, set(), frozenset(), unlinked, only=counted) - opaque
    for value_id in opaque | observed:
        value = values.get(value_id)
        if value is None or value.type.kind in META_KINDS:  # (a tensor's device or dtype is no count)
            continue
        recorder.varying.add(value_id)  # a number read from it is not a constant
        if value_id in opaque:
            value.type = _opaque(value.type)
        graph.data_sizes.update(opaque_symbols(value.type))
    return opaque | observed


def _unlinked_branches(graph: Graph, recorder: ShapeRecorder, values: dict) -> set[int]:
    """The ids of the `if` branches that no run during conversion took (none of their nodes ran), where the `if`'s
    outputs are tensors whose every size is either a symbol in the taken branch or the same number in both: those
    outputs, and every value computed from them, get fresh symbols for the taken branch's (which shape inference
    may have made one with a size inside it, or before it: the candidates an `else` returned as they were), so
    that they equal nothing the other branch need not give; they are sizes the call sets (bound at the `if`,
    whichever branch ran: bind_sizes.py), and no number read from them is a constant. Their taint from the branch
    no run took is then not theirs (`_tainted`)."""
    dead_branches: set[int] = set()
    for node in graph.walk():
        if node.op != "prim::If":
            continue
        dead = [b for b in node.blocks if b.nodes and not any(n.uid in recorder.ran for n in walk_block(b))]
        if not dead or len(dead) == len(node.blocks):
            continue
        renames = _fresh_sizes(node, dead, recorder)
        if not renames:
            continue
        for name, fresh in renames.items():
            recorder.opaque_examples[fresh] = recorder.opaque_examples.get(name, 0)
        derived = _tainted(graph, {v.id for v in node.outputs}, frozenset(), only=frozenset())
        for value_id in derived:
            value = values.get(value_id)
            if value is None or value.type.kind in META_KINDS:
                continue
            recorder.varying.add(value_id)
            value.type = _renamed(value.type, renames)
            graph.data_sizes.update(n for n in opaque_symbols(value.type) if n in renames.values())
        dead_branches.update(id(b) for b in dead)
    return dead_branches


def _fresh_sizes(node: Node, dead: list, recorder: ShapeRecorder) -> dict[str, str]:
    """Symbol -> a fresh one, for each symbol in the `if`'s outputs' shapes, where every output is a tensor whose
    other sizes no branch no run took is known to give otherwise (its type, where meta kernels gave it one: a
    `where`'s count has none); {} otherwise. (A branch that gives another number there at run time meets the
    runtime's check of what kernels read: a SizeChangedError, not a wrong answer.)"""
    renames: dict[str, str] = {}
    for i, out in enumerate(node.outputs):
        t = out.type
        if not t.is_tensor or t.shape is None:
            return {}
        for b in dead:
            other = b.outputs[i].type
            if not other.is_tensor or other.shape is not None and (
                    len(other.shape) != len(t.shape)
                    or any(not isinstance(n, str) and n != m for n, m in zip(t.shape, other.shape))):
                return {}
        for n in t.shape:
            if isinstance(n, str) and n not in renames:
                renames[n] = next(recorder.symbols)
    return renames


def _renamed(t: Type, renames: dict[str, str]) -> Type:
    if t.is_tensor and t.shape is not None:
        return Type(t.kind, t.dtype, tuple(renames.get(n, n) if isinstance(n, str) else n for n in t.shape), t.device,
                    strides=t.strides if not any(isinstance(n, str) and n in renames for n in t.shape) else None)
    if t.elems:
        return Type(t.kind, t.dtype, t.shape, t.device, elems=tuple(_renamed(e, renames) for e in t.elems))
    return t


def _tainted(graph: Graph, tainted: set[int], counted: frozenset, unreached: set[int] = frozenset(),
             only: Optional[frozenset] = None) -> set[int]:
    """The ids of the values computed from a data-dependent size, starting from `tainted`: the outputs of the
    data-dependent nodes (but `counted` ones; with `only`, just those), and what is computed from them. An `if`'s
    output takes no taint from a branch no run took (`unreached`: torchvision's per-class NMS for more than 4,000
    boxes, with its uncounted `unique`): the size it has is the taken branch's, as observed, and the runtime reads
    it from the output whichever branch ran (bind_sizes.py), so the kernels after it stay."""
    producers = {v.id: node for node in graph.walk() for v in node.outputs}
    weights = graph.weights
    numbers: set[int] = set()  # numbers read out of tensors, and host arithmetic on them (`int(mask.sum()) + 1`)
    from_sizes: dict[int, bool] = {}  # tensor value id -> whether only sizes make its value (a trace's shapes)
    changed = True
    while changed:  # a loop carries a value back to its start: go round until nothing new is found
        changed = False
        for node in graph.walk():
            if only is None and _reads_a_number(node, numbers, producers, from_sizes):
                for value in node.outputs:
                    if value.id not in numbers:
                        numbers.add(value.id)
                        changed = True
            if _spreads(node, tainted, producers, weights, counted, only) or (
                    only is None and _sized_by(node, numbers)):
                for value in _written(node):
                    if value.id not in tainted and not _zero_dim(value):
                        tainted.add(value.id)
                        changed = True
            for block in node.blocks:  # block inputs: a loop's carried values are its inputs and its body's outputs
                carried = list(zip(block.inputs[1:], node.inputs[2:], block.outputs[1:])) if node.op == "prim::Loop" \
                    else []
                for inner, initial, result in carried:
                    if inner.id not in tainted and (initial.id in tainted or result.id in tainted):
                        tainted.add(inner.id)
                        changed = True
            if lookup(node.op).control_flow:
                for i, out in enumerate(node.outputs):
                    offset = 0 if node.op == "prim::If" else 1
                    if out.id not in tainted and any(b.outputs[i + offset].id in tainted for b in node.blocks
                                                     if id(b) not in unreached):
                        tainted.add(out.id)
                        changed = True
    return tainted


def _zero_dim(value) -> bool:
    """A tensor seen 0-dim at every run: it has no size for data to set. Its value may be data (one class id of a
    unique's, the largest of a mask's scores), and a size read from that value is a number read out of data
    (`_reads_a_number`); but the ops that only take it as an operand (`labels == class_id`, `x / best`) have the
    sizes of their other operands, and stay kernels."""
    return value.type.is_tensor and value.type.shape == ()


def _numbers_container(t: Type) -> bool:
    """A list, tuple or dict input of numbers (`splits: List[int]`, lengths, a config dict): sizes computed from
    its values or its length (a split into len(splits) parts, stacked) are set by each call's values, which value
    draws cannot vary as they vary an int (a list's items must fit the tensor they split), so they count as data."""
    if t.kind not in ("List", "Tuple", "Dict"):
        return False
    inner = list(t.elems)
    while inner:
        e = inner.pop()
        if e.kind in ("Tensor", "Any") or e.kind.startswith("__torch__"):
            return False
        inner += e.elems
    return True


def _spreads(node: Node, tainted: set[int], producers: dict, weights: dict, counted: frozenset,
             only: Optional[frozenset]) -> bool:
    """Whether the node's outputs (and what it writes in place) carry a data-dependent size. A tensor's rank, dtype
    or device does not (`dim = boxes.dim()`, then `stack(..., dim=dim)` in torchvision's clip_boxes_to_image)."""
    if lookup(node.op).reads_shape == "meta":
        return False
    if any(v.id in tainted for v in node.inputs):
        return True
    kind = lookup(node.op).data_dependent_size
    if kind != "tensor" or node.uid in counted or (only is not None and node.uid not in only):
        return False
    if node.op == "aten::index.Tensor":  # only a boolean mask's count is data; integer indices give their own size
        indices = producers.get(node.inputs[1].id) if len(node.inputs) > 1 else None
        if indices is not None and Attr.WEIGHTS in indices.attrs:  # a frozen list of constant indices
            return any(weights[name].dtype in (torch.bool, torch.uint8) for name in indices.attrs[Attr.WEIGHTS])
        listed = indices.inputs if indices is not None and indices.op == "prim::ListConstruct" else []
        return not listed or any(v.type.dtype in ("bool", "uint8") or v.type.dtype is None for v in listed
                                 if v.type.is_tensor)
    return True


def _reads_a_number(node: Node, numbers: set[int], producers: dict, from_sizes: dict) -> bool:
    """Whether the node's outputs are numbers read out of data: a read itself (`int(t)`, `t.item()`), or host
    arithmetic and lists on such numbers. A number read so sets the size of what takes it as a size
    (`topk(x, int((x > 0).sum()) + 1)`): value draws need not vary it (three elements, the same count at each).
    A read of a tensor only sizes make (a trace's `B, N, C = x.shape`: NumToTensor, then Int) reads no data."""
    if lookup(node.op).data_dependent_size == "scalar":
        return not all(_made_of_sizes(v, producers, from_sizes) for v in node.inputs if v.type.is_tensor)
    return not node.blocks and any(v.id in numbers for v in node.inputs) and all(
        not v.type.is_tensor for v in node.outputs)


def _made_of_sizes(value, producers: dict, memo: dict) -> bool:
    """Whether a tensor's value is made of sizes and constants only: `prim::NumToTensor` of a size, a constant, and
    arithmetic on such tensors and numbers (a trace's `C // heads`: floor_divide by the constant tensor 3)."""
    if value.id in memo:
        return memo[value.id]
    memo[value.id] = False  # (a loop's carried value: not known to be sizes)
    node = producers.get(value.id)
    made = node is not None and not node.blocks and (node.op == "prim::Constant" or lookup(node.op).wraps_number or (
        lookup(node.op).category != HOST and any(v.type.is_tensor for v in node.inputs) and
        all(_made_of_sizes(v, producers, memo) for v in node.inputs if v.type.is_tensor)
        and not lookup(node.op).data_dependent_size))
    memo[value.id] = made
    return made


def _sized_by(node: Node, numbers: set[int]) -> bool:
    """Whether a number read out of data sets the size of the node's output (its `size_args` or `sized_by`)."""
    info = lookup(node.op)
    return any(i < len(node.inputs) and node.inputs[i].id in numbers for i in (*info.size_args, *info.sized_by))


def _written(node: Node) -> list:
    """The node's outputs, and its first input where it writes that in place (a list it appends to)."""
    outs = list(node.outputs)
    if node.inputs and writes_in_place(schema_of(node.op)):
        outs.append(node.inputs[0])
    return outs


def _opaque(t: Type) -> Type:
    if t.is_tensor and t.shape is not None:
        return Type("Tensor", t.dtype, tuple(next(_symbols) for _ in t.shape), t.device)
    if t.elems:
        return Type(t.kind, t.dtype, t.shape, t.device, elems=tuple(_opaque(e) for e in t.elems))
    return t
