"""Who else can see a tensor's memory: the two analyses fusion needs before it may turn an op into indexing.

A view that becomes indexing inside a kernel is a copy, not an alias; and a list whose items a kernel reads
directly must not change after it is built. Both are decided from schemas' alias annotations (op_table), not from
op names.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Optional

from .ir import KERNEL_OP, Attr, Block, Graph, Node, walk_block
from .op_table import lookup, may_alias, returns_alias, writes_in_place, written_tensor_arguments


def sole_kernel_reader(node: Node, block: Block, position: dict[int, int],
                       read_by: dict[int, list]) -> Optional[Node]:
    """The generated kernel that alone reads `node`'s output, later in `block` (`position`: id(node) -> its index
    there), where nothing between the two writes memory or holds a block: the pair can become one kernel, the
    output never stored (an epilogue), or stored where the reader would have put it. None otherwise."""
    users = read_by.get(node.output.id, [])
    after = users[0] if len(users) == 1 else None
    if after is None or after.op != KERNEL_OP or position.get(id(after), -1) < position[id(node)]:
        return None
    between = block.nodes[position[id(node)] + 1:position[id(after)]]
    return None if any(writes(n) or n.blocks for n in between) else after


def writes(node: Node) -> str:
    """What the node writes in place: "tensor", "container" or "" (op_table.writes_in_place)."""
    return writes_in_place(node.attrs.get(Attr.SCHEMA, ""))


def mutated_views(graph: Graph) -> set[int]:
    """Views (and ops that may return their input) of any tensor written in place: lowered, they would become copies,
    and the write would miss them (a view written through must reach its base; a view read after its base is
    written must see the write), so they stay real ATen aliases. Aliases form families (a base, its views, their
    views); every alias in a family with a write is kept."""
    find, aliases, written = _families(graph)
    return {node.uid for node in aliases if find(node.inputs[0].id) in written}


def written_values(graph: Graph, within: Optional[Block] = None) -> set[int]:
    """The ids of the tensors in an alias family (see mutated_views) that something writes in place; with `within`,
    something in that block (its nested blocks too): a loop's body, where a write before or after the loop does not
    matter to what the loop reads each iteration."""
    find, _, written = _families(graph, within)
    return {v.id for node in graph.walk() for v in (*node.inputs, *node.outputs) if find(v.id) in written}


_HOLDERS = frozenset({"List", "Tuple", "Dict", "Optional", "Any"})  # types whose values may hold a tensor


def near_writes(graph: Graph) -> tuple[set[int], bool]:
    """The ids of the nodes that read or make a value that may share memory with one something writes in place,
    by any path: views, an in-place op's result, an item taken out of a container and what was put in it, a block's
    inputs and results. A CUDA graph region copies its inputs in and its outputs out, so such a node inside one
    would write to the copy, or split an alias in two (deploy/packaging/graph_regions.py). Wider than
    mutated_views' families: wrongly out of a region costs a launch; wrongly in, a wrong answer. And whether a
    write reaches an input of the graph (a whole-plan CUDA graph would write its copy of the input)."""
    holder = lambda v: v.type.kind in _HOLDERS  # noqa: E731
    held = lambda v: v.type.is_tensor or holder(v)  # noqa: E731
    # First the containers alone, to know which are opened: only an item taken out of one may alias what went in
    # (the tuple a model returns joins nothing).
    same_container, join = _union_find()
    for node in graph.walk():
        _join_passed_on(node, join, holder)
    opened = {same_container(v.id) for node in graph.walk() if _takes_items_out(node)
              for v in node.inputs if holder(v)}
    family, join = _union_find()
    written = []
    for node in graph.walk():
        if node.inputs and (may_alias(node.op) or returns_alias(node.attrs.get(Attr.SCHEMA, ""))):
            join([v for v in (node.inputs[0], *node.outputs) if held(v)])
        _join_passed_on(node, join, held)
        if any(holder(v) and same_container(v.id) in opened for v in (*node.inputs, *node.outputs)):
            join([v for v in (*node.inputs, *node.outputs) if held(v)])  # built, appended to, unpacked, indexed
        written += [node.inputs[i].id for i in written_tensor_arguments(node.attrs.get(Attr.SCHEMA, ""))
                    if i < len(node.inputs)]
    touched = {family(v) for v in written}
    near = {id(node) for node in graph.walk() if any(family(v.id) in touched for v in (*node.inputs, *node.outputs))}
    return near, any(family(v.id) in touched for v in graph.inputs)


def _union_find():
    """(find: value id -> its set's representative, join: values -> one set)."""
    parent: dict[int, int] = {}

    def find(v: int) -> int:
        while parent.get(v, v) != v:
            parent[v] = parent.get(parent[v], parent[v])  # (halving the path: a long chain of views stays cheap)
            v = parent[v]
        return v

    def join(values) -> None:
        roots = [find(v.id) for v in values]
        for root in roots[1:]:
            if root != roots[0]:
                parent[root] = roots[0]
    return find, join


def _join_passed_on(node: Node, join, kept) -> None:
    """Join what a node's blocks pass on, position by position: an if's results with each block's, a loop's
    initial values with its body's carried inputs, results and the loop's outputs."""
    if node.op == "prim::Loop" and node.blocks:
        body = node.blocks[0]
        for first, carried, result, out in zip(node.inputs[2:], body.inputs[1:], body.outputs[1:], node.outputs):
            join([v for v in (first, carried, result, out) if kept(v)])
    else:
        for block in node.blocks:
            for result, out in zip(block.outputs, node.outputs):
                join([v for v in (result, out) if kept(v)])


def _takes_items_out(node: Node) -> bool:
    """Whether the node may give an item of a container it reads: an unpack, a prim op with no schema, or a schema
    whose result may alias an argument (`aten::__getitem__.t(t[](a) list, int idx) -> t(*)`)."""
    schema = node.attrs.get(Attr.SCHEMA, "")
    return any(v.type.kind in _HOLDERS for v in node.inputs) and (
        lookup(node.op).unpacks or not schema or returns_alias(schema))


def _families(graph: Graph, within: Optional[Block] = None):
    """(find: value id -> its alias family's representative, the alias-making nodes, the families written (in
    `within`, where given))."""
    find, join = _union_find()
    aliases = [n for n in graph.walk()
               if n.inputs and (may_alias(n.op) or returns_alias(n.attrs.get(Attr.SCHEMA, "")))]
    for node in aliases:
        join([node.inputs[0], *node.outputs])
    writers = walk_block(within) if within is not None else graph.walk()
    written = {find(node.inputs[0].id) for node in writers if writes(node) == "tensor" and node.inputs}
    return find, aliases, written


def fixed_tensor_lists(graph: Graph) -> tuple[dict[int, Node], set[int]]:
    """The `prim::ListConstruct`s of tensors whose list no one can change after it is built: no user mutates it,
    and it escapes into no loop, branch, container or nested block's outputs, so lowered readers may take its
    items (a container only returned is no escape: the caller gets the list after the model is done with it).
    -> (list value id -> its node, the ids of those only cat and stack read, which need not be built)."""
    users: dict[int, list] = defaultdict(list)
    for node in graph.walk():
        for v in node.inputs:
            users[v.id].append(node)
        for sub in node.blocks:
            for v in sub.outputs:
                users[v.id].append(None)  # leaves through a block: out of sight
    returned = {v.id for v in graph.outputs}
    lists: dict[int, Node] = {}
    unbuilt: set[int] = set()
    for node in graph.walk():
        if node.op != "prim::ListConstruct" or not any(v.type.is_tensor for v in node.inputs) or \
                not all(v.type.is_tensor or v.type.kind == "None" for v in node.inputs):  # x[:, i]: [None, i]
            continue
        readers = users[node.output.id]
        if any(u is None or lookup(u.op).control_flow or writes(u)
               or (lookup(u.op).builds_container and any(v.id not in returned or users[v.id] for v in u.outputs))
               for u in readers):
            continue
        lists[node.output.id] = node
        if readers and node.output.id not in returned and all(lookup(u.op).reads_tensor_list for u in readers):
            unbuilt.add(node.output.id)
    return lists, unbuilt
