"""Input specs for the CLI and random inputs that fit a package's signature."""
from __future__ import annotations

import re
from typing import Any, Mapping, Optional

import torch

from .dims import Dim, DynamicSpec
from .errors import InputError

_SPEC = re.compile(r"^(?P<shape>[0-9A-Za-z_]*|scalar)(?::(?P<dtype>[a-z0-9]+))?(?::(?P<low>-?\d+)-(?P<high>-?\d+))?$")
_DIM_SPEC = re.compile(r"^(?P<name>[A-Za-wyz_][A-Za-wyz0-9_]*)=(?P<min>\d+):(?P<max>\d+|inf)(?::(?P<example>\d+))?$")


def parse_dim_spec(spec: str) -> tuple[Any, int]:
    """`B=1:64` (dim B, sizes 1 to 64), `S=8:512:128` (example size 128), `B=1:inf` -> (Dim, example size). The
    example size defaults to the smallest above 1 in the range: small, so conversion is quick, and not 1, which
    would hide broadcasts."""
    match = _DIM_SPEC.match(spec.strip())
    if not match:
        raise InputError(f"--dim {spec!r}: expected NAME=MIN:MAX[:EXAMPLE], e.g. B=1:64 or S=8:512:128 (a name "
                         "without the letter x, which separates sizes in --input)")
    low, high = int(match["min"]), None if match["max"] == "inf" else int(match["max"])
    try:
        dim = Dim(match["name"], low, high)
    except ValueError as err:
        raise InputError(f"--dim {spec!r}: {err}") from None
    example = int(match["example"]) if match["example"] else (min(2, high) if high is not None else 2)
    example = max(example, low)
    if high is not None and example > high:
        raise InputError(f"--dim {spec!r}: the example size {example} is outside {low}..{high}")
    return dim, example


def parse_input_spec(spec: str, dims: Optional[dict[str, tuple[Any, int]]] = None) -> Any:
    """`8x3x224x224:float16`, `1x9:int64:0-30522` (ints drawn from [0, 30522)), `scalar:float32`, `int=3`.
    A name in the shape (`Bx128`) is a dynamic dim declared in `dims` (name -> (Dim, example size), see
    parse_dim_spec): the tensor takes its example size, and `dynamic_axes(spec)` names its axes."""
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
    shape = []
    for d in ([] if shape_text in ("", "scalar") else shape_text.split("x")):
        if d.isdigit():
            shape.append(int(d))
        elif d and (dims or {}).get(d):
            shape.append(dims[d][1])
        else:
            raise InputError(f"--input {spec!r}: {d!r} is neither a size nor a dim declared with --dim "
                             f"(e.g. --dim {d or 'B'}=1:64)")
    dtype = getattr(torch, match["dtype"] or "float32", None)
    if not isinstance(dtype, torch.dtype):
        raise InputError(f"--input {spec!r}: unknown dtype {match['dtype']!r} (float32, float16, bfloat16, int64...)")
    low, high = (int(match["low"]), int(match["high"])) if match["low"] is not None else (0, 2)
    return random_tensor(shape, dtype, "cpu", low, high)


def dynamic_axes(spec: str) -> dict[int, str]:
    """The axes of an --input spec that name a dynamic dim: {axis: name}."""
    shape_text = spec.strip().split(":")[0]
    if "=" in spec or shape_text in ("", "scalar"):
        return {}
    return {axis: d for axis, d in enumerate(shape_text.split("x")) if not d.isdigit()}


def parse_sizes(specs, dims: dict[str, dict]) -> dict[str, int]:
    """`--shape B=4,S=128` (repeatable) -> sizes of a package's dynamic dims; the others take the example's."""
    sizes = {name: d["example"] for name, d in dims.items()}
    for item in (i for spec in specs for i in spec.split(",") if i.strip()):
        name, _, text = item.strip().partition("=")
        if name not in dims:
            have = f"its dims are {', '.join(dims)}" if dims else "its shapes are static"
            raise InputError(f"--shape {item!r}: the package has no dynamic dim {name!r}; {have}")
        if not text.isdigit():
            raise InputError(f"--shape {item!r}: expected DIM=SIZE, e.g. {name}=4")
        sizes[name] = int(text)
    return sizes


def random_tensor(shape, dtype: torch.dtype, device, low: int = 0, high: int = 2,
                  generator: Optional[torch.Generator] = None) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) < 0.5
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    return torch.randint(low, max(high, low + 1), shape, generator=generator, dtype=dtype).to(device)


_INT_MOVES = {0.5: 1, -0.5: -1, 1.0: 2}  # an int input at each of VALUE_SHIFTS (conversion.py), kept >= 1


def with_other_values(inputs: list, seed: int, shift: float = 0.0) -> list:
    """The inputs at the same shapes and layouts with other values: floats random (moved by `shift`, so that masks
    such as `x > 0` count differently), bools random, integer tensors the example's rows in another order (ids, masks
    and boxes stay valid) or, for a positive `shift`, random within the example's range (so that their distinct
    values count differently), ints moved (by `shift`: a loop's count `range(n)` is a size a value sets); other
    inputs kept."""
    generator = torch.Generator().manual_seed(seed)
    drawn = []
    for x in inputs:
        if type(x) is int and shift:
            move = _INT_MOVES.get(shift, 1)
            x = x + move if x + move >= 1 else x + 3
        elif isinstance(x, torch.Tensor) and x.numel() and (x.dtype.is_floating_point or x.dtype.is_complex):
            fresh = torch.randn(x.shape, generator=generator).add_(shift).to(dtype=x.dtype, device=x.device)
            x = torch.empty_like(x).copy_(fresh)  # (empty_like keeps a dense input's strides: channels-last stays)
        elif isinstance(x, torch.Tensor) and x.dtype == torch.bool:
            x = (torch.rand(x.shape, generator=generator) < 0.5 + shift / 4).to(x.device)
        elif isinstance(x, torch.Tensor) and x.dim() >= 1 and x.numel() and shift <= 0:
            axis = 0 if x.shape[0] > 1 else x.dim() - 1
            x = x.index_select(axis, torch.randperm(x.shape[axis], generator=generator).to(x.device))
        elif isinstance(x, torch.Tensor) and x.numel() and not x.dtype.is_floating_point:
            low, high = int(x.min()), int(x.max()) + 1  # ids stay inside the vocabulary the example used
            x = torch.empty_like(x).copy_(torch.randint(low, high, x.shape, generator=generator))
        drawn.append(x)
    return drawn


def random_inputs(signature: list[dict], device, seed: int = 0, sizes: Optional[dict[str, int]] = None) -> list[Any]:
    """Fresh random inputs for a package: tensors of the signature's dtype and shape (a dynamic dim at its size in
    `sizes`), ints within the range the example inputs spanned (so token ids stay inside the vocabulary); other
    inputs take their defaults."""
    generator = torch.Generator().manual_seed(seed)
    return [_random_value(entry, entry["name"], device, generator, sizes) for entry in signature]


def _random_value(entry: dict, name: str, device, generator: torch.Generator, sizes: Optional[dict[str, int]]) -> Any:
    """A random value of a signature entry: a tensor, or a list or tuple of them (a detection model's images)."""
    if entry["type"] == "Tensor":
        low, high = entry.get("range", (0, 2))
        try:
            shape = [d if isinstance(d, int) else (sizes or {})[d] for d in entry["shape"]]
        except KeyError as err:
            raise InputError(f"input {name!r} has dynamic dim {err.args[0]}: give its size") from None
        return random_tensor(shape, getattr(torch, entry["dtype"]), device, low, high, generator)
    if "example" in entry:
        return entry["example"]
    if "default" in entry:  # (a detection model's `targets=None`)
        from jit2triton.deploy.literals import decode
        return decode(entry["default"])
    if entry["type"] in ("List", "Tuple") and all(item["type"] == "Tensor" and item["dtype"].startswith(
            ("float", "bfloat", "complex")) for item in entry.get("items", ())) and entry.get("items"):
        items = [_random_value(item, name, device, generator, sizes) for item in entry["items"]]
        return items if entry["type"] == "List" else tuple(items)
    raise InputError(f"cannot make a random value for input {name!r} of type {entry['type']}")


def inputs_at(spec: DynamicSpec, sizes: Mapping[str, int], inputs: list[Any], seed: int) -> list[Any]:
    """The example inputs redrawn with the dynamic dims at `sizes`; inputs with no dynamic dim are kept.

    Floating-point inputs get fresh random values. Integer and bool inputs are the example's values, taken along
    each dynamic axis at random positions of the example: ids, masks, boxes and positions hold structure a uniform
    draw breaks (LayoutLM's boxes need x0 <= x1 in each row), and every element of the example is valid for the
    model, so a draw of them is too."""
    from jit2triton.deploy.signature import CHANNELS_LAST
    generator = torch.Generator().manual_seed(seed)
    drawn = list(inputs)
    for position, axes in spec.axes.items():
        x = inputs[position]
        shape = [sizes[axes[a].name] if a in axes else n for a, n in enumerate(x.shape)]
        if x.dtype.is_floating_point or x.dtype.is_complex or x.numel() == 0:
            drawn[position] = random_tensor(shape, x.dtype, x.device, 0, 2, generator)
            if not x.is_contiguous() and x.dim() in CHANNELS_LAST:  # a channels-last example: its draws are too
                drawn[position] = drawn[position].contiguous(memory_format=CHANNELS_LAST[x.dim()])
            continue
        taken = x
        for axis in axes:
            picks = torch.randint(0, x.shape[axis], (shape[axis],), generator=generator).to(x.device)
            taken = taken.index_select(axis, picks)
        drawn[position] = taken.contiguous()
    return drawn
