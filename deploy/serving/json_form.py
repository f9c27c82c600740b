"""The simple JSON form of serving: a request's body (or a handle call) read into the package's validated inputs,
and outputs written back as JSON. Plain functions, tested without Ray.

A tensor travels as a nested list, or as {"dtype": "float32", "shape": [2, 16], "data": base64 of its little-endian
bytes}; "inputs" is an object by input name, a list by position, or the only (first) input's tensor itself.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import math
import time
from typing import Any, Callable, Optional, Sequence

import torch

from jit2triton.errors import InputError

from ..literals import decode
from ..signature import NO_DEFAULT

ENCODINGS = ("list", "base64")
BODY_EXAMPLE = '{"inputs": {"x": [[0.5, 1.0]]}}'


@dataclasses.dataclass
class Request:
    """One validated request: its inputs (on the model's device, defaults filled), its rows of the batch dim, the key of the
    requests it may be concatenated with (every input's shape past axis 0), and how to encode its answer."""
    inputs: list
    rows: int = 1
    group: tuple = ()
    reply: str = "list"
    received: float = dataclasses.field(default_factory=time.perf_counter)  # for the queue time


class RequestReader:
    """Turns an HTTP body or a handle call into a validated `Request`, or raises InputError saying what is wrong.
    Built once per replica. `check` is the runtime's own input check (the loaded package's `check_inputs`: the same
    messages a call gives), by position, defaults filled. `batched`: requests are concatenated along axis 0, so each
    request's rows and group are read."""

    def __init__(self, signature: dict, batched: bool, check: Callable[[list], list]) -> None:
        self.inputs = signature["inputs"]
        self.names = [d["name"] for d in self.inputs]
        self.defaults = [decode(d["default"]) if "default" in d else NO_DEFAULT for d in self.inputs]
        self.dtypes = [getattr(torch, d["dtype"], None) if d["type"] == "Tensor" else None for d in self.inputs]
        self.check = check
        self.batched = batched

    def from_json(self, body: bytes) -> Request:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
            raise InputError(f"the body is not JSON ({err}); send e.g. {BODY_EXAMPLE}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), (dict, list)):
            raise InputError(f"the body must be a JSON object with \"inputs\": an object by input name, a list by "
                             f"position or the first input's tensor (the model takes {', '.join(self.names)}); e.g. "
                             f"{BODY_EXAMPLE}")
        given = doc["inputs"]
        if not given:
            raise InputError(f"\"inputs\" is empty; the model takes ({', '.join(self.names)})")
        sent = list(given.values()) if isinstance(given, dict) else given
        reply = doc.get("outputs", "base64" if any(isinstance(v, dict) for v in sent) else "list")
        if reply not in ENCODINGS:
            raise InputError(f"\"outputs\" must be \"list\" or \"base64\", not {reply!r}")
        if isinstance(given, dict):
            self._known(given)
            return self.from_named({n: self._decode(self.names.index(n), v) for n, v in given.items()}, reply)
        if self._is_first_input(given):
            given = [given]
        if len(given) > len(self.names):
            raise InputError(f"expected at most {len(self.names)} inputs ({', '.join(self.names)}), got {len(given)}")
        return self._checked([self._decode(i, v) for i, v in enumerate(given)], reply)

    def from_named(self, named: dict, reply: str) -> Request:
        """Inputs by name, already decoded (as a v2 infer request carries them)."""
        return self._checked(self._bind(named), reply)

    def _is_first_input(self, given: list) -> bool:
        """Whether a list sent as "inputs" is the first input's tensor itself rather than the inputs by position:
        a tensor of rank r is a list nested r deep, a list of inputs by position one deeper."""
        first = self.inputs[0] if self.inputs else {"type": None}
        return first["type"] == "Tensor" and len(first["shape"]) > 0 and _list_depth(given) == len(first["shape"])

    def from_values(self, args: Sequence[Any], named: dict[str, Any]) -> Request:
        """A Python handle call: tensors by position and by name, as the loaded module takes them."""
        args = self._bind(named, list(args)) if named else list(args)
        return self._checked(args, "list")

    def _bind(self, given: dict, positional: Sequence[Any] = ()) -> list:
        """Inputs by name after those by position, in the model's order up to the last one named; a gap takes the
        input's default."""
        self._known(given)
        twice = [n for n in given if self.names.index(n) < len(positional)]
        if twice:
            raise InputError(f"input {twice[0]!r} was given by position and by name; give it once")
        args = list(positional)
        for position in range(len(positional), max(self.names.index(n) for n in given) + 1):
            name, default = self.names[position], self.defaults[position]
            if name not in given and default is NO_DEFAULT:
                raise InputError(f"input {name!r} is missing and has no default; send it")
            args.append(given.get(name, default))
        return args

    def _known(self, given: dict) -> None:
        unknown = [n for n in given if n not in self.names]
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the model takes ({', '.join(self.names)})")

    def _decode(self, index: int, value: Any) -> Any:
        dtype = self.dtypes[index]
        if self.inputs[index]["type"] != "Tensor" or dtype is None:
            return value  # a scalar input: the input check says whether its JSON type fits
        label = f"input {index} ({self.names[index]!r})"
        if isinstance(value, dict):
            return tensor_from_base64(label, value, dtype)
        return tensor_from_list(label, value, dtype)

    def _checked(self, values: list, reply: str) -> Request:
        missing = [repr(n) for n, d in zip(self.names[len(values):], self.defaults[len(values):]) if d is NO_DEFAULT]
        if missing:
            raise InputError(f"input{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing, without a "
                             f"default; the model takes ({', '.join(self.names)})")
        inputs = self.check(list(values))
        if not self.batched:
            return Request(inputs, 1, (), reply)
        return Request(inputs, inputs[0].shape[0], tuple(t.shape[1:] for t in inputs), reply)


def _list_depth(value: Any) -> Optional[int]:
    """How deep a nested list of numbers nests (None: not one, or empty)."""
    depth = 0
    while isinstance(value, list) and value:
        depth, value = depth + 1, value[0]
    return depth if isinstance(value, (int, float)) else None  # a bool is an int


def tensor_from_list(label: str, value: Any, dtype: torch.dtype) -> torch.Tensor:
    """A nested list of numbers as a tensor of the input's dtype. Floats for an integer or bool input are refused
    rather than rounded: a silently changed value is a wrong answer."""
    if dtype.is_complex:
        raise InputError(f"{label}: complex tensors travel as base64: {{\"dtype\": \"{_name(dtype)}\", \"shape\": "
                         "[...], \"data\": \"...\"}")
    try:
        if dtype.is_floating_point:
            return torch.tensor(value, dtype=dtype)
        tensor = torch.tensor(value)
    except (TypeError, ValueError, RuntimeError, OverflowError) as err:
        raise InputError(f"{label}: expected a nested list of numbers of one rectangular shape ({err})") from None
    if (dtype == torch.bool) != (tensor.dtype == torch.bool) or tensor.dtype.is_floating_point:
        raise InputError(f"{label}: expected {_name(dtype)} values, got {_name(tensor.dtype)} ones; send "
                         f"{'true/false' if dtype == torch.bool else 'whole numbers'}")
    return tensor.to(dtype)


def tensor_from_base64(label: str, doc: dict, dtype: torch.dtype) -> torch.Tensor:
    """{"dtype", "shape", "data"}: a tensor's raw little-endian bytes, base64-encoded, of the input's own dtype
    (bytes are read only as that dtype: torch.frombuffer crashes the process on some others, quantized ones)."""
    name, shape, data = doc.get("dtype"), doc.get("shape"), doc.get("data")
    if name != _name(dtype):
        raise InputError(f"{label}: expected {_name(dtype)} data, got \"dtype\": {json.dumps(name)}; send the tensor "
                         f"as {_name(dtype)}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 62
                                              for n in shape):
        raise InputError(f"{label}: \"shape\" must be a list of sizes (e.g. [2, 16]), not {shape!r}")
    if not isinstance(data, str):
        raise InputError(f"{label}: \"data\" must be the tensor's bytes as a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as err:
        raise InputError(f"{label}: \"data\" is not base64 ({err})") from None
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise InputError(f"{label}: {_name(dtype)}{shape} is {expected} bytes, \"data\" holds {len(raw)}")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)  # bytearray: a buffer the tensor may own


def encode(value: Any, how: str) -> Any:
    """Outputs as JSON: tensors as nested lists or base64 records, containers as lists and objects."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if how == "list":
            return value.tolist()
        data = value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return {"dtype": _name(value.dtype), "shape": list(value.shape), "data": base64.b64encode(data).decode()}
    if isinstance(value, (tuple, list)):
        return [encode(v, how) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v, how) for k, v in value.items()}
    return value


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")
