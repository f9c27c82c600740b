"""JSON encoding of the literals baked into a plan (no pickle: a package is data, never code).

JSON has no tuple, device, dtype or non-finite float, so those are tagged objects: {"$tuple": [...]} and so on.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch


def encode(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else {"$float": repr(value)}
    if isinstance(value, list):
        return [encode(v) for v in value]
    if isinstance(value, tuple):
        return {"$tuple": [encode(v) for v in value]}
    if isinstance(value, torch.device):
        return {"$device": str(value)}
    if isinstance(value, torch.dtype):
        return {"$dtype": str(value).removeprefix("torch.")}
    if isinstance(value, complex):
        return {"$complex": [encode(value.real), encode(value.imag)]}
    if isinstance(value, dict):
        return {"$dict": [[encode(k), encode(v)] for k, v in value.items()]}
    raise TypeError(f"cannot store a literal of type {type(value).__name__} in a package")


def decode(data: Any) -> Any:
    if isinstance(data, list):
        return [decode(v) for v in data]
    if not isinstance(data, dict):
        return data
    (tag, body), = data.items()
    if tag == "$float":
        return float(body)
    if tag == "$tuple":
        return tuple(decode(v) for v in body)
    if tag == "$device":
        return torch.device(body)
    if tag == "$dtype":
        return getattr(torch, body)
    if tag == "$complex":
        return complex(decode(body[0]), decode(body[1]))
    if tag == "$dict":
        return {decode(k): decode(v) for k, v in body}
    raise ValueError(f"unknown literal tag {tag!r}")


def map_plan_literals(plan: dict, fn: Callable[[Any], Any]) -> dict:
    """A copy of `plan` with every ["c", literal] reference's literal passed through `fn` (the packed constants'
    arguments included). It runs before the plan's checks, so it changes nothing else: a damaged list (an object or
    a string where the plan holds a list) raises TypeError rather than being read as another list (steps that were
    an object ran as none: agreement sweep, small@7214), and a damaged reference is left for the checks to refuse."""
    def ref(r: Any) -> Any:
        return ["c", fn(r[1])] if isinstance(r, list) and len(r) == 2 and r[0] == "c" else r

    def block(b: dict) -> dict:
        return dict(b, steps=[step(s) for s in _list(b["steps"])], outputs=[ref(r) for r in _list(b["outputs"])])

    def step(s: dict) -> dict:
        out = dict(s, args=[ref(r) for r in _list(s["args"])])
        if "blocks" in s:
            out["blocks"] = [block(b) for b in _list(s["blocks"])]
        if "steps" in s:  # a CUDA graph region (deploy/packaging/graph_regions.py) holds its steps
            out["steps"] = [step(inner) for inner in _list(s["steps"])]
        return out

    mapped = dict(plan, steps=[step(s) for s in _list(plan["steps"])],
                  outputs=[ref(r) for r in _list(plan["outputs"])])
    if "packed" in plan:
        mapped["packed"] = [dict(p, args=[ref(r) for r in _list(p["args"])]) for p in _list(plan["packed"])]
    return mapped


def _list(value: Any) -> list:
    if not isinstance(value, list):
        raise TypeError(f"a plan's list is {type(value).__name__}")
    return value


def map_manifest_plans(manifest: dict, fn: Callable[[Any], Any]) -> dict:
    """`manifest` with map_plan_literals applied to its plan and to each of its methods' plans (deploy/cpp/src/module.cpp)."""
    out = dict(manifest, plan=map_plan_literals(manifest["plan"], fn))
    if isinstance(manifest.get("methods"), dict):
        out["methods"] = {name: dict(method, plan=map_plan_literals(method["plan"], fn)) if isinstance(method, dict)
                          else method for name, method in manifest["methods"].items()}
    return out
