"""Verification of a module whose methods share state: each method is verified on its own (verify.py), and then the
package is called as a deployed model is, its methods in an order that exercises them (forward, forward, reset,
forward, ...) from the saved state, with the outputs and the state after every call compared with the TorchScript
module called in the same order.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from jit2triton.loaders.module_state import read_state, restore_state

from .errors import InputError, Jit2TritonError
from .inputs import random_inputs
from .verify import FRESH_SEED, Mismatch, compare


def call_order(methods: list[str], methods_first: bool = False) -> list[str]:
    """forward twice, then each other method followed by forward twice: every method is called, and forward after
    each (what it does to the state shows), at least 6 calls. `methods_first`: each other method before forward
    (a decoder whose forward needs `encode` called first)."""
    order = [] if methods_first and methods else ["forward", "forward"]
    for name in methods or ["forward"]:
        order += [name, "forward", "forward"] if name != "forward" else ["forward"]
    return order + ["forward"] * max(0, 6 - len(order))


def check_methods_in_order(script, examples: dict[str, list], signatures: dict[str, list], runtimes: dict[str, Callable],
                           attribute: Callable[[str], Any], device: torch.device) -> tuple[list[Mismatch], list[str], str]:
    """Mismatches of the package's methods (`runtimes`, by name, loaded from the saved state and sharing it;
    `attribute` reads a value of it) against the TorchScript
    module (`script`, the loaded ScriptGraph), called in `call_order` (or, where TorchScript refuses that, with the
    other methods first); notes for the report; and the order called."""
    methods = [name for name in examples if name != "forward"]
    functions = {"forward": script.function, **{name: m.function for name, m in script.methods.items()}}
    slots: dict[str, Any] = {}  # by name, the method that writes it preferred (read_state compares written ones)
    for slot in (slot for s in [script, *script.methods.values()] for slot in s.state):
        if slot.name not in slots or slot.written:
            slots[slot.name] = slot
    module = next(getattr(f, "module") for f in functions.values() if hasattr(f, "module"))
    expected, refused = None, ""
    for order in (call_order(methods), call_order(methods, methods_first=True)):
        drawn = []
        for number, name in enumerate(order):
            try:
                drawn.append((name, random_inputs(signatures[name], device, FRESH_SEED + 100 + number)))
            except InputError:
                drawn.append((name, list(examples[name])))
        for calls in (drawn, [(name, list(examples[name])) for name in order]):
            try:
                expected = _reference_run(calls, functions, module, list(slots.values()))
            except Exception as err:  # noqa: BLE001 - TorchScript refuses this order (a method's own assert)
                text = str(err).strip()
                refused = f"{type(err).__name__}: {text.splitlines()[-1][:160] if text else ''}"
                continue
            break
        if expected is not None:
            break
    if expected is None:
        return [], [f"TorchScript raised calling the methods in the orders {', '.join(call_order(methods))} and "
                    f"{', '.join(call_order(methods, True))} ({refused}); not compared"], ""
    compared = [slot.name for slot in slots.values() if slot.written and slot.compared]
    found: list[Mismatch] = []
    for number, ((name, inputs), want) in enumerate(zip(calls, expected), 1):
        where = f"call {number} ({name}) of {', '.join(order)}"
        try:
            output = runtimes[name](*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        except Jit2TritonError as err:
            return [Mismatch(f"on {where}", math.inf, f"the package raised {type(err).__name__}: {err}")], [], \
                ", ".join(order)
        state = {key: attribute(key) for key in compared}
        found = [Mismatch(f"{m.where} on {where}", m.error, m.detail)
                 for m in compare(output, want[0], "output") + compare(state, want[1], "state")]
        if found:
            return found, [], ", ".join(order)
    return [], [], ", ".join(order)


def _reference_run(calls: list[tuple[str, list]], functions: dict[str, Any], module, slots: list) -> list[tuple]:
    restore_state(module, slots)
    results = []
    with torch.jit.optimized_execution(False):
        for name, inputs in calls:
            function = functions[name]
            function = getattr(function, "method", function)  # a stateful method: without its restore of the state
            output = function(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
            results.append((output, read_state(module, slots)))
    return results
