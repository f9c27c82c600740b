"""Which nodes of a reduced-precision package must stay float32 for it to meet the accuracy asked for.

While the package misses it, one node moves back to float32: the first one, in execution order, whose reduced
precision makes the outputs miss, found by a binary search over "the first k candidate nodes reduced, the others
float32". How far a plan misses is the caller's to measure (it runs the graph through ATen against the float32
model: jit2triton/precision.py).
"""
from __future__ import annotations

import math
import time
from typing import Callable

from jit2triton.errors import ConversionError

from .precision import PrecisionPlan

MAX_MOVED = 24  # nodes moved back to float32 before the conversion gives up on the accuracy asked for
MAX_SEARCH_S = 600.0  # ... or seconds spent searching for them (each step runs the model a few times)
Misses = Callable[[PrecisionPlan], float]  # how far a plan misses the accuracy (its largest error; 0: it meets it)


def keep_float32_until_accurate(plan: PrecisionPlan, missed: float, misses: Misses, accuracy: str,
                                say: Callable[[str], None]) -> bool:
    """Move nodes of `plan` back to float32 until `misses(plan)` is 0; `missed` is how far it misses now, and
    `accuracy` says what is asked ("rtol=..., atol=..."). -> whether any moved; a ConversionError when the search
    gives up."""
    if not missed:
        return False
    say(f"the {plan.dtype} model misses the accuracy asked for: searching for the nodes that must stay float32")
    deadline = time.monotonic() + MAX_SEARCH_S
    for _ in range(MAX_MOVED):
        if time.monotonic() > deadline:
            break
        position, error = _first_culprit(plan, list(plan.candidates), misses)
        plan.keep[position] = (f"accuracy: in {plan.dtype} the outputs missed {accuracy} (max error {error:.3g} of "
                               "the largest magnitude)")
        moved = next((n for n in plan.fp32_nodes if n["position"] == position), {})
        say(f"keeping {moved.get('op', 'a node')} at {moved.get('source') or 'an unknown line'} in float32")
        if not misses(plan):
            return True
    raise ConversionError(f"the {plan.dtype} package still misses accuracy {accuracy} with {len(plan.keep)} nodes "
                          f"moved back to float32 (the search stops at {MAX_MOVED} nodes or {MAX_SEARCH_S:.0f}s): "
                          "its error is spread over the model, not in a few ops; convert with a looser accuracy= or "
                          "precision='fp32'")


def _first_culprit(plan: PrecisionPlan, candidates: list[int], misses: Misses) -> tuple[int, float]:
    """(position, error): the candidate whose reduced precision first makes the outputs miss, by a binary search
    over how many candidates (in execution order) run reduced while the rest run in float32."""
    def error_with_first(k: int) -> float:
        return misses(PrecisionPlan(plan.dtype, {**plan.keep, **{p: "search" for p in candidates[k:]}},
                                    plan.io_reduced))

    if not candidates or error_with_first(0):
        raise ConversionError(f"the {plan.dtype} package misses the accuracy asked for even with every op in "
                              "float32 (its weights are stored in the reduced type): convert with a looser "
                              "accuracy= or precision='fp32'")
    low, high, error = 0, len(candidates), math.inf  # reducing the first `low` meets it, the first `high` misses
    while high - low > 1:
        middle = (low + high) // 2
        missed = error_with_first(middle)
        if missed:
            high, error = middle, missed
        else:
            low = middle
    return candidates[high - 1], error
