"""In-place ops that TorchScript's own mutation removal leaves, rewritten as the functional ops they stand for.

`torch._C._jit_pass_remove_mutation` (run by the loader) keeps an in-place op when aliasing stops it: `c.mul_(c)`
(the written tensor is also read), or a write through a view, `a[0].mul_(-2.0)`. Such a node can never fuse (a
kernel writes fresh outputs) and pins the view it writes through to ATen. Here, when the written tensor is fresh
(made in the same block by an op that does not alias its inputs) and nothing else can see it change:

    y = x.op_(args)            ->  y = x.op(args); later reads of x read y
    v = x.select(d, i)             v = x.select(d, i)
    v.op_(args)                ->  s = v.op(args); x2 = x.select_scatter(s, d, i); later reads of x read x2
                                   (slice / slice_scatter too, and chains of them: x[:, 1:3] is two slices)

A write through views pays only where its scatters run in generated kernels: through ATen each scatter copies the
whole tensor for every write. So that rewrite is a recorded decomposition (decompositions.py): where a scatter does
not reach a kernel, fusion puts the in-place write back, and later reads of x read x again. Only views with literal
arguments into a tensor of static shape are rewritten at all: bounds read at run time (`im[y0:y1, x0:x1] = m`, y0
from a box) keep the write in place.

A fill of a fixed number (zero_, or fill_ from a 0-d constant tensor) becomes fill.Scalar of that number.
Anything else (a graph input or weight written in place, a tensor with other views, a write inside a loop to a
tensor made outside it, a result whose dtype would differ) stays as it was and runs through ATen.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from .decompositions import constant_nodes, decomposition
from .ir import Attr, Block, Graph, Node, Type, Value, blocks
from .lowering import get_lowering
from .op_table import lookup, may_alias, returns_alias, schema_of

_ANY = Type("Any")


def functionalize(graph: Graph) -> int:
    """Rewrite what can be rewritten, in place; returns how many in-place nodes became functional."""
    rewritten = 0
    for block in blocks(graph):
        position = 0
        while position < len(block.nodes):
            node = block.nodes[position]
            if _in_place(node) and _rewrite(graph, block, position):
                rewritten += 1
            position += 1
    return rewritten


def _in_place(node: Node) -> bool:
    base = node.op.split(".")[0]
    return base.startswith("aten::") and base.endswith("_") and not base.endswith("__") and bool(node.inputs)


def _rewrite(graph: Graph, block: Block, position: int) -> bool:
    node = block.nodes[position]
    functional = _functional(node)
    if functional is None:
        return False
    name, schema = functional
    target = node.inputs[0]
    made = {v.id: n for n in block.nodes[:position] for v in n.outputs}
    chain, base = [], target  # the views written through, innermost first, and the tensor they view
    while base.id in made and lookup(made[base.id].op).scatter_form:
        chain.append(made[base.id])
        base = chain[-1].inputs[0]
    if base.id not in made or not _fresh(made[base.id]):
        return False
    readers = [node, *chain]  # each value on the way is read by the next view in (and the target by the write)
    for value, reader in zip([target, *(view.inputs[0] for view in chain)], readers):
        if not _unaliased(block, position, value, reader):
            return False
        if value is not base and _read_after(block, position, value):
            return False  # a view read after the write: it would need rewiring too
    if chain and not _only_read(graph, node.outputs[0]):
        return False
    constants = [[_literal(graph, v) for v in view.inputs[1:]] for view in chain]
    if any(c is _UNKNOWN for args in constants for c in args):
        return False
    number = _fill_number(graph, node)
    if number is None and _result_dtype(name, schema, node, graph) != target.type.dtype:
        return False
    record = decomposition(node, "functionalize", constant_nodes(graph)) if chain else None
    pieces = [node]
    if number is not None:  # fill(x, number): its dtype is x's
        name, schema = "aten::fill.Scalar", schema_of("aten::fill.Scalar")
        filler = Value(f"{target.name}_fill", Type(type(number).__name__))
        node.inputs[1:] = [filler]
        pieces.insert(0, Node("prim::Constant", [], [filler], attrs={Attr.VALUE: number}))
        block.nodes.insert(position, pieces[0])
        position += 1
    node.op, node.attrs[Attr.SCHEMA] = name, schema
    if not chain:
        _read_instead(block, position + 1, target, node.outputs[0])
        return True
    record.output_types = {node.outputs[0].id: node.outputs[0].type}
    node.outputs[0].type = target.type  # now the view's new values, no longer an alias of it
    src, inserted = node.outputs[0], []
    for view, args in zip(chain, constants):
        inner = view.inputs[0]
        names = [a.name for a in torch._C.parse_schema(view.attrs[Attr.SCHEMA]).arguments[1:]]
        values = [Value(f"{inner.name}_{arg}", _ANY) for arg in names[:len(args)]]
        inserted += [Node("prim::Constant", [], [v], attrs={Attr.VALUE: c}) for v, c in zip(values, args)]
        written = Value(f"{inner.name}_written", inner.type)
        scatter_op = lookup(view.op).scatter_form
        inserted.append(Node(scatter_op, [inner, src, *values], [written], source=node.source,
                             attrs={Attr.SCHEMA: schema_of(scatter_op), Attr.SYNTHETIC: True}))
        src = written
    block.nodes[position + 1:position + 1] = inserted
    _read_instead(block, position + 1 + len(inserted), base, src)
    # Undoable: where a scatter does not reach a kernel, ATen's scatter copies the whole tensor for each write; the
    # in-place write (safe here, as checked above) writes only the view.
    record.anchors = {made[base.id].uid, *(view.uid for view in chain)}
    record.renames = {src.id: base}
    record.mark(pieces + inserted, [n for n in inserted if n.op != "prim::Constant"])
    return True


def _fill_number(graph: Graph, node: Node) -> Any:
    """The number an in-place fill writes, where it is fixed: 0 for zero_, and for fill_ with a 0-d constant
    tensor that every reader only reads, its value. A traced `t[...] = count` on a CUDA tensor gives that constant
    on the CPU, which no CUDA kernel may read: as a number, the fill fuses on every device."""
    if node.op == "aten::zero_":
        return 0
    if node.op != "aten::fill_.Tensor":
        return None
    value = node.inputs[1]
    producer = next((n for n in graph.walk() if n.op == "prim::Constant" and n.outputs[0].id == value.id), None)
    weight = graph.weights.get(producer.attrs.get(Attr.WEIGHT)) if producer is not None else None
    if weight is None or weight.dim() != 0 or weight.is_complex() or not _only_read(graph, value):
        return None
    return weight.item()


def _fresh(producer: Node) -> bool:
    """Whether the node makes a new tensor: an ATen op whose schema says its result aliases no input (not a
    constant or weight, not a view, not a container's item)."""
    schema = producer.attrs.get(Attr.SCHEMA)
    if not schema or not producer.op.startswith("aten::"):
        return False
    return (len(torch._C.parse_schema(schema).returns) == 1 and not returns_alias(schema)
            and not may_alias(producer.op))


def _unaliased(block: Block, position: int, value: Value, writer: Node) -> bool:
    """Whether nothing made before the write holds a second handle on `value`'s memory: every earlier reader of it
    is an ATen op that neither returns it (a view, a cast that may be a no-op) nor keeps it (an append into a list),
    by its schema; no container, loop or branch takes it, and no block outputs it. (Readers after the write are
    rewired to the new value, handles included.)"""
    earlier = [n for node in block.nodes[:position] for n in [node, *_nested(node)]]
    for n in earlier:
        if n is writer or not any(v.id == value.id for v in n.inputs):
            continue
        if not _reads_without_keeping(n, value):
            return False
    return not any(v.id == value.id for n in earlier for b in n.blocks for v in b.outputs)


def _reads_without_keeping(node: Node, value: Value) -> bool:
    schema = node.attrs.get(Attr.SCHEMA)
    if not schema or not node.op.startswith("aten::") or may_alias(node.op):
        return False
    arguments = torch._C.parse_schema(schema).arguments
    return all(a.alias_info is None for a, v in zip(arguments, node.inputs) if v.id == value.id)


def _readers(graph: Graph, value: Value) -> list[Node]:
    return [n for n in graph.walk() if any(v.id == value.id for v in n.inputs)]


def _read_after(block: Block, position: int, value: Value) -> bool:
    later = [n for node in block.nodes[position + 1:] for n in [node, *_nested(node)]]
    return any(v.id == value.id for n in later for v in n.inputs) or any(v.id == value.id for v in block.outputs)


def _only_read(graph: Graph, value: Value) -> bool:
    """Whether the in-place op's result (the view's new values, once rewritten) is only read, by ops that keep no
    handle on it, or returned: `x += y` on a slice, then x returned (GhostNet). A view of it, or a second write
    through it, would need to reach the base, which the rewrite no longer aliases."""
    return all(_reads_without_keeping(n, value) for n in _readers(graph, value))


def _nested(node: Node):
    for b in node.blocks:
        for n in b.nodes:
            yield n
            yield from _nested(n)


def _read_instead(block: Block, start: int, old: Value, new: Value) -> None:
    """Every read of `old` from block position `start` on (nested blocks and the block's outputs too) reads `new`."""
    def swap(values: list[Value]) -> list[Value]:
        return [new if v.id == old.id else v for v in values]

    for node in block.nodes[start:]:
        for n in [node, *_nested(node)]:
            n.inputs = swap(n.inputs)
            for sub in n.blocks:
                sub.outputs = swap(sub.outputs)
    block.outputs[:] = swap(block.outputs)


def _functional(node: Node) -> Optional[tuple[str, str]]:
    """The functional overload an in-place node stands for, when it exists and has a kernel lowering."""
    base, _, overload = node.op.partition(".")
    name = lookup(node.op).functional_form or base[:-1] + (f".{overload}" if overload else "")
    if get_lowering(name) is None or may_alias(name):  # t_, squeeze_...: a new shape of the same data, no write
        return None
    schema = schema_of(name)
    if not schema or returns_alias(schema):
        return None
    return name, schema


_UNKNOWN = object()


def _literal(graph: Graph, value: Value) -> Any:
    for n in graph.walk():
        if n.op == "prim::Constant" and n.outputs[0].id == value.id and Attr.VALUE in n.attrs:
            return n.attrs[Attr.VALUE]
    return _UNKNOWN


_PROBES = {"int": 1, "float": 1.0, "bool": True}


def _result_dtype(name: str, schema: str, node: Node, graph: Graph) -> Optional[str]:
    """The dtype the functional op gives for the node's arguments (run on the meta device)."""
    parsed = torch._C.parse_schema(schema)
    args, kwargs = [], {}
    for argument, v in zip(parsed.arguments, node.inputs):
        if v.type.is_tensor:
            value = _meta_tensor(graph, v)
            if value is None:
                return None
        else:
            value = _literal(graph, v)
            if value is _UNKNOWN:
                value = _PROBES.get(v.type.kind, _UNKNOWN)
            if value is _UNKNOWN:
                return None
        if argument.kwarg_only:
            kwargs[argument.name] = value
        else:
            args.append(value)
    base, _, overload = name.partition(".")
    try:
        result = getattr(getattr(torch.ops.aten, base.split("::")[1]), overload or "default")(*args, **kwargs)
    except Exception:  # noqa: BLE001 - an op the meta device cannot run: leave the node as it is
        return None
    return str(result.dtype).removeprefix("torch.") if isinstance(result, torch.Tensor) else None


def _meta_tensor(graph: Graph, v: Value) -> Optional[torch.Tensor]:
    """A meta tensor of v's dtype and shape: from its observed type, or (a constant's type is not observed) from
    the weight or tensor literal it is."""
    if v.type.dtype is not None and v.type.shape is not None and all(isinstance(d, int) for d in v.type.shape):
        return torch.empty(v.type.shape, dtype=getattr(torch, v.type.dtype), device="meta")
    for n in graph.walk():
        if n.op == "prim::Constant" and n.outputs[0].id == v.id:
            value = graph.weights.get(n.attrs[Attr.WEIGHT]) if Attr.WEIGHT in n.attrs else n.attrs.get(Attr.VALUE)
            if isinstance(value, torch.Tensor):
                return torch.empty_like(value, device="meta")
            if isinstance(value, (bool, int, float)) and v.type.dtype is not None:  # a 0-d tensor kept as a number
                return torch.empty((), dtype=getattr(torch, v.type.dtype), device="meta")
            return None
    return None
