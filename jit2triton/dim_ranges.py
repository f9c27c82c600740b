"""Dim ranges the model cannot serve, found before anything is built.

A `Dim` promises every size in its range. A BERT with 512 positions given `seq` up to 1024, or a model whose
reshape needs at least 2 rows given `batch` from 1, would otherwise convert and then fail at call time, far from
the declaration that was wrong. So each dim's ends are run through TorchScript first (the other dims at their
example sizes; then every dim at its smallest together, while shape inference runs every dim at its largest
together): an end the model refuses is found by bisection between it and
the example size, and conversion stops with a ConversionError naming the dim, the furthest size that ran and the
op that failed. With `narrow_dims=True` the range is narrowed to what ran instead, and the report says so.

Bisection assumes the sizes that run form an interval around the example's, which is what a table of positions or
a minimum row count gives; sizes that fail inside the range (a window that must divide the length) are found by
shape inference's draws, which say that the model specialises on the dim.
"""
from __future__ import annotations

import dataclasses
import linecache
import os
import re
from typing import Any, Callable, Optional

import torch

from .dims import DynamicSpec
from .draw_rules import DrawRules
from .inputs import inputs_at
from .errors import ConversionError, TimeBudgetError
from .reference_child import ReferenceCrashed

Reference = Callable[..., Any]
PROBE_SEED = 500  # inputs drawn for the probes: their values do not matter, only their sizes


def checked_ranges(spec: DynamicSpec, reference: Reference, inputs: list, narrow: bool,
                   rules: Optional[DrawRules] = None) -> tuple[DynamicSpec, list[str]]:
    """`spec` with every range the model serves end to end -> (spec, notes on ranges narrowed), or a
    ConversionError naming the first end it does not serve (with `narrow`, that end is moved to the furthest size
    that ran instead). `rules` keep the probes' integer inputs where the model accepts them (draw_rules.py); a
    probe that crashes TorchScript itself (reference_child.py) is an end the model does not serve."""
    notes: list[str] = []
    dims = dict(spec.dims)
    for name, dim in spec.dims.items():
        example = spec.example[name]
        for end in ("max", "min"):
            size = getattr(dim, end)
            if size is None or size == example:
                continue
            failure = _failure(reference, spec, {**spec.example, name: size}, inputs, rules)
            if failure is None:
                continue
            served = _furthest_served(reference, spec, inputs, name, example, size, rules)
            if served == example:
                raise ConversionError(
                    f"Dim {name} is declared {dim.range_text()}, but the model does not run at {name}={size}: "
                    f"{failure}. It ran at the example's {name}={example} and at no size towards {size}: it "
                    f"specialises on {name} (a reshape to a constant shape, or a branch a trace baked in): declare "
                    f"the dim static, or give it a range the model accepts")
            if not narrow:
                word = "largest" if end == "max" else "smallest"
                raise ConversionError(
                    f"Dim {name} is declared {dim.range_text()}, but the model does not run at {name}={size}: "
                    f"{failure}. The {word} {name} that ran is {served}: declare Dim({name!r}, {end}={served}) "
                    f"(or pass narrow_dims=True, --narrow-dims on the CLI, to narrow the range to it)")
            dim = dataclasses.replace(dim, **{end: served})
            notes.append(f"Dim {name}'s {end} narrowed from {size} to {served}: at {name}={size} the model "
                         f"failed ({failure})")
        dims[name] = dim
    axes = {position: {axis: dims[d.name] for axis, d in on.items()} for position, on in spec.axes.items()}
    narrowed = DynamicSpec(axes, dims, spec.example)
    lows = narrowed.bounds()[0]  # (every dim at its largest together runs in shape inference, which says so)
    failure = _failure(reference, narrowed, lows, inputs, rules) if lows != spec.example else None
    if failure is not None:
        at = ", ".join(f"{n}={k}" for n, k in lows.items())
        raise ConversionError(f"each dim's range runs on its own, but with every dim at its smallest ({at}) the "
                              f"model fails: {failure}. Narrow one of the ranges")
    return narrowed, notes


def _furthest_served(reference: Reference, spec: DynamicSpec, inputs: list, name: str, good: int, bad: int,
                     rules: Optional[DrawRules] = None) -> int:
    """The size nearest `bad` that runs, from `good` (which runs) towards `bad` (which does not), by bisection."""
    while abs(bad - good) > 1:
        middle = (good + bad) // 2
        if _failure(reference, spec, {**spec.example, name: middle}, inputs, rules) is None:
            good = middle
        else:
            bad = middle
    return good


def _failure(reference: Reference, spec: DynamicSpec, sizes: dict[str, int], inputs: list,
             rules: Optional[DrawRules] = None) -> Optional[str]:
    """What the model raised when run at `sizes` (None when it ran), in one line that names the failing op."""
    drawn = inputs_at(spec, sizes, inputs, PROBE_SEED)
    drawn = rules.apply(drawn, PROBE_SEED, sizes) if rules else drawn
    try:
        with torch.no_grad(), torch.jit.optimized_execution(False):
            reference(*drawn)
    except TimeBudgetError:
        raise
    except ReferenceCrashed as crashed:  # (a device error: what a CPU copy of the model raised, where it did)
        return crashed.raised or f"TorchScript itself crashed: {crashed}"
    except torch.OutOfMemoryError:
        return "out of memory"
    except Exception as err:  # noqa: BLE001 - whatever the model raises is the answer: it does not run there
        return failure_text(err)
    return None


_FILE = re.compile(r'File "([^"]+)", line (\d+)')  # a loaded archive's serialized code
_FRAME = re.compile(r"^(.+)\((\d+)\): (\w+)$")  # a traced module's recorded Python frames, innermost first
_NAMED = re.compile(r"^[\w.]*(Error|Exception|Interrupt)\b")


def failure_text(err: BaseException) -> str:
    """A TorchScript interpreter error in one line: the statement it failed at, where that is, and the error's own
    last line (its traceback is dozens of lines). An archive's serialized code marks the statement ("<--- HERE");
    a traced module records the Python frames it was traced from, whose first line is read from the source file."""
    lines = [line for line in str(err).splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    if not _NAMED.match(last):
        last = f"{type(err).__name__}: {last}"
    here = next((i for i, line in enumerate(lines) if "<--- HERE" in line), None)
    if here:
        where = next((m for m in (_FILE.search(line) for line in reversed(lines[:here])) if m), None)
        at = f" ({where.group(1)}, line {where.group(2)})" if where else ""
        return f"`{lines[here - 1].strip()}`{at} raised {last}"
    frame = next((m for m in (_FRAME.match(line.strip()) for line in lines[:-1]) if m), None)
    if frame:
        path, line, function = frame.group(1), int(frame.group(2)), frame.group(3)
        statement = linecache.getline(path, line).strip()
        shown = f"`{statement}` " if statement else ""
        return f"{shown}({os.path.basename(path)} line {line}, in {function}) raised {last}"
    return last
