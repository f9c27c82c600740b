"""Input and output signatures: how conversion describes what a package takes and returns, how they are shown, and
the model's NamedTuples rebuilt from them. The per-call check of a call's inputs is the C++ runtime's
(deploy/cpp/src/signature.cpp; serving checks each request with it too: `check_inputs`).
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any, Callable, Optional

import torch

from jit2triton.errors import CorruptPackageError

from .policy import RECONVERT

# an input's declared "layout": "channels_last", by rank (the example's layout, where the caller keeps images so)
CHANNELS_LAST = {4: torch.channels_last, 5: torch.channels_last_3d}



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


NO_DEFAULT = object()  # an input without a default
