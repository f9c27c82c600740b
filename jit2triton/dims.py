"""Dynamic dims: `Dim` and the `dynamic_shapes` argument of `convert`, as torch.export spells them.

    batch, seq = jit2triton.Dim("batch", min=1, max=64), jit2triton.Dim("seq", min=1, max=512)
    m = jit2triton.convert(model, (ids, mask), dynamic_shapes={"input_ids": {0: batch, 1: seq},
                                                               "attention_mask": {0: batch, 1: seq}})

An input's entry maps an axis to its `Dim` (or is a list with a `Dim` or None per axis); inputs are named as the
model names them, or by position (a list or tuple with one entry per input). One `Dim` on several axes says those
sizes are always equal; the package refuses a call that breaks that, or that leaves a dim's range.

`dynamic_shapes="auto"` declares one dim, `batch`, on the first axis of the inputs that share the first input's
batch size, and keeps it static (saying why in the report) when the model specialises on it.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Union

from .errors import ConversionError

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
EXTRA_DRAWS = 4  # runs at other sizes that shape inference observes: enough to fit each size and check the fit


@dataclass(frozen=True)
class Dim:
    """A dynamic dim: a name and the range of sizes the package accepts (`max=None`: no upper bound)."""
    name: str
    min: int = 1
    max: Optional[int] = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.match(self.name):
            raise ValueError(f"Dim name {self.name!r} must be an identifier (letters, digits, _)")
        if not isinstance(self.min, int) or self.min < 1:
            raise ValueError(f"Dim {self.name}: min must be an int >= 1, not {self.min!r}")
        if self.max is not None and (not isinstance(self.max, int) or self.max < self.min):
            raise ValueError(f"Dim {self.name}: max must be an int >= min ({self.min}), not {self.max!r}")

    def __repr__(self) -> str:
        return f"Dim({self.name!r}, min={self.min}, max={self.max})"

    def range_text(self) -> str:
        return f"{self.min}..{self.max if self.max is not None else 'inf'}"


DynamicShapes = Union[None, str, Mapping[Union[str, int], Any], Sequence[Any]]
AUTO_DIM = "batch"  # the dim dynamic_shapes="auto" declares


@dataclass
class DynamicSpec:
    """The resolved `dynamic_shapes`: per input position, its dynamic axes; every dim; and its example size."""
    axes: dict[int, dict[int, Dim]]
    dims: dict[str, Dim]
    example: dict[str, int]

    def __bool__(self) -> bool:
        return bool(self.dims)

    def draws(self, count: int = EXTRA_DRAWS, seed: int = 0) -> list[dict[str, int]]:
        """`count` other sizes for every dim, each dim's differing from draw to draw and from the example's:
        small (conversion runs the model at each), and above 1 where the range allows (1 hides broadcasts). None
        without dims: every draw would be the example itself (a static conversion ran the model five times in each
        observation, the same inputs every time)."""
        if not self.dims:
            return []
        rng = random.Random(seed)
        columns = {}
        for name, dim in self.dims.items():
            example = self.example[name]
            low = 2 if (dim.max is None or dim.max >= 2) and dim.min <= 2 else dim.min
            high = max(2 * example, example + 16, low + 8)
            high = high if dim.max is None else min(dim.max, high)
            pool = [n for n in range(low, high + 1) if n != example] or [example]
            picks = rng.sample(pool, min(count, len(pool)))
            columns[name] = [picks[i % len(picks)] for i in range(count)]
        return [{name: columns[name][i] for name in self.dims} for i in range(count)]

    def bounds(self) -> list[dict[str, int]]:
        """Every dim at its minimum, and at its maximum (where it has one): sizes verification also runs."""
        lows = {name: dim.min for name, dim in self.dims.items()}
        highs = {name: dim.max if dim.max is not None else self.example[name] for name, dim in self.dims.items()}
        return [lows] if highs == lows else [lows, highs]

    def largest(self) -> Optional[dict[str, int]]:
        """Every dim at its maximum (one without a maximum at its example size); None when that is the example."""
        highs = self.bounds()[-1]
        return highs if highs != self.example else None

    def signature(self) -> dict[str, dict[str, Any]]:
        return {name: {"min": d.min, "max": d.max, "example": self.example[name]} for name, d in self.dims.items()}


def auto_batch(inputs: list[Any]) -> Optional[list[Any]]:
    """dynamic_shapes="auto": one dim `batch` (1 and up, no maximum) on the first axis of every tensor input whose
    first axis has the first tensor input's size; None when there is no tensor input to make dynamic."""
    import torch
    tensors = [x for x in inputs if isinstance(x, torch.Tensor) and x.dim() >= 1]
    if not tensors:
        return None
    batch, size = Dim(AUTO_DIM), tensors[0].shape[0]
    return [{0: batch} if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == size else None
            for x in inputs]


def resolve(dynamic_shapes: DynamicShapes, names: list[str], inputs: list[Any]) -> DynamicSpec:
    """Check `dynamic_shapes` against the model's inputs and the example inputs; a clear ConversionError if wrong."""
    import torch
    spec = DynamicSpec({}, {}, {})
    if dynamic_shapes is None:
        return spec
    if isinstance(dynamic_shapes, Mapping):
        entries = {}
        for key, entry in dynamic_shapes.items():
            if isinstance(key, int) and 0 <= key < len(names):
                position = key
            elif isinstance(key, str) and key in names:
                position = names.index(key)
            else:
                raise ConversionError(f"dynamic_shapes names input {key!r}, but the model's inputs are "
                                      f"({', '.join(names)})")
            entries[position] = entry
    elif isinstance(dynamic_shapes, (list, tuple)):
        if len(dynamic_shapes) > len(names):
            raise ConversionError(f"dynamic_shapes has {len(dynamic_shapes)} entries, the model {len(names)} inputs "
                                  f"({', '.join(names)})")
        entries = dict(enumerate(dynamic_shapes))
    else:
        raise ConversionError("dynamic_shapes must be a dict (by input name or position) or a list (one entry per "
                              f"input), not {type(dynamic_shapes).__name__}")
    for position, entry in entries.items():
        if entry is None:
            continue
        value, label = inputs[position], f"input {names[position]!r}"
        if not isinstance(value, torch.Tensor):
            raise ConversionError(f"dynamic_shapes gives dims for {label}, which is not a tensor")
        if isinstance(entry, Mapping):
            axes = dict(entry)
        elif isinstance(entry, (list, tuple)):
            axes = {axis: dim for axis, dim in enumerate(entry) if dim is not None}
        else:
            raise ConversionError(f"dynamic_shapes[{names[position]!r}] must map axes to Dims, not "
                                  f"{type(entry).__name__}")
        resolved = {}
        for axis, dim in axes.items():
            if not isinstance(dim, Dim):
                raise ConversionError(f"dynamic_shapes[{names[position]!r}][{axis!r}] must be a jit2triton.Dim, "
                                      f"not {dim!r}")
            if not isinstance(axis, int) or not -value.dim() <= axis < value.dim():
                raise ConversionError(f"{label} has {value.dim()} dims; dynamic_shapes names axis {axis!r}")
            axis %= value.dim()
            size = value.shape[axis]
            known = spec.dims.get(dim.name)
            if known is not None and known != dim:
                raise ConversionError(f"two different Dims are named {dim.name!r} ({known!r}, {dim!r}); one name is "
                                      "one dim")
            if not dim.min <= size <= (dim.max if dim.max is not None else size):
                raise ConversionError(f"{label} axis {axis} is {size} in the example inputs, outside its Dim "
                                      f"{dim.name}'s range {dim.range_text()}")
            if dim.name in spec.example and spec.example[dim.name] != size:
                raise ConversionError(f"Dim {dim.name} is {spec.example[dim.name]} in one example input and {size} "
                                      f"in {label} axis {axis}; axes that share a Dim must have equal sizes")
            spec.dims[dim.name], spec.example[dim.name] = dim, size
            resolved[axis] = dim
        if resolved:
            spec.axes[position] = resolved
    return spec
