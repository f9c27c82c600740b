"""Module state in the Python runtime: the attributes a scripted model writes (`self._has_warned`, a call counter, a
cached tensor), held by the loaded module between calls.

The plan is a pure function (loaders/module_state.py): it takes the state's values after the model's inputs and
returns the written attributes' new values after its outputs. As in TorchScript, the state belongs to the loaded
module and every call sees the last call's writes; calls from several threads share it, each reading it whole when
it starts and writing it whole when it ends (TorchScript's own attribute writes are not synchronised at all: here a
call never sees half of another's writes). Manifest: `state`, a list of {"name", "written", and "value" (a literal)
or "weight" (a tensor among the package's weights)}.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional

import torch

from jit2triton.errors import CorruptPackageError

from .literals import decode


class ModelState:
    def __init__(self, entries: list[dict], weights: dict[str, torch.Tensor], device: torch.device) -> None:
        self.names = [str(e["name"]) for e in entries]
        self.written = [i for i, e in enumerate(entries) if e["written"] is True]
        self.initial = [_initial(e, weights, device) for e in entries]
        self.lock = threading.Lock()
        self.values: list[Any] = []
        self.reset()

    def run(self, run: Callable[[list], list], inputs: list) -> list:
        """`run` (the plan) on `inputs` and the current state; stores the new state, returns the model's outputs."""
        with self.lock:
            current = list(self.values)
        outputs = run(list(inputs) + current)
        split = len(outputs) - len(self.written)
        with self.lock:
            for i, value in zip(self.written, outputs[split:]):
                self.values[i] = value
        return outputs[:split]

    def reset(self) -> None:
        """Back to the saved values (verification runs every case from there)."""
        values = [v.clone() if isinstance(v, torch.Tensor) else v for v in self.initial]  # written in place, maybe
        with self.lock:
            self.values = values

    def written_values(self) -> list[Any]:
        with self.lock:
            return [self.values[i] for i in self.written]


def model_state(entries: Optional[list], weights: dict[str, torch.Tensor], device: torch.device) -> Optional[ModelState]:
    if not entries:
        return None
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise CorruptPackageError("the package's module state is damaged; re-run `jit2triton convert`")
    return ModelState(entries, weights, device)


def _initial(entry: dict, weights: dict[str, torch.Tensor], device: torch.device) -> Any:
    if "weight" in entry:
        tensor = weights.get(entry["weight"])
        if tensor is None:
            raise CorruptPackageError(f"the package's module state {entry['name']!r} names a tensor it does not hold; "
                                      "re-run `jit2triton convert`")
        return tensor.to(device)
    return decode(entry["value"])
