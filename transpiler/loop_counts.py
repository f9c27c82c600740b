"""The counts of a loop's per-iteration masks, read once before the loop. A detector's per-class loop

    for label in range(1, C):
        keep = scores[:, label] > thresh          (a mask over one slice of a tensor the loop does not change)
        where = nonzero(keep)                     (on CUDA, a host synchronisation per iteration)

becomes

    counts = (scores > thresh).sum(0).tolist()    (before the loop: every slice's count, one synchronisation)
    for label in range(1, C):
        keep = scores[:, label] > thresh
        where = nonzero_static(keep, size=counts[label])   (no synchronisation)

and so does torchvision's per-class NMS loop, whose mask compares every label with one value of a tensor:

    for class_id in torch.unique(labels):         (class_id = unique[i])
        where(labels == class_id)                 ->  nonzero_static(labels == class_id, size=counts[i]).unbind(1)

    with counts = searchsorted(sort(labels), unique, right=True) - searchsorted(sort(labels), unique) before it.

ATen's `nonzero` (and `where(mask)`, which is `nonzero(mask).unbind(1)`) must read its count back to the host to
size its output, and waits for everything queued before it; torchvision's SSD did so 90 times per image, a call
spent mostly waiting. `nonzero_static` with the count as its size gives the same indices in the same order, and the
loop's launches then queue without a wait. The counts are the masks', exactly: a comparison over the whole tensor
computes each slice's elements as the loop's comparison does (one elementwise op, the same operands), a sum of
booleans is exact, and for integers the number equal to a value is the number at most it less the number below it.

The same holds for numbers a loop reads out of a tensor it does not change (Mask R-CNN's paste loop reads each
box's corners about ten times, `int(box[2] - box[0] + 1)`, each read a wait): `read_ints_before_loops` reads the
whole integer tensor once before the loop (`tolist()`), and each read in the loop becomes host arithmetic on those
numbers: int64 sums, differences, products and negations, as the 0-dim int64 tensor ops computed them.

Taken only where that holds: the mask is one comparison, either of a slice `select(src, dim, i)` with numbers or
0-dim tensors, or (equality of integers) of a tensor with `values[i]` of a 1-dim tensor of its dtype; `i` is the
loop's counter, or `range(start, end, step)`'s value for it; every operand is made outside the loop (or by views of
such values inside it, which are made again before it), and nothing in the loop writes any of them in place
(alias_analysis.written_values within its body: a write before the loop is done when the counts are read). Runs
after the sizes are typed and bound (it keeps every value's size): the nonzeros are shared_masks.py's, for the masks
an indexing reads, and the model's own. For CUDA packages only: the CPU waits for nothing, and there counting first
and `nonzero_static` cost more than `nonzero` (docs/benchmarks.md).

A read of numbers is taken where the tensor is int64 with two dims, made outside the loop and not written in it,
its row picked by the loop's counter, and the loop runs once per row (a loop of three iterations over a long tensor
keeps its reads); every op between the element and the read is one of the int64 ops above. On every device: on the
CPU it saves the 0-dim tensor ops.
"""
from __future__ import annotations

from typing import Callable, Optional

from .alias_analysis import written_values
from .ir import Attr, Block, Graph, Node, Type, Value, blocks, literals, walk_block
from .op_table import VIEW, lookup, schema_of

INTEGERS = frozenset({"int8", "int16", "int32", "int64", "uint8"})
INT = Type("int")
INTS = Type("List", elems=(INT,))


def count_masks_before_loops(graph: Graph) -> int:
    """Rewrite in place; returns how many nonzeros (and wheres) now take a count read before their loop."""
    numbers = literals(graph)
    return _before_each_loop(graph, lambda loop, written: _hoist(loop, written, numbers))


def _before_each_loop(graph: Graph, rewrite: Callable[[Node, set[int]], tuple[list[Node], int]]) -> int:
    """`rewrite(loop, what the loop writes)` for every loop, its nodes put just before the loop; -> how many
    rewrites. (What the loop writes, not the graph: a write before the loop is done when its values are read.)"""
    done = 0
    for block in blocks(graph):
        out: list[Node] = []
        for node in block.nodes:
            if node.op == "prim::Loop":
                before, rewritten = rewrite(node, written_values(graph, node.blocks[0]))
                out += before
                done += rewritten
            out.append(node)
        block.nodes = out
    return done


class _Before:
    """The nodes made before the loop: copies of the body's loop-invariant views, and the counts."""

    def __init__(self, made: dict[int, Node], inside: set[int]) -> None:
        self.made, self.inside = made, inside
        self.nodes: list[Node] = []
        self.clones: dict[int, Value] = {}

    def outside(self, value: Value) -> Value:
        """`value` as made before the loop (itself, where the loop does not make it)."""
        if value.id not in self.inside:
            return value
        if value.id not in self.clones:
            node = self.made[value.id]
            copy = Node(node.op, [self.outside(v) for v in node.inputs],
                        [Value(f"{o.name}_before", o.type) for o in node.outputs],
                        attrs={**node.attrs, Attr.SYNTHETIC: True}, source=node.source)
            self.nodes.append(copy)
            self.clones.update({o.id: c for o, c in zip(node.outputs, copy.outputs)})
        return self.clones[value.id]

    def add(self, op: str, inputs: list[Value], outs: list[Value], at: Optional[Node], **attrs) -> list[Value]:
        schema = {Attr.SCHEMA: schema_of(op)} if op.startswith("aten::") else {}
        self.nodes.append(Node(op, inputs, outs, source=at.source if at is not None else None,
                               attrs={Attr.SYNTHETIC: True, **schema, **attrs}))
        return outs

    def constant(self, name: str, literal, kind: Type) -> Value:
        return self.add("prim::Constant", [], [Value(name, kind)], None, **{Attr.VALUE: literal})[0]

    def tolist(self, tensor: Value, rank: int, at: Optional[Node]) -> Value:
        """prim::tolist: the host's (nested) list of an int tensor's values (the one synchronisation)."""
        name, kind = tensor.name, INT
        for _ in range(rank):
            kind = Type("List", elems=(kind,))
        return self.add("prim::tolist", [tensor, self.constant(f"{name}_rank", rank, INT),
                                         self.constant(f"{name}_ints", 0, INT)], [Value(f"{name}_list", kind)], at)[0]


def _hoist(loop: Node, written: set[int], numbers: dict) -> tuple[list[Node], int]:
    """The nodes to run before `loop` (each hoistable nonzero or where in its body rewritten); and how many."""
    body = loop.blocks[0]
    made = {v.id: n for n in body.nodes for v in n.outputs}
    inside = _defined_inside(body)
    before = _Before(made, inside)
    done = 0
    for node in list(body.nodes):
        form = lookup(node.op).nonzero_form
        if not form or len(node.inputs) != 1:
            continue
        mask = node.inputs[0]
        if form == "unbound" and not (mask.type.is_tensor and mask.type.shape):
            continue  # (a 0-dim condition's where is nonzero of it unsqueezed)
        found = _slice_mask(mask, body, made, inside, written, numbers) or _value_mask(mask, body, made, inside,
                                                                                        written)
        if found is None:
            continue
        counts_before, counter = found
        counts = counts_before(before)
        _static(node, form, counts, counter, body)
        done += 1
    return before.nodes, done


def _static(node: Node, form: str, counts: Value, counter: Value, body: Block) -> None:
    """The body's `nonzero(mask)` (or `where(mask)`) as nonzero_static sized by this iteration's count."""
    name = node.outputs[0].name
    count, fill = Value(f"{name}_count", INT), Value(f"{name}_fill", INT)
    at = body.nodes.index(node)
    made = [Node("aten::__getitem__.t", [counts, counter], [count], source=node.source,
                 attrs={Attr.SCHEMA: schema_of("aten::__getitem__.t"), Attr.SYNTHETIC: True}),
            Node("prim::Constant", [], [fill], attrs={Attr.VALUE: -1})]
    mask = node.inputs[0]
    if form == "unbound":  # ATen's where(mask): nonzero(mask).unbind(1)
        where = Value(f"{name}_where", Type("Tensor", "int64", None, mask.type.device))
        one = Value(f"{name}_dim1", INT)
        made += [Node("aten::nonzero_static", [mask, count, fill], [where], source=node.source,
                      attrs={Attr.SCHEMA: schema_of("aten::nonzero_static"), Attr.SYNTHETIC: True}),
                 Node("prim::Constant", [], [one], attrs={Attr.VALUE: 1})]
        node.op, node.inputs = "aten::unbind.int", [where, one]
        node.attrs[Attr.SCHEMA] = schema_of("aten::unbind.int")
    else:
        node.op, node.inputs = "aten::nonzero_static", [mask, count, fill]
        node.attrs[Attr.SCHEMA] = schema_of("aten::nonzero_static")
    body.nodes[at:at] = made


def _defined_inside(body: Block) -> set[int]:
    return {v.id for v in body.inputs} | {v.id for n in walk_block(body) for v in (*n.outputs, *(
        i for b in n.blocks for i in b.inputs))}


Found = Optional[tuple[Callable[[_Before], Value], Value]]  # (makes the counts before the loop, the loop's index)


def _slice_mask(mask: Value, body: Block, made: dict, inside: set[int], written: set[int], numbers: dict) -> Found:
    """`mask` a comparison of a slice the loop picks by its counter with loop-invariant numbers or 0-dim tensors."""
    compare = made.get(mask.id)
    if compare is None or not lookup(compare.op).compares or len(compare.inputs) != 2 or mask.id in written:
        return None
    column, other = compare.inputs
    pick = made.get(column.id)
    if pick is None or pick.op != "aten::select.int" or column.id in written:
        return None
    src, dim, counter = pick.inputs
    rank = len(src.type.shape) if src.type.is_tensor and src.type.shape is not None else 0
    if rank < 2 or type(numbers.get(dim.id)) is not int or not -rank <= numbers[dim.id] < rank:
        return None  # (a slice of a 1-dim tensor is 0-dim: a comparison types it otherwise than the whole tensor)
    if not (_counter(counter, body, made, inside) and _invariant(src, made, inside, written)
            and _invariant(other, made, inside, written)):
        return None
    if other.type.is_tensor and other.type.shape != ():
        return None  # (a tensor operand broadcasts against the slice: only a 0-dim one broadcasts alike to the whole)
    dim = numbers[dim.id] % rank

    def counts_before(before: _Before) -> Value:
        """The comparison over all of `src`, summed over every dim but `dim`, as a list of ints."""
        name, device = mask.name, src.type.device
        whole = before.add(compare.op, [before.outside(src), before.outside(other)],
                           [Value(f"{name}_all", Type("Tensor", "bool", src.type.shape, device))], compare)[0]
        others = [before.constant(f"{name}_dim{d}", d, INT) for d in range(rank) if d != dim]
        dims = before.add("prim::ListConstruct", others, [Value(f"{name}_dims", INTS)], compare)[0]
        keepdim, dtype = before.constant(f"{name}_keepdim", False, Type("bool")), before.constant(
            f"{name}_dtype", None, Type("None"))
        summed = before.add("aten::sum.dim_IntList", [whole, dims, keepdim, dtype],
                            [Value(f"{name}_counts", Type("Tensor", "int64", (src.type.shape[dim],), device))],
                            compare)[0]
        return before.tolist(summed, 1, compare)
    return counts_before, counter


def _value_mask(mask: Value, body: Block, made: dict, inside: set[int], written: set[int]) -> Found:
    """`mask` is `x == values[i]` (either way round): integers of one dtype, `values` a 1-dim tensor the loop
    picks from by its counter, `x` loop-invariant."""
    compare = made.get(mask.id)
    if compare is None or compare.op != "aten::eq.Tensor" or len(compare.inputs) != 2 or mask.id in written:
        return None
    for x, picked in (compare.inputs, reversed(compare.inputs)):
        pick = made.get(picked.id)
        if pick is None or pick.op != "aten::select.int" or picked.type.shape != ():
            continue
        values, _, counter = pick.inputs
        if (values.type.shape is not None and len(values.type.shape) == 1 and x.type.shape
                and x.type.dtype in INTEGERS and values.type.dtype == x.type.dtype
                and _counter(counter, body, made, inside) and _invariant(values, made, inside, written)
                and _invariant(x, made, inside, written) and picked.id not in written):
            return _equal_counts(mask, compare, x, values), counter
    return None


def _equal_counts(mask: Value, compare: Node, x: Value, values: Value) -> Callable[[_Before], Value]:
    def counts_before(before: _Before) -> Value:
        """How many of `x` equal each of `values`: searchsorted in sorted `x`, right side less left side."""
        name, device = mask.name, x.type.device
        every = Type("Tensor", x.type.dtype, None, device)
        flat = before.add("aten::reshape", [before.outside(x), before.add(
            "prim::ListConstruct", [before.constant(f"{name}_all", -1, INT)], [Value(f"{name}_flat_shape", INTS)],
            compare)[0]], [Value(f"{name}_flat", every)], compare)[0]
        ordered = before.add("aten::sort", [flat, before.constant(f"{name}_last", -1, INT),
                                            before.constant(f"{name}_ascending", False, Type("bool"))],
                             [Value(f"{name}_sorted", every), Value(f"{name}_order", Type("Tensor", "int64", None,
                                                                                           device))], compare)[0]
        found = Type("Tensor", "int64", values.type.shape, device)
        ends = [before.add("aten::searchsorted.Tensor", [
            ordered, before.outside(values), before.constant(f"{name}_int64_{side}", False, Type("bool")),
            before.constant(f"{name}_right_{side}", side == "after", Type("bool")),
            before.constant(f"{name}_side_{side}", None, Type("None")),
            before.constant(f"{name}_sorter_{side}", None, Type("None"))], [Value(f"{name}_{side}", found)],
            compare)[0] for side in ("before", "after")]
        counts = before.add("aten::sub.Tensor", [ends[1], ends[0], before.constant(f"{name}_alpha", 1, INT)],
                            [Value(f"{name}_counts", found)], compare)[0]
        return before.tolist(counts, 1, compare)
    return counts_before




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


# --- integers read out of a loop-invariant tensor ------------------------------------------------------------------

def read_ints_before_loops(graph: Graph) -> int:
    """Rewrite in place; returns how many reads of a number in a loop became host arithmetic on numbers read
    before it."""
    numbers = literals(graph)
    producers = {v.id: n for n in graph.walk() for v in n.outputs}
    return _before_each_loop(graph, lambda loop, written: _read_rows_before(loop, written, numbers, producers))


def _read_rows_before(loop: Node, written: set[int], numbers: dict, producers: dict) -> tuple[list[Node], int]:
    body = loop.blocks[0]
    made = {v.id: n for n in body.nodes for v in n.outputs}
    inside = _defined_inside(body)
    lists: dict[int, Value] = {}  # id of the tensor read -> its numbers, read before the loop
    rows: dict[tuple[int, int], Value] = {}  # (tensor id, counter id) -> this iteration's row of numbers
    before: list[Node] = []
    replaced: set[int] = set()  # the uids of the tensor ops the rewritten reads read
    done = 0
    for read in [n for n in body.nodes if lookup(n.op).reads_int and len(n.inputs) == 1]:
        host: list[Node] = []
        visited: list[Node] = []
        # what this read adds to the loop's lists and rows: kept only if the whole read is rewritten (a row made for
        # a read that then fails is in no node the body runs)
        new_lists: dict[int, Value] = {}
        new_rows: dict[tuple[int, int], Value] = {}
        new_before = _Before(made, inside)

        def number(value: Value) -> Optional[Value]:
            """`value` (a 0-dim int64 tensor) as host nodes computing it, appended to `host`; None if it is not
            made of elements of loop-invariant rows and numbers."""
            node = made.get(value.id)
            if node is None or not _int64_scalar(value):
                return None
            visited.append(node)
            if node.op == "aten::select.int":
                row, dim, index = node.inputs
                picked = made.get(row.id)
                if (numbers.get(dim.id) != 0 or type(numbers.get(index.id)) is not int or picked is None
                        or picked.op != "aten::select.int"):
                    return None
                src, src_dim, counter = picked.inputs
                if (numbers.get(src_dim.id) != 0 or not _counter(counter, body, made, inside)
                        or src.id in inside or src.id in written or src.type.dtype != "int64"
                        or src.type.shape is None or len(src.type.shape) != 2
                        or not _over_rows(loop.inputs[0], src, numbers, producers)):
                    return None
                key = (src.id, counter.id)
                row_list = rows.get(key) or new_rows.get(key)
                if row_list is None:
                    listed = lists.get(src.id) or new_lists.get(src.id)
                    if listed is None:
                        listed = new_lists[src.id] = new_before.tolist(src, 2, None)
                    row_list = new_rows[key] = _host(host, "aten::__getitem__.t", [listed, counter],
                                                     Value(f"{src.name}_row", INTS), node)
                return _host(host, "aten::__getitem__.t", [row_list, index], Value(f"{value.name}_n", INT), node)
            op = lookup(node.op).on_host_ints  # (alpha, where the op takes one, must be 1)
            if not op or (len(node.inputs) == 3 and numbers.get(node.inputs[2].id) != 1):
                return None
            operands = []
            for v in node.inputs[:2 if op != "aten::neg.int" else 1]:
                operands.append(number(v) if v.type.is_tensor else v if v.type.kind == "int" else None)
                if operands[-1] is None:
                    return None
            return _host(host, op, operands, Value(f"{value.name}_n", INT), node)

        result = number(read.inputs[0])
        if result is None:
            continue
        lists.update(new_lists)
        rows.update(new_rows)
        before += new_before.nodes
        host[-1].outputs = [read.outputs[0]]  # the last host op gives the read's value
        at = body.nodes.index(read)
        body.nodes[at:at + 1] = host
        replaced.update(n.uid for n in visited)
        done += 1
    _drop_unread(body, replaced)
    return before, done


def _over_rows(trips: Value, src: Value, numbers: dict, producers: dict) -> bool:
    """Whether the loop runs once per row of `src` (its trip count is src's rows, or the fewest of several tensors',
    as `zip` gives it): then reading all of `src` before it costs no more than the loop's own reads. A loop of a few
    iterations over a tensor of many rows keeps its reads."""
    if numbers.get(trips.id) is not None:
        return numbers[trips.id] == src.type.shape[0]
    node = producers.get(trips.id)
    if node is None:
        return False
    if node.op == "prim::min.int":
        return any(_over_rows(v, src, numbers, producers) for v in node.inputs)
    if node.op == "prim::min.self_int":  # min of a list of counts
        listed = producers.get(node.inputs[0].id)
        return listed is not None and any(_over_rows(v, src, numbers, producers) for v in listed.inputs)
    return ((node.op == "aten::len.Tensor" and node.inputs[0] is src)
            or (node.op == "aten::size.int" and node.inputs[0] is src and numbers.get(node.inputs[1].id) == 0))


def _int64_scalar(value: Value) -> bool:
    return value.type.is_tensor and value.type.dtype == "int64" and value.type.shape == ()


def _host(host: list[Node], op: str, inputs: list[Value], out: Value, at: Node) -> Value:
    host.append(Node(op, inputs, [out], source=at.source, attrs={Attr.SCHEMA: schema_of(op), Attr.SYNTHETIC: True}))
    return out


def _drop_unread(body: Block, candidates: set[int]) -> None:
    """The 0-dim tensor ops that only the rewritten reads read: dropped, so that the loop no longer launches them.
    (Each is pure: an int64 sum, difference, product, negation or element; what else reads one keeps it.)"""
    while True:
        read = {v.id for n in walk_block(body) for v in n.inputs}
        read.update(v.id for n in walk_block(body) for b in n.blocks for v in b.outputs)
        read.update(v.id for v in body.outputs)
        kept = [n for n in body.nodes if n.uid not in candidates or any(v.id in read for v in n.outputs)]
        if len(kept) == len(body.nodes):
            return
        body.nodes = kept
