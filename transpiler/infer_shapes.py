"""Shape and dtype inference from example inputs.

The plan is run on the example inputs, and, for a package with dynamic dims, again at a few other draws of those
dims (see pipeline.observe); every value it produces is observed here. A size that differs between draws is
fitted to a polynomial in the dims (`SymSize`, see symbolic.py), or, when none fits, becomes an opaque symbol; so
does a size that differs between loop iterations of one run. A value never produced (a branch not taken) keeps
the type TorchScript gave it.
"""
from __future__ import annotations

import itertools
from typing import Any

import torch

from .ir import Graph, Node, Type, Value, tensor_type
from .kernel_ir import ALIGNMENT
from .symbolic import fit


class ShapeRecorder:
    """Collects observed runtime values per IR value, then writes the merged types into the graph."""

    def __init__(self, nodes: list[Node]) -> None:
        self.nodes = nodes
        self.seen: dict[int, tuple[Value, Type]] = {}  # this draw's types, merged over loop iterations
        self.draws: list[tuple[dict[str, int], dict[int, tuple[Value, Type]]]] = []  # earlier draws: (sizes, seen)
        # value id -> the shape of each of its tensors this draw, in run order (a loop's values: one per iteration);
        # and the same for each earlier draw. Two sizes that varied alike over a loop's iterations at every draw
        # are one size (a mask's count and the rows of what it indexes).
        self.history: dict[int, list[tuple]] = {}
        self.histories: list[dict[int, list[tuple]]] = []
        self.current_sizes: dict[str, int] = {}  # the dynamic dims' sizes of the run being observed
        self.symbols = (f"s{i}" for i in itertools.count())
        self.small: dict[int, Any] = {}  # value id -> its value, for scalars, short lists and 0-d tensors
        self.varying: set[int] = set()  # value ids seen with different values (loop counters, data, dynamic sizes)
        # Opaque sizes by what was observed: two sizes equal at every draw are one size (as a fitted polynomial is
        # the size that gives every draw's value); its value at the example, for heuristics (transpiler/bind_sizes.py)
        self.opaque_sizes: dict[tuple, str] = {}
        self.opaque_examples: dict[str, int] = {}
        # value id -> its dims outermost first, for a tensor dense in that order at every draw whose strides fit no
        # polynomial (an opaque size among its dims): strides a binding of its sizes can spell out again
        self.dense_orders: dict[int, tuple[int, ...]] = {}
        # value ids of tensors seen starting at an address that is not 16-byte aligned (a row of a matrix picked by
        # a loop counter, a slice from 1): kernel_alignment.py compiles the kernels reading them without assuming it
        self.misaligned: set[int] = set()
        self.ran: set[int] = set()  # the uids of the nodes some run made outputs for (the report's reached nodes)

    def next_draw(self, sizes: dict[str, int]) -> None:
        """Types observed from here on belong to a run at these sizes of the dynamic dims."""
        if self.seen or self.draws:
            self.draws.append((self.current_sizes, self.seen))
            self.histories.append(self.history)
        self.current_sizes, self.seen, self.history = dict(sizes), {}, {}

    def drop_draw(self) -> None:
        """Forget the draw being observed (a run that failed partway); the one before it is current again."""
        self.current_sizes, self.seen = self.draws.pop() if self.draws else ({}, {})
        self.history = self.histories.pop() if self.histories else {}

    def observe_values(self, values: list[Value], runtime_values) -> None:
        for value, obj in zip(values, runtime_values):
            observed = type_of(obj, value.type)
            known = self.seen.get(value.id)
            self.seen[value.id] = (value, observed if known is None else self.merge(known[1], observed))
            if isinstance(obj, torch.Tensor):
                self.history.setdefault(value.id, []).append(tuple(obj.shape))
            if isinstance(obj, torch.Tensor) and obj.layout == torch.strided and obj.numel() and \
                    obj.data_ptr() % ALIGNMENT:
                self.misaligned.add(value.id)
            if _is_small(obj):
                if value.id in self.small and not _same(self.small[value.id], obj):
                    self.varying.add(value.id)
                self.small.setdefault(value.id, obj.clone() if isinstance(obj, torch.Tensor) else obj)

    def constant_value(self, value: Value) -> tuple[bool, Any]:
        """(True, v) if `value` was seen, always with the same value v."""
        if value.id in self.small and value.id not in self.varying:
            return True, self.small[value.id]
        return False, None

    def __call__(self, node_index: int, outputs: tuple) -> None:
        self.ran.add(self.nodes[node_index].uid)
        self.observe_values(self.nodes[node_index].outputs, outputs)

    def merge(self, a: Type, b: Type) -> Type:
        if a == b or not (a.is_tensor and b.is_tensor) or a.shape is None or b.shape is None:
            return a
        if len(a.shape) != len(b.shape) or a.dtype != b.dtype:
            return Type("Tensor", a.dtype if a.dtype == b.dtype else None, None, a.device)
        dims = tuple(x if x == y else (x if isinstance(x, str) else next(self.symbols)) for x, y in zip(a.shape, b.shape))
        return Type("Tensor", a.dtype, dims, a.device, strides=a.strides if a.strides == b.strides else None)

    def annotate(self) -> None:
        """Write every observed type into its IR value: over several draws, each size fitted across them; a size
        that varied within a run (a loop's iterations) named by its sizes iteration by iteration, at one draw too."""
        if self.draws or any(_varied(t) for _, t in self.seen.values()):
            self.next_draw({})
            draws, self.draws = self.draws, []
            histories, self.histories = self.histories, []
            self.seen = {}
            for value_id, (value, _) in draws[0][1].items():
                observed = [(sizes, seen[value_id][1]) for sizes, seen in draws if value_id in seen]
                runs = [history.get(value_id, ()) for (_, seen), history in zip(draws, histories) if value_id in seen]
                self.seen[value_id] = (value, self.across_draws(observed, runs))
                if self.seen[value_id][1].is_tensor and self.seen[value_id][1].strides is None:
                    self.observed_order(value_id, [t for _, t in observed])
        for value, observed in self.seen.values():
            value.type = observed

    def across_draws(self, observed: list[tuple[dict[str, int], Type]], runs: list = ()) -> Type:
        """One type for a value seen at several draws: a size that changed with the draw becomes its fitted
        polynomial (or an opaque symbol); strides likewise, or none when one does not fit. `runs`: the value's
        shapes in run order at each draw (a size that varied within a run is named by them)."""
        first = observed[0][1]
        types = [t for _, t in observed]
        if all(t == first for t in types) and not _varied(first):
            return first
        if first.kind == "Tuple" and all(t.kind == "Tuple" and len(t.elems) == len(first.elems) for t in types):
            return Type("Tuple", elems=tuple(self.across_draws([(s, t.elems[i]) for s, t in observed])
                                             for i in range(len(first.elems))))
        if not first.is_tensor:
            return first
        if any(t.shape is None or len(t.shape) != len(first.shape) or t.dtype != first.dtype for t in types):
            return Type("Tensor", first.dtype if all(t.dtype == first.dtype for t in types) else None, None,
                        first.device)
        sizes = [s for s, _ in observed]
        shape = tuple(self.fitted([t.shape[d] for t in types], sizes, within=_sizes_at(runs, d))
                      for d in range(len(first.shape)))
        strides = None
        if all(t.strides is not None for t in types):
            fitted = [self.fitted([t.strides[d] for t in types], sizes, opaque=False) for d in range(len(shape))]
            strides = None if any(s is None for s in fitted) else tuple(fitted)
        return Type("Tensor", first.dtype, shape, first.device, strides=strides)

    def observed_order(self, value_id: int, types: list[Type]) -> None:
        orders = {_dense_order(t) for t in types}
        if len(orders) == 1 and None not in orders:
            self.dense_orders[value_id] = orders.pop()

    def fitted(self, values: list, sizes: list[dict[str, int]], opaque: bool = True, within: tuple = ()):
        if any(isinstance(v, str) for v in values):  # it varied within a run (a loop): no draw explains it
            if not opaque:
                return None
            if not within:
                return next(self.symbols)
            # named by what each run saw, iteration by iteration: sizes that varied alike are one
            key = ("within a run", within)
            if key not in self.opaque_sizes:
                self.opaque_sizes[key] = name = next(self.symbols)
                self.opaque_examples[name] = within[0][0]
            return self.opaque_sizes[key]
        found = fit(values, sizes)
        if found is None and opaque:
            key = tuple((tuple(sorted(draw.items())), n) for draw, n in zip(sizes, values))
            if key not in self.opaque_sizes:
                self.opaque_sizes[key] = name = next(self.symbols)
                self.opaque_examples[name] = values[0]  # the first draw observed is the example
            return self.opaque_sizes[key]
        return found


def _varied(t: Type) -> bool:
    """Whether a merged type has a size that differed between the observations merged (an opaque symbol)."""
    return t.is_tensor and t.shape is not None and any(isinstance(n, str) for n in t.shape)


def _sizes_at(runs: list, axis: int) -> tuple:
    """Axis `axis` of each shape of each run, or () where a run saw none or a shape lacks the axis."""
    if not runs or any(not shapes or any(len(shape) <= axis for shape in shapes) for shapes in runs):
        return ()
    return tuple(tuple(shape[axis] for shape in shapes) for shapes in runs)


def type_carried_values(graph: Graph) -> None:
    """Type each value a loop carries, as its body sees it (no run observes a block's inputs): the type of what
    enters the loop, when what each iteration hands on and what leaves the loop have that same type (the same
    shape, dtype, device and strides), so that ops on a carried tensor (NMS's `suppressed`) may become kernels."""
    for node in graph.walk():
        if node.op != "prim::Loop":
            continue
        body = node.blocks[0]
        for inner, initial, result, out in zip(body.inputs[1:], node.inputs[2:], body.outputs[1:], node.outputs):
            if initial.type.is_tensor and initial.type.shape is not None and initial.type == result.type == out.type:
                inner.type = initial.type


def _dense_order(t: Type):
    """A tensor type's dims outermost first when its strides are exactly a dense layout in that order, else None."""
    if not t.is_tensor or t.shape is None or t.strides is None or not all(isinstance(n, int) for n in t.shape):
        return None
    order = tuple(sorted(range(len(t.shape)), key=lambda d: (-t.strides[d], d)))
    expected, step = [0] * len(t.shape), 1
    for d in reversed(order):
        expected[d] = step
        step *= t.shape[d]
    return order if all(n == 1 or expected[d] == t.strides[d] for d, n in enumerate(t.shape)) else None


def _is_small(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):
        return obj.dim() == 0
    if isinstance(obj, (list, tuple)):
        return len(obj) <= 16 and all(isinstance(o, (int, float, bool)) for o in obj)
    return isinstance(obj, (int, float, bool, str, type(None), torch.device, torch.dtype))


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and bool((a == b).all()))
    return type(a) is type(b) and a == b


def type_of(obj: Any, declared: Type) -> Type:
    if isinstance(obj, torch.Tensor):
        return tensor_type(obj)
    if isinstance(obj, (list, tuple)) and declared.kind in ("List", "Tuple"):
        if declared.kind == "Tuple":
            elems = tuple(type_of(o, d) for o, d in zip(obj, declared.elems))
            return Type("Tuple", elems=elems)
        return declared
    return declared
