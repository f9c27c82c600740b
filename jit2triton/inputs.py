"""Input specs for the CLI and random inputs that fit a package's signature."""
from __future__ import annotations

import re
from typing import Any, Optional

import torch

from .errors import InputError

_SPEC = re.compile(r"^(?P<shape>[0-9x]*|scalar)(?::(?P<dtype>[a-z0-9]+))?(?::(?P<low>-?\d+)-(?P<high>-?\d+))?$")


def parse_input_spec(spec: str) -> Any:
    """`8x3x224x224:float16`, `1x9:int64:0-30522` (ints drawn from [0, 30522)), `scalar:float32`, `int=3`."""
    spec = spec.strip()
    if "=" in spec:
        kind, _, text = spec.partition("=")
        casts = {"int": int, "float": float, "bool": lambda s: s.lower() in ("1", "true", "yes")}
        if kind not in casts:
            raise InputError(f"--input {spec!r}: scalar inputs are written int=3, float=0.5 or bool=true")
        return casts[kind](text)
    match = _SPEC.match(spec)
    if not match:
        raise InputError(f"--input {spec!r}: expected SHAPE[:DTYPE][:LOW-HIGH], e.g. 8x3x224x224:float16 or "
                         "1x128:int64:0-30522 (use 'scalar:float32' for a 0-d tensor)")
    shape_text = match["shape"]
    shape = [] if shape_text in ("", "scalar") else [int(d) for d in shape_text.split("x")]
    dtype = getattr(torch, match["dtype"] or "float32", None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"--input {spec!r}: unknown dtype {match['dtype']!r} (float32, float16, bfloat16, int64...)")
    low, high = (int(match["low"]), int(match["high"])) if match["low"] is not None else (0, 2)
    return random_tensor(shape, dtype, "cpu", low, high)


def random_tensor(shape, dtype: torch.dtype, device, low: int = 0, high: int = 2,
                  generator: Optional[torch.Generator] = None) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) < 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    return torch.randint(low, max(high, low + 1), shape, generator=generator, dtype=dtype).to(device)


def random_inputs(signature: list[dict], device, seed: int = 0) -> list[Any]:
    """Fresh random inputs for a package: tensors of the signature's dtype and shape, ints within the range the
    example inputs spanned (so token ids stay inside the vocabulary); other inputs take their defaults."""
    generator = torch.Generator().manual_seed(seed)
    values = []
    for entry in signature:
        if entry["type"] == "Tensor":
            low, high = entry.get("range", (0, 2))
            values.append(random_tensor(entry["shape"], getattr(torch, entry["dtype"]), device, low, high, generator))
        elif "example" in entry:
            values.append(entry["example"])
        else:
            raise InputError(f"cannot make a random value for input {entry['name']!r} of type {entry['type']}")
    return values
