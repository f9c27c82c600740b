"""Comparing a package with the TorchScript model it came from: loading the model the CLI's `--check` and
`--against` name, calling it on the package's inputs, and the largest difference of the outputs, through tuples,
lists and dicts."""
from __future__ import annotations

import os
from typing import Any

import torch

from .errors import InputError, ModelLoadError


def load_reference(path: str, device: torch.device) -> torch.jit.ScriptModule:
    """The TorchScript model at `path` on `device`, in eval mode; a ModelLoadError if it is missing or not one."""
    if not os.path.isfile(path):
        raise ModelLoadError(f"TorchScript model not found: {path}")
    try:
        return torch.jit.load(path, map_location=device).eval()
    except Exception as err:  # noqa: BLE001 - torch reports a bad archive with several exception types
        raise ModelLoadError(f"{path} is not a TorchScript archive torch.jit.load can read: "
                             f"{_first_line(err)}") from None


def call_reference(model: Any, inputs: list, path: str, signature: str) -> Any:
    """`model(*inputs)`; an InputError, naming both signatures, when the model does not take the package's inputs
    (another model's .pt given by mistake)."""
    try:
        return model(*inputs)
    except Exception as err:  # noqa: BLE001 - TorchScript raises RuntimeError for a missing or mistyped argument
        raise InputError(f"{path} does not take the inputs of the package, whose signature is {signature}: "
                         f"{_first_line(err)}; is it the model the package was converted from?") from None


def _first_line(err: Exception) -> str:
    """The line of a TorchScript error that says what went wrong (its first is often a generic header)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    useful = [line for line in lines if "failed in the TorchScript interpreter" not in line
              and not line.startswith(("Traceback", "File ", "~", "^"))]
    return ((useful or lines or [type(err).__name__])[0])[:300]


def max_abs_error(actual: Any, expected: Any) -> float:
    """Largest absolute difference over all tensors; an InputError (a ValueError) if the structures differ."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or actual.dtype != expected.dtype:
            raise InputError(f"output mismatch: expected {_short(expected)}, got {_short(actual)}")
        if expected.numel() == 0:
            return 0.0
        a, e = actual.detach().to(expected.device).double(), expected.detach().double()
        diff = (a - e).abs().masked_fill(a.isnan() & e.isnan(), 0.0)
        return float(diff.nan_to_num(float("inf")).max())
    if isinstance(expected, (tuple, list)):
        if type(actual) is not type(expected) or len(actual) != len(expected):
            raise InputError(f"output mismatch: expected {_short(expected)}, got {_short(actual)}")
        return max([max_abs_error(a, e) for a, e in zip(actual, expected)], default=0.0)
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise InputError(f"output mismatch: expected {_short(expected)}, got {_short(actual)}")
        return max([max_abs_error(actual[k], expected[k]) for k in expected], default=0.0)
    if actual != expected:
        raise InputError(f"output mismatch: expected {expected!r}, got {actual!r}")
    return 0.0


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, (tuple, list, dict)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__
