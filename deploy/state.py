"""Module state in the Python runtime: the attributes a scripted model writes (`self._has_warned`, a call counter, a
cached tensor), held by the loaded module between calls.

Each method's plan is a pure function (loaders/module_state.py): it takes the state's values after the method's
inputs and returns the written attributes' new values after its outputs. As in TorchScript, the state belongs to
the loaded module: every call, of any of its methods, sees the last call's writes (`StateStore`, shared by the
methods). In this reference runtime, calls of a module with state run one at a time, each seeing the state every
earlier call left, as TorchScript's calls one after another do (the C++ runtime lets calls that write no state run
alongside: deploy/cpp/src/state.cpp).
Manifest: `state`, a list of {"name", "written", and "value" (a literal) or "weight" (a tensor among the
package's weights, or "weights" for a list of tensors), and "compared" (false: verification does not compare it)}.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import torch

from jit2triton.errors import CorruptPackageError

from .format import STATE, check_fields
from .literals import decode
from .policy import RECONVERT


class StateStore:
    """The state of one loaded module, by attribute name: what its methods read and write."""

    def __init__(self) -> None:
        self.initial: dict[str, Any] = {}
        self.values: dict[str, Any] = {}
        self.lock = threading.Lock()  # held across a whole call, and to read or reset the values

    def add(self, name: str, initial: Any) -> None:
        with self.lock:
            if name not in self.initial:
                self.initial[name] = initial
                self.values[name] = copy_value(initial)

    def reset(self) -> None:
        """Back to the saved values (verification runs every case from there)."""
        with self.lock:
            self.values = {name: copy_value(value) for name, value in self.initial.items()}


class ModelState:
    """The state one plan takes and returns, in its order, over the module's store."""

    def __init__(self, entries: list[dict], weights: dict[str, torch.Tensor], device: torch.device,
                 store: Optional[StateStore] = None) -> None:
        self.store = store if store is not None else StateStore()
        self.names = [str(e["name"]) for e in entries]
        self.written = [str(e["name"]) for e in entries if e["written"] is True]
        self.compared = [name for name, e in zip(self.names, entries) if e["written"] is True and e.get("compared", True)]
        for entry in entries:
            self.store.add(str(entry["name"]), _initial(entry, weights, device))

    def run(self, run: Callable[[list], list], inputs: list) -> list:
        """`run` (the plan) on `inputs` and the current state; stores the new state, returns the model's outputs."""
        with self.store.lock:
            outputs = run(list(inputs) + [self.store.values[name] for name in self.names])
            split = len(outputs) - len(self.written)
            for name, value in zip(self.written, outputs[split:]):
                self.store.values[name] = value
        return outputs[:split]

    def reset(self) -> None:
        self.store.reset()

    def written_values(self) -> dict[str, Any]:
        """The new values verification compares with TorchScript's, by name (deploy/state.py's manifest entries
        say which: not objects the model made, which TorchScript cannot hand to Python)."""
        with self.store.lock:
            return {name: self.store.values[name] for name in self.compared}


def model_state(entries: Optional[list], weights: dict[str, torch.Tensor], device: torch.device,
                store: Optional[StateStore] = None) -> Optional[ModelState]:
    if not entries:
        return None
    if not isinstance(entries, list):
        raise CorruptPackageError("the package's module state is damaged (not a list); " + RECONVERT)
    for entry in entries:
        check_fields(STATE, entry)
    return ModelState(entries, weights, device, store)


def copy_value(value: Any) -> Any:
    """A copy of a state value that the model may write in place (a tensor's `add_`, a list's `append`, a dict's
    item) leaving the original as it was: tensors cloned, lists and dicts made anew, other values shared."""
    if isinstance(value, list):
        return [copy_value(v) for v in value]
    if isinstance(value, dict):
        return {k: copy_value(v) for k, v in value.items()}
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _initial(entry: dict, weights: dict[str, torch.Tensor], device: torch.device) -> Any:
    if "weight" in entry:
        return _weight(entry, entry["weight"], weights, device)
    if "weights" in entry:  # a list of tensors
        return [_weight(entry, name, weights, device) for name in entry["weights"]]
    return decode(entry["value"])


def _weight(entry: dict, name: str, weights: dict[str, torch.Tensor], device: torch.device) -> torch.Tensor:
    tensor = weights.get(name)
    if tensor is None:
        raise CorruptPackageError(f"the package's module state {entry['name']!r} names a tensor it does "
                                  f"not hold; {RECONVERT}")
    return tensor.to(device)
