"""The counts of a loop's per-slice masks, read once before the loop: a detector's per-class loop

    for label in range(1, C):
        keep = scores[:, label] > thresh          (a mask over one slice of a tensor the loop does not change)
        where = nonzero(keep)                     (on CUDA, a host synchronisation per iteration)

becomes

    counts = (scores > thresh).sum(0).tolist()    (before the loop: every slice's count, one synchronisation)
    for label in range(1, C):
        keep = scores[:, label] > thresh
        where = nonzero_static(keep, size=counts[label])   (no synchronisation)

ATen's `nonzero` must read its count back to the host to size its output, and waits for everything queued before
it; torchvision's SSD did so 90 times per image, a call spent mostly waiting. `nonzero_static` with the count
as its size gives the same indices in the same order, and the loop's launches then queue without a wait. The
count is the mask's, bit for bit: the comparison over the whole tensor computes each slice's elements as the loop's
comparison does (one elementwise op, the same operands), and a sum of booleans is exact.

Taken only where that holds: the mask is one comparison of a slice `select(src, dim, i)` (i the loop's counter, or
`range(start, end, step)`'s value for it) with numbers or 0-dim tensors made outside the loop; `src` is made
outside the loop (or by views of such values inside it, which are made again before it); and nothing writes
any of them in place (alias_analysis.written_values). Runs after shared_masks.py, which gives the masks an
indexing reads their nonzero.
"""
from __future__ import annotations

from typing import Optional

from .alias_analysis import written_values
from .ir import Attr, Block, Graph, Node, Type, Value, blocks, literals
from .op_table import VIEW, lookup, schema_of

COMPARISONS = frozenset(f"aten::{op}.{form}" for op in ("gt", "ge", "lt", "le", "eq", "ne")
                        for form in ("Scalar", "Tensor"))
INT = Type("int")


def count_masks_before_loops(graph: Graph) -> int:
    """Rewrite in place; returns how many nonzeros now take a count read before their loop."""
    written = written_values(graph)
    numbers = literals(graph)
    done = 0
    for block in blocks(graph):
        out: list[Node] = []
        for node in block.nodes:
            if node.op == "prim::Loop":
                before, hoisted = _hoist(node, written, numbers)
                out += before
                done += hoisted
            out.append(node)
        block.nodes = out
    return done


def _hoist(loop: Node, written: set[int], numbers: dict) -> tuple[list[Node], int]:
    """The nodes to run before `loop` (each hoistable nonzero in its body rewritten); and how many."""
    body = loop.blocks[0]
    made = {v.id: n for n in body.nodes for v in n.outputs}
    inside = _defined_inside(body)
    before: list[Node] = []
    clones: dict[int, Value] = {}
    done = 0
    for nz in list(body.nodes):
        if nz.op != "aten::nonzero" or len(nz.inputs) != 1:
            continue
        found = _slice_mask(nz.inputs[0], body, made, inside, written, numbers)
        if found is None:
            continue
        compare, src, dim, counter = found
        counts = _counts_before(compare, src, dim, before, clones, made, inside)
        at = body.nodes.index(nz)
        count = Value(f"{nz.outputs[0].name}_count", INT)
        fill = Value(f"{nz.outputs[0].name}_fill", INT)
        body.nodes[at:at] = [
            Node("aten::__getitem__.t", [counts, counter], [count], source=nz.source,
                 attrs={Attr.SCHEMA: schema_of("aten::__getitem__.t"), Attr.SYNTHETIC: True}),
            Node("prim::Constant", [], [fill], attrs={Attr.VALUE: -1})]
        nz.op = "aten::nonzero_static"
        nz.inputs = [nz.inputs[0], count, fill]
        nz.attrs[Attr.SCHEMA] = schema_of("aten::nonzero_static")
        done += 1
    return before, done


def _defined_inside(body: Block) -> set[int]:
    ids = {v.id for v in body.inputs}
    pending = list(body.nodes)
    while pending:
        node = pending.pop()
        ids.update(v.id for v in node.outputs)
        for block in node.blocks:
            ids.update(v.id for v in block.inputs)
            pending += block.nodes
    return ids


def _slice_mask(mask: Value, body: Block, made: dict, inside: set[int], written: set[int],
                numbers: dict) -> Optional[tuple[Node, Value, int, Value]]:
    """(the comparison, the sliced tensor, the slice's dim, the loop value that picks the slice) where `mask` is a
    comparison of a slice the loop picks by its counter with loop-invariant operands; else None."""
    compare = made.get(mask.id)
    if compare is None or compare.op not in COMPARISONS or len(compare.inputs) != 2 or mask.id in written:
        return None
    column, other = compare.inputs
    pick = made.get(column.id)
    if pick is None or pick.op != "aten::select.int" or column.id in written:
        return None
    src, dim, counter = pick.inputs
    rank = len(src.type.shape) if src.type.is_tensor and src.type.shape is not None else 0
    if rank < 2 or type(numbers.get(dim.id)) is not int or not -rank <= numbers[dim.id] < rank:
        return None  # (a slice of a 1-dim tensor is 0-dim: a comparison types it otherwise than the whole tensor)
    if not _counter(counter, body, made, inside):
        return None
    if not _invariant(src, made, inside, written) or not _invariant(other, made, inside, written):
        return None
    if other.type.is_tensor and other.type.shape != ():
        return None  # (a tensor operand broadcasts against the slice: only a 0-dim one broadcasts alike to the whole)
    return compare, src, numbers[dim.id] % rank, counter


def _counter(value: Value, body: Block, made: dict, inside: set[int]) -> bool:
    """Whether `value` is the loop's counter, or range()'s value for it (`start + counter * step`)."""
    if value is body.inputs[0]:
        return True
    node = made.get(value.id)
    return (node is not None and node.op == "aten::__derive_index" and node.inputs[0] is body.inputs[0]
            and all(v.id not in inside or _constant(made.get(v.id)) for v in node.inputs[1:]))


def _constant(node: Optional[Node]) -> bool:
    return node is not None and node.op == "prim::Constant" and Attr.VALUE in node.attrs


def _invariant(value: Value, made: dict, inside: set[int], written: set[int]) -> bool:
    """Made before the loop, or in its body by constants and views of such values; and never written in place."""
    if value.id in written:
        return False
    if value.id not in inside:
        return True
    node = made.get(value.id)
    if node is None or node.blocks:
        return False
    if _constant(node):
        return True
    return lookup(node.op).category == VIEW and all(_invariant(v, made, inside, written) for v in node.inputs)


def _counts_before(compare: Node, src: Value, dim: int, before: list[Node], clones: dict[int, Value], made: dict,
                   inside: set[int]) -> Value:
    """Before the loop: the comparison over all of `src`, summed over every dim but `dim`, as a list of ints."""
    def outside(value: Value) -> Value:
        if value.id not in inside:
            return value
        if value.id not in clones:
            node = made[value.id]
            inputs = [outside(v) for v in node.inputs]
            copy = Node(node.op, inputs, [Value(f"{o.name}_before", o.type) for o in node.outputs],
                        attrs={**node.attrs, Attr.SYNTHETIC: True}, source=node.source)
            before.append(copy)
            clones.update({o.id: c for o, c in zip(node.outputs, copy.outputs)})
        return clones[value.id]

    src_before = outside(src)
    operands = [src_before if v is compare.inputs[0] else outside(v) for v in compare.inputs]
    shape, device = src.type.shape, src.type.device
    name = compare.outputs[0].name

    def add(op: str, inputs: list[Value], out: Value, **attrs) -> Value:
        before.append(Node(op, inputs, [out], source=compare.source, attrs={Attr.SYNTHETIC: True, **attrs}))
        return out

    def constant(suffix: str, literal, kind: Type) -> Value:
        return add("prim::Constant", [], Value(f"{name}_{suffix}", kind), **{Attr.VALUE: literal})

    whole = add(compare.op, operands, Value(f"{name}_all", Type("Tensor", "bool", shape, device)),
                **{Attr.SCHEMA: compare.attrs.get(Attr.SCHEMA) or schema_of(compare.op)})
    others = [constant(f"dim{d}", d, INT) for d in range(len(shape)) if d != dim]
    dims = add("prim::ListConstruct", others, Value(f"{name}_dims", Type("List", elems=(INT,))))
    summed = add("aten::sum.dim_IntList",
                 [whole, dims, constant("keepdim", False, Type("bool")), constant("dtype", None, Type("None"))],
                 Value(f"{name}_counts", Type("Tensor", "int64", (shape[dim],), device)),
                 **{Attr.SCHEMA: schema_of("aten::sum.dim_IntList")})
    return add("prim::tolist", [summed, constant("rank", 1, INT), constant("elem", 0, INT)],
               Value(f"{name}_count_list", Type("List", elems=(INT,))))
