"""Input and output signatures: what a package expects and returns, and the per-call check of user inputs.

The check is built once at load; a call compares each input's dtype, shape and device with plain attribute reads.
"""
from __future__ import annotations

from operator import attrgetter
from typing import Any, Callable

import torch

from jit2triton.errors import InputError

_SCALAR_TYPES = {"int": int, "float": (float, int), "bool": bool, "str": str}


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


def format_type(desc: dict) -> str:
    kind = desc["type"]
    if kind == "Tensor":
        return f"{desc['dtype']}[{', '.join(map(str, desc['shape']))}]"
    if kind in ("Tuple", "List"):
        return f"{kind}[{', '.join(format_type(d) for d in desc['items'])}]"
    if kind == "Dict":
        return "Dict{" + ", ".join(f"{k}: {format_type(d)}" for k, d in desc["items"].items()) + "}"
    return kind


class InputChecker:
    """Validates a call's inputs against the signature and fills in defaults; raises InputError otherwise. Each
    input has one function, built at load, that checks it and returns what the plan receives."""

    def __init__(self, inputs: list[dict], device: torch.device, defaults: list[Any], contiguous: bool = False) -> None:
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
        return [check(value) for check, value in zip(self.checks, args)]

    def _with_defaults(self, args: tuple) -> tuple:
        n = len(args)
        if n < self.required or n > len(self.names):
            expected = (f"{len(self.names)}" if self.required == len(self.names)
                        else f"{self.required} to {len(self.names)}")
            raise InputError(f"expected {expected} inputs ({', '.join(self.names)}), got {n}; pass them in that order")
        return tuple(args) + tuple(self.defaults[n:])

    def _check_for(self, index: int, desc: dict) -> Callable[[Any], Any]:
        label = f"input {index} ({desc['name']!r})"
        kind = desc["type"]
        if kind == "Tensor":
            dtype = getattr(torch, desc["dtype"])
            shape = torch.Size(desc["shape"])
            device_type = self.device.type
            expected = f"{desc['dtype']}[{', '.join(map(str, shape))}] on {device_type}"
            on_device = _DEVICE_TEST.get(device_type, lambda x: x.device.type == device_type)
            contiguous = self.contiguous

            def check_tensor(x: Any) -> Any:
                if not isinstance(x, torch.Tensor):
                    raise InputError(f"{label}: expected a tensor {expected}, got {type(x).__name__}")
                if x.layout is not torch.strided:
                    raise InputError(f"{label}: expected a dense tensor {expected}, got a {x.layout} tensor; pass "
                                     "x.to_dense()")
                if x.dtype != dtype or x.shape != shape or not on_device(x):
                    got = f"{str(x.dtype).removeprefix('torch.')}[{', '.join(map(str, x.shape))}] on {x.device}"
                    raise InputError(
                        f"{label}: expected {expected}, got {got}. The package was converted for that signature; "
                        f"convert again with example inputs of the shape and dtype you need")
                return x.contiguous() if contiguous else x

            return check_tensor
        python_type = _SCALAR_TYPES.get(kind)
        if python_type is None:
            return lambda x: x

        def check_scalar(x: Any) -> Any:
            if not isinstance(x, python_type) or (kind != "bool" and isinstance(x, bool)):
                raise InputError(f"{label}: expected {kind}, got {type(x).__name__}")
            return x

        return check_scalar


NO_DEFAULT = object()
_DEVICE_TEST = {"cpu": attrgetter("is_cpu"), "cuda": attrgetter("is_cuda")}  # attribute reads, no device object
