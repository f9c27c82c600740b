"""Where invented integer inputs are valid, read from the graph: conversion's draws stay where the model accepts them.

Conversion draws inputs of its own (verification's fresh draw, the dims' other sizes, other values), and an integer
tensor drawn without regard to what it means crashes or asserts in the model: an index past its embedding table,
offsets out of order, lengths longer than the padded time axis. So before drawing, the graph says what each integer
input is used as:

- an index into an embedding's table, `index_select`'s, `gather`'s, `scatter`'s or `index_add`'s dim, or `x[idx]`:
  values within the size indexed (a weight's rows, or another input's size at the draw);
- `embedding_bag`'s offsets: sorted, from 0, within the flat indices' length;
- lengths (a 1-D input whose example values are at most the size of another input's axis, and reach it): within
  1 and that axis's size at the draw, the longest at it;

and the user can say it: `input_ranges={"lengths": (1, "T")}` (inclusive ends; a number, or a Dim's name for its
size at the draw). Booleans are drawn as booleans already (inputs.py). `DrawRules.apply` redraws a draw's integer
inputs by the rules; `describe` says, for the report, how each input was drawn.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional, Union

import torch

from jit2triton.transpiler.op_table import lookup

from .dims import DynamicSpec
from .errors import ConversionError

# A number, or (input position, axis, less): that input's size along the axis at the draw, less `less` (an axis of
# None: its number of elements)
Bound = Union[int, tuple[int, Optional[int], int]]

@dataclass
class Rule:
    kind: str  # "within" (low..high inclusive) or "offsets" (sorted, from 0, at most `high`, the indices' length)
    low: int
    high: Bound
    how: str  # for the report
    longest: bool = False  # lengths: the largest drawn value is `high` (the padded axis is as long as the longest)


class DrawRules:
    def __init__(self, rules: dict[int, Rule], names: list[str]) -> None:
        self.rules, self.names = rules, names

    def __bool__(self) -> bool:
        return bool(self.rules)

    def apply(self, drawn: list, seed: int, sizes: Optional[Mapping[str, int]] = None) -> list:
        """`drawn` with each integer input a rule covers redrawn within it, at the shape drawn."""
        generator = torch.Generator().manual_seed(seed + 7919)
        out = list(drawn)
        for position, rule in self.rules.items():
            x = drawn[position]
            if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.dtype == torch.bool or not x.numel():
                continue
            high = rule.high if isinstance(rule.high, int) else _size(drawn, *rule.high)
            if high is None or high < rule.low:
                continue
            values = torch.randint(rule.low, high + 1, x.shape, generator=generator)
            if rule.kind == "offsets":
                values = values.flatten().sort().values.reshape(x.shape)
                values.view(-1)[0] = 0
            elif rule.longest:
                values.view(-1)[int(torch.randint(0, x.numel(), (1,), generator=generator))] = high
            out[position] = values.to(dtype=x.dtype, device=x.device)
        return out

    def describe(self, inputs: list) -> dict[str, str]:
        """How each input of a draw is made: the report's `verification["draws"]`."""
        said = {}
        for position, (name, x) in enumerate(zip(self.names, inputs)):
            if position in self.rules:
                said[name] = self.rules[position].how
            elif isinstance(x, torch.Tensor) and x.dtype == torch.bool:
                said[name] = "random booleans"
            elif isinstance(x, torch.Tensor) and (x.dtype.is_floating_point or x.dtype.is_complex):
                said[name] = "normal(0, 1)"
            elif isinstance(x, torch.Tensor) and x.numel():
                said[name] = f"within the example's values, {int(x.min())}..{int(x.max())}"
            elif isinstance(x, torch.Tensor) or type(x) is int:
                said[name] = "the example's"
        return said


def _size(drawn: list, position: int, axis: Optional[int], less: int) -> Optional[int]:
    x = drawn[position]
    if not isinstance(x, torch.Tensor) or (axis is not None and not -x.dim() <= axis < x.dim()):
        return None
    return (x.numel() if axis is None else x.shape[axis]) - less


def draw_rules(graph: torch._C.Graph, names: list[str], example: list, spec: Optional[DynamicSpec],
               given: Optional[Mapping[str, tuple]] = None) -> DrawRules:
    """The rules for `graph`'s inputs (the model's, named `names`, with `example` values): the user's
    `given` ranges first, then what the graph and the example say."""
    inputs = list(graph.inputs())[:len(names)]
    positions = {value: i for i, value in enumerate(inputs)}
    rules: dict[int, Rule] = {}
    for position, value in enumerate(inputs):
        x = example[position] if position < len(example) else None
        if not isinstance(x, torch.Tensor) or x.dtype.is_floating_point or x.dtype == torch.bool:
            continue
        rule = _index_rule(value, positions, names)
        rule = rule or _lengths_rule(position, x, example, names, spec)
        if rule is not None:
            rules[position] = rule
    for name, ends in (given or {}).items():
        rules[_position(name, names)] = _given_rule(name, ends, names, spec)
    return DrawRules(rules, names)


def _index_rule(value, positions: dict, names: list[str]) -> Optional[Rule]:
    """The rule for an input used as an index (or embedding_bag's offsets), from its first such use."""
    for op, table, dim in _index_uses(value):
        if op == "offsets":
            indices = _source(table)
            if indices in positions:
                return Rule("offsets", 0, (positions[indices], None, 0),
                            f"offsets into {names[positions[indices]]}: sorted, from 0, within its length")
            continue
        constant = _constant(table)
        if isinstance(constant, torch.Tensor) and constant.dim() > dim:
            rows = constant.shape[dim]
            return Rule("within", 0, rows - 1, f"indices into {op}'s table of {rows} rows: 0..{rows - 1}")
        source = _shape_source(table, dim)
        if source in positions:
            other = names[positions[source]]
            return Rule("within", 0, (positions[source], dim, 1),
                        f"indices into {op}'s dim {dim} of {other}: 0..its size - 1 at each draw")
    return None


def _index_uses(value):
    """(op, the tensor indexed, its dim) for each use of `value` as an index; ("offsets", indices, None) for
    embedding_bag's offsets."""
    for node, offset in _uses(value):
        kind, args = node.kind().split(".")[0], list(node.inputs())
        if kind == "aten::embedding_bag" and offset == 2:
            yield "offsets", args[1], None
        elif lookup(kind).indexes is not None and offset == lookup(kind).indexes[0]:
            dim_at = lookup(kind).indexes[1]
            dim = 0 if dim_at is None else _constant(args[dim_at])
            if isinstance(dim, int):
                yield kind.removeprefix("aten::"), args[0], dim
        elif kind == "prim::ListConstruct":  # x[idx]: aten::index(x, [idx, ...]) indexes dim k by the k-th
            for use in node.output().uses():
                if use.user.kind().split(".")[0] == "aten::index" and use.offset == 1:
                    yield "index", next(use.user.inputs()), offset


def _lengths_rule(position: int, x: torch.Tensor, example: list, names: list[str],
                  spec: Optional[DynamicSpec]) -> Optional[Rule]:
    """A 1-D integer input whose example values lie in 1..n and reach n, the size of another input's axis (a
    dynamic one first): lengths of that axis."""
    if x.dim() != 1 or not x.numel() or int(x.min()) < 1:
        return None
    longest = int(x.max())
    found = [(0 if spec and axis in spec.axes.get(other, {}) else 1, other, axis)
             for other, y in enumerate(example) if other != position and isinstance(y, torch.Tensor)
             for axis in range(1, y.dim()) if y.shape[axis] == longest]
    if not found:
        return None
    _, other, axis = min(found)
    return Rule("within", 1, (other, axis, 0), f"lengths of {names[other]}'s axis {axis}: 1..its size at each "
                "draw, the longest at it", longest=True)


def _given_rule(name: str, ends: Any, names: list[str], spec: Optional[DynamicSpec]) -> Rule:
    if not isinstance(ends, (tuple, list)) or len(ends) != 2:
        raise ConversionError(f"input_ranges[{name!r}] must be (low, high), both inclusive, each a number or a Dim's "
                              f"name; got {ends!r}")
    low, high = (_given_end(name, end, spec) for end in ends)
    if not isinstance(low, int):
        raise ConversionError(f"input_ranges[{name!r}]: the low end must be a number, got {ends[0]!r}")
    return Rule("within", low, high, f"{low}..{ends[1]} (input_ranges)")


def _given_end(name: str, end: Any, spec: Optional[DynamicSpec]) -> Bound:
    if isinstance(end, int) and not isinstance(end, bool):
        return end
    for position, axes in (spec.axes.items() if spec else ()):
        for axis, dim in axes.items():
            if dim.name == end:
                return position, axis, 0
    known = ", ".join(spec.dims) if spec else "none (the shapes are static)"
    raise ConversionError(f"input_ranges[{name!r}]: {end!r} is neither a number nor a declared Dim (the dims are "
                          f"{known})")


def _position(name: str, names: list[str]) -> int:
    if name not in names:
        raise ConversionError(f"input_ranges names input {name!r}, which the model does not take; its inputs are "
                              f"{', '.join(names)}")
    return names.index(name)


def _uses(value) -> list[tuple[Any, int]]:
    """(node, argument position) of every use of `value` and of what holds its values (casts, views, branches)."""
    found, seen, todo = [], set(), [value]
    while todo:
        v = todo.pop()
        if v.unique() in seen:
            continue
        seen.add(v.unique())
        for use in v.uses():
            node = use.user
            if node.kind() == "prim::Return" and node.owningBlock().owningNode() is not None:
                owner = node.owningBlock().owningNode()
                if owner.kind() == "prim::If":
                    todo.append(list(owner.outputs())[use.offset])
                continue
            if lookup(node.kind().split(".")[0]).keeps_index_values and use.offset == 0:
                todo += list(node.outputs())[:1]
            found.append((node, use.offset))
    return found


def _source(value):
    """The value `value`'s values come from, through casts, views and branches (the first branch that passes an
    input through)."""
    while True:
        node = value.node()
        if lookup(node.kind().split(".")[0]).keeps_index_values:
            value = next(node.inputs())
        elif node.kind() == "prim::If":
            offset = list(node.outputs()).index(value)
            found = [_source(list(block.outputs())[offset]) for block in node.blocks()]
            return next((v for v in found if v.node().kind() == "prim::Param"), found[0])
        else:
            return value


def _shape_source(value, dim: int):
    """The value whose size along `dim` `value` has, through ops that keep sizes (a GNN's `linear(x)` rows)."""
    while True:
        node = value.node()
        kind = node.kind().split(".")[0]
        keeps = lookup(kind).keeps_sizes
        if keeps == "all" or (keeps == "rows" and dim == 0):
            value = next(node.inputs())
        elif lookup(kind).keeps_index_values or kind == "prim::If":
            source = _source(value)
            if source is value:
                return value
            value = source
        else:
            return value


def _constant(value) -> Any:
    node = value.node()
    return value.toIValue() if node.kind() == "prim::Constant" else None
