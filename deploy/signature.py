"""Input and output signatures: what a package expects and returns, and the per-call check of user inputs.

The check is built once at load; a call compares each input's dtype, shape and device with plain attribute reads.
"""
from __future__ import annotations

from collections import namedtuple
from operator import attrgetter
from typing import Any, Callable, Optional

import torch

from jit2triton.errors import CorruptPackageError, InputError, PackageVersionError

from .format import SIGNATURE_ITEM, check_fields
from .policy import DTYPES, RECONVERT, message

# an input's declared "layout": "channels_last", by rank (the example's layout, where the caller keeps images so)
CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}

_SCALAR_TYPES = {"int": int, "float": (float, int), "bool": bool, "str": str}
# a container input's Python type, and how a message names one
_CONTAINERS = {"List": (list, "a list"), "Tuple": (tuple, "a tuple"), "Dict": (dict, "a dict")}


def describe(value: Any) -> dict:
    """A JSON-able description of a runtime value: tensors with dtype and shape, containers with their items."""
    if isinstance(value, torch.Tensor):
        return {"type": "Tensor", "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape)}
    if isinstance(value, tuple):
        return {"type": "Tuple", "items": [describe(v) for v in value]}
    if isinstance(value, list):
        return {"type": "List", "items": [describe(v) for v in value]}
    if isinstance(value, dict):
        return {"type": "Dict", "items": {str(k): describe(v) for k, v in value.items()}}
    if value is None:
        return {"type": "None"}
    return {"type": type(value).__name__}


def with_named_tuples(desc: dict, named: Optional[dict]) -> dict:
    """`desc` (of an output) with the NamedTuples that `named` finds in TorchScript's type of it: each such Tuple
    gains its "name" and "fields", and a List or Dict whose elements hold one its "element" (`named` of one
    element), so a runtime rebuilds them in lists longer, or dicts other, than the example's. `named`: the IR's
    `Graph.returns` form (transpiler/from_torchscript.py `named_tuples`): "Tuple" with "name", "fields" where named
    and "items"; "List" or "Dict" with "element"; None where nothing below is named."""
    if named is None or desc.get("type") != named["type"]:
        return desc
    out = dict(desc)
    if named["type"] == "Tuple":
        if "name" in named and len(named["fields"]) == len(desc["items"]):
            out["name"], out["fields"] = named["name"], list(named["fields"])
        out["items"] = [with_named_tuples(d, n) for d, n in zip(desc["items"], named["items"])]
    else:
        out["element"] = named["element"]
        items = desc["items"]
        out["items"] = ({k: with_named_tuples(d, named["element"]) for k, d in items.items()}
                        if isinstance(items, dict) else [with_named_tuples(d, named["element"]) for d in items])
    return out


def output_rebuilder(desc: Optional[dict]) -> Optional[Callable[[Any], Any]]:
    """What turns a plan's output (plain tuples) into the model's (its NamedTuples, as TorchScript returns them), or
    None where `desc` (a signature's outputs, after `with_named_tuples`) names none: then a call does nothing more.
    Each NamedTuple class is made here, once per load. A None (an Optional's) passes through."""
    kind = desc.get("type") if desc is not None else None  # (an "element"'s items: None where nothing is named)
    if kind in ("List", "Dict") and "element" in desc:
        element = output_rebuilder(desc["element"])
        if element is None:
            return None
        if kind == "List":
            return lambda value: None if value is None else [element(v) for v in value]
        return lambda value: None if value is None else {k: element(v) for k, v in value.items()}
    if kind != "Tuple":
        return None
    items = [output_rebuilder(d) for d in desc["items"]]
    if "name" not in desc and not any(items):
        return None
    build = namedtuple(desc["name"], desc["fields"])._make if "name" in desc else tuple
    count = len(desc["items"])
    if not any(items):
        make = build
    else:
        def make(value: tuple) -> Any:
            return build(f(v) if f is not None else v for f, v in zip(items, value))

    def rebuild(value: Any) -> Any:
        if value is None:
            return None
        if len(value) != count:
            raise CorruptPackageError(f"the plan returned a tuple of {len(value)} items where the signature says "
                                      f"{format_type(desc)}: the package is damaged; {RECONVERT}")
        return make(value)

    return rebuild


def format_input(desc: dict) -> str:
    """An input's type as a signature shows it: `Optional[bool[3, 5]]` for a tensor input that also takes None."""
    return f"Optional[{format_type(desc)}]" if desc.get("optional") is True else format_type(desc)


def format_type(desc: dict) -> str:
    kind = desc["type"]
    if kind == "Tensor":  # an output's dynamic sizes are named in "dims" ("12*batch"), its example's in "shape"
        return f"{desc['dtype']}[{', '.join(map(str, desc.get('dims', desc['shape'])))}]"
    if "fields" in desc:  # a NamedTuple
        return f"{desc['name']}(" + ", ".join(f"{k}: {format_type(d)}" for k, d in zip(desc["fields"],
                                                                                     desc["items"])) + ")"
    if kind in ("Tuple", "List"):
        return f"{kind}[{', '.join(format_type(d) for d in desc['items'])}]"
    if kind == "Dict":
        return "Dict{" + ", ".join(f"{k}: {format_type(d)}" for k, d in desc["items"].items()) + "}"
    return kind


def fixed_value_message(label: str, example: Any, got: Any) -> str:
    """An int input the package serves at one value: the model ran at no other during conversion (C++:
    signature.cpp says the same)."""
    return (f"{label}: the package serves only the value {example} it was converted with (the model ran at no other "
            f"value during conversion, so a size it sets is fixed); got {got}. Convert again with that value in the "
            "example inputs")


class InputChecker:
    """Validates a call's inputs against the signature and fills in defaults; raises InputError otherwise. Each
    input has one function, built at load, that checks it and returns what the plan receives."""

    def __init__(self, inputs: list[dict], device: torch.device, defaults: list[Any], contiguous: bool = False,
                 dims: Optional[dict[str, dict]] = None) -> None:
        self.dims = dims or {}  # dynamic dims: name -> {"min", "max"}; one call binds each to one size
        self.names = [d["name"] for d in inputs]
        self.defaults = defaults  # per input: a value, or NO_DEFAULT
        self.required = sum(1 for d in defaults if d is NO_DEFAULT)
        self.device = device
        self.contiguous = contiguous  # generated kernels index inputs as dense row-major tensors
        self.checks: list[Callable[[Any], Any]] = [self._check_for(i, d) for i, d in enumerate(inputs)]
        self.count = len(self.names)

    def __call__(self, args: tuple) -> list:
        if len(args) != self.count:
            args = self._with_defaults(args)
        if self.dims:
            bound: dict[str, tuple[int, str]] = {}  # dim -> (size, where it was bound)
            return [check(value, bound) for check, value in zip(self.checks, args)]
        return [check(value) for check, value in zip(self.checks, args)]

    def _with_defaults(self, args: tuple) -> tuple:
        n = len(args)
        if n < self.required or n > len(self.names):
            expected = (f"{len(self.names)}" if self.required == len(self.names)
                        else f"{self.required} to {len(self.names)}")
            noun = "input" if len(self.names) == 1 else "inputs"  # (as plan.cpp words it)
            raise InputError(f"expected {expected} {noun} ({', '.join(self.names)}), got {n}; pass them in that order")
        return tuple(args) + tuple(self.defaults[n:])

    def _check_for(self, index: int, desc: dict) -> Callable[..., Any]:
        return self._value_check(f"input {index} ({desc['name']!r})", desc)

    def _value_check(self, label: str, desc: dict) -> Callable[..., Any]:
        kind = desc["type"]
        if kind in _CONTAINERS:
            return self._container_check(label, desc)
        if kind == "Tensor":
            return self._tensor_check(label, desc)
        python_type = _SCALAR_TYPES.get(kind)
        if python_type is None:
            return (lambda x, bound=None: x)

        fixed = desc.get("fixed") is True and "example" in desc

        def check_scalar(x: Any, bound: Any = None) -> Any:
            if not isinstance(x, python_type) or (kind != "bool" and isinstance(x, bool)):
                raise InputError(f"{label}: expected {kind}, got {type(x).__name__}")
            if fixed and x != desc["example"]:
                raise InputError(fixed_value_message(label, desc["example"], x))
            return x

        return check_scalar

    def _item_check(self, label: str, desc: Any) -> Callable[..., Any]:
        """The check of a container's item or element: `desc` read through the schema's signature item first (as
        the C++ runtime reads it), then checked as an input of its type is."""
        check_fields(SIGNATURE_ITEM, desc)
        return self._value_check(label, desc)

    def _container_check(self, label: str, desc: dict) -> Callable[..., Any]:
        """A tuple is checked item by item (its arity is its TorchScript type's); a list's or dict's elements by
        their "element" type, where the example's were all one (their number, and a dict's keys, are the model's
        to test). An element that a check replaces (a tensor made dense) is put in a new container: the caller's is
        not changed."""
        kind = desc["type"]
        python_type, noun = _CONTAINERS[kind]
        if kind == "Tuple":
            items = desc.get("items")
            if not isinstance(items, list):
                raise CorruptPackageError(f"{label} is a tuple without its item types; {RECONVERT}")
            checks = [self._item_check(f"{label} item {i}", d) for i, d in enumerate(items)]
            expected = f"{noun} of {len(items)} items ({', '.join(format_type(d) for d in items)})"
        else:
            element = desc.get("element")
            checks = None if element is None else self._item_check(f"{label} element", element)
            expected = noun if element is None else f"{noun} of {format_type(element)}"
        element_label = f"{label} element"

        def check_element(check: Callable[..., Any], value: Any, bound: Any, position: Any) -> Any:
            try:
                return check(value, bound)
            except InputError as err:  # (the message names the element's position, known only now)
                raise InputError(f"{element_label} {position}{str(err)[len(element_label):]}") from None

        def check_container(x: Any, bound: Any = None) -> Any:
            if not isinstance(x, python_type):
                raise InputError(f"{label}: expected {expected}, got {type(x).__name__}")
            if checks is None:
                return x
            if kind == "Tuple":
                if len(x) != len(checks):
                    raise InputError(f"{label}: expected {expected}, got {len(x)} items")
                out = [check(v, bound) for check, v in zip(checks, x)]
                return x if all(a is b for a, b in zip(out, x)) else tuple(out)
            pairs = x.items() if kind == "Dict" else enumerate(x)
            out = [check_element(checks, v, bound, repr(k) if kind == "Dict" else k) for k, v in pairs]
            if all(a is b for a, b in zip(out, x.values() if kind == "Dict" else x)):
                return x
            return dict(zip(x.keys(), out)) if kind == "Dict" else out

        return check_container

    def _tensor_check(self, label: str, desc: dict) -> Callable[..., Any]:
        """The check of a tensor input: dtype, device, dense layout and shape. A dynamic dim (a name in the shape)
        must be within its range and equal wherever else the same dim appears in this call (`bound`)."""
        if not isinstance(desc.get("shape"), list):
            raise CorruptPackageError(message("unshaped_tensor", label=label))
        dtype = _dtype(desc["dtype"])
        device_type = self.device.type
        expected = f"{desc['dtype']}[{', '.join(map(str, desc['shape']))}] on {device_type}"
        on_device = _DEVICE_TEST.get(device_type, lambda x: x.device.type == device_type)
        contiguous = self.contiguous
        # the dense layout generated kernels read inputs in: row-major, or channels-last where the example was
        layout = torch.contiguous_format
        if "layout" in desc:
            layout = CHANNELS_LAST.get(len(desc["shape"])) if desc["layout"] == "channels_last" else None
            if layout is None:
                raise CorruptPackageError(f"{label} declares layout {desc['layout']!r} for a {len(desc['shape'])}-d "
                                          "tensor, which this runtime does not know; " + RECONVERT)
        undeclared = [d for d in desc["shape"] if isinstance(d, str) and d not in self.dims]
        if undeclared:
            raise CorruptPackageError(f"{label} names dim {undeclared[0]!r}, which the signature does not "
                                      f"declare; {RECONVERT}")
        dynamic = [(axis, d, self.dims[d]["min"], self.dims[d]["max"]) for axis, d in enumerate(desc["shape"])
                   if isinstance(d, str)]
        fixed = None if dynamic else torch.Size(desc["shape"])  # a static shape: one comparison per call
        rank = len(desc["shape"])
        static = [(axis, d) for axis, d in enumerate(desc["shape"]) if isinstance(d, int)]

        takes_none = desc.get("optional") is True  # an Optional[Tensor] the model tests for None

        def check_tensor(x: Any, bound: Any = None) -> Any:
            if not isinstance(x, torch.Tensor):
                if x is None and takes_none:
                    return None
                raise InputError(f"{label}: expected a tensor {expected}{' or None' if takes_none else ''}, got "
                                 f"{type(x).__name__}")
            if x.layout is not torch.strided:
                raise InputError(f"{label}: expected a dense tensor {expected}, got a {x.layout} tensor; pass "
                                 "x.to_dense()")
            shape = x.shape
            if x.dtype != dtype or not on_device(x) or (
                    shape != fixed if fixed is not None else
                    len(shape) != rank or any(shape[a] != n for a, n in static)):
                got = f"{str(x.dtype).removeprefix('torch.')}[{', '.join(map(str, shape))}] on {x.device}"
                raise InputError(f"{label}: expected {expected}, got {got}. The package was converted for that "
                                 "signature; convert again with example inputs of the shape and dtype you need")
            for axis, name, low, high in dynamic:
                n = shape[axis]
                if n < low or (high is not None and n > high):
                    raise InputError(f"{label}: axis {axis} is dim {name}, whose range is {low}..{high or 'inf'}; "
                                     f"got {n}. Convert again with a wider Dim to serve that size")
                seen = bound.setdefault(name, (n, f"{label} axis {axis}"))
                if seen[0] != n:
                    raise InputError(f"{label}: axis {axis} is dim {name}, which is {seen[0]} in {seen[1]}; got {n}. "
                                     "The model needs those sizes equal")
            return x.contiguous(memory_format=layout) if contiguous else x

        return check_tensor


def _dtype(name: Any) -> torch.dtype:
    """A signature's dtype, one of the names a package may hold (as the C++ runtime's parse_dtype reads it)."""
    if not isinstance(name, str):
        raise CorruptPackageError(f"the package's signature is damaged (a dtype {name!r}); {RECONVERT}")
    if name not in DTYPES:
        raise PackageVersionError(message("new_dtype", dtype=repr(name)))
    return getattr(torch, name)


NO_DEFAULT = object()
_DEVICE_TEST = {"cpu": attrgetter("is_cpu"), "cuda": attrgetter("is_cuda")}  # attribute reads, no device object
