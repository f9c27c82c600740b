"""Comparing a package with the TorchScript model it came from: loading the model the CLI's `--check` and
`--against` name, calling it on the package's inputs, and the largest difference of the outputs, through tuples,
lists and dicts."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterator, Optional

import torch

from .errors import InputError, ModelLoadError
from .verify import ABSOLUTE_TOLERANCE, RELATIVE_TOLERANCE, compare
from .verify import _first_line as _interpreter_cause


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


@dataclass
class OutputCheck:
    """One output (a tensor of a tuple, list or dict, or a value) against TorchScript's: what the check found."""
    where: str
    line: str  # its worst error and the tolerance it was held to, or what differs in its structure
    differs: bool
    error: float  # the largest absolute difference; inf where the structure, dtype or shape differ


def check_outputs(actual: Any, expected: Any, rtol: Optional[float] = None,
                  atol: Optional[float] = None) -> list[OutputCheck]:
    """Each output against TorchScript's, held to convert-time verification's rule: its largest error within `rtol`
    of its largest magnitude plus `atol` (by default verification's for its dtype), integers and bools with at most
    verification's small fraction of elements flipped, structure, dtypes and shapes equal."""
    return [_check(where, a, e, rtol, atol) for where, a, e in _pairs(actual, expected, "output")]


def _pairs(actual: Any, expected: Any, where: str) -> Iterator[tuple[str, Any, Any]]:
    """(where, actual, expected) for each leaf of `expected`; where the structures part, the pair at that level."""
    if isinstance(expected, (tuple, list)) and type(actual) is type(expected) and len(actual) == len(expected):
        for i, (a, e) in enumerate(zip(actual, expected)):
            yield from _pairs(a, e, f"{where}[{i}]")
    elif isinstance(expected, dict) and isinstance(actual, dict) and list(actual) == list(expected):
        for key in expected:
            yield from _pairs(actual[key], expected[key], f"{where}[{key!r}]")
    else:
        yield where, actual, expected


def _check(where: str, actual: Any, expected: Any, rtol: Optional[float], atol: Optional[float]) -> OutputCheck:
    if not (isinstance(expected, torch.Tensor) and isinstance(actual, torch.Tensor)
            and actual.shape == expected.shape and actual.dtype == expected.dtype):
        found = compare(actual, expected, where)
        line = f"{where}: {found[0].detail}: DIFFERS" if found else f"{where}: equal: ok"
        return OutputCheck(where, line, bool(found), float("inf") if found else 0.0)
    name = str(expected.dtype).removeprefix("torch.")
    tolerance = (RELATIVE_TOLERANCE.get(name, 1e-3) if rtol is None else rtol,
                 ABSOLUTE_TOLERANCE.get(name, 1e-5) if atol is None else atol)
    found = compare(actual, expected, where, tolerance=tolerance)
    error = max_abs_error(actual, expected)
    held = (f"rtol {tolerance[0]:g} of the largest magnitude {_largest(expected):.3g}, atol {tolerance[1]:g}"
            if expected.is_floating_point() or expected.is_complex() else "exact, but for a few flips")
    verdict = f"DIFFERS ({found[0].detail})" if found else "ok"
    return OutputCheck(where, f"{where} {_short(expected)}: max abs error {error:.3e} ({held}): {verdict}",
                       bool(found), error)


def _largest(tensor: torch.Tensor) -> float:
    finite = tensor.detach().abs()
    finite = finite[finite.isfinite()]
    return float(finite.max()) if finite.numel() else 0.0


def _first_line(err: Exception) -> str:
    """The line of a TorchScript error that says what went wrong: for an op that failed in the interpreter, its last
    line, the op's own error (verify's rule: the lines between are tracebacks of source); else the first line that is
    not a traceback's."""
    if "failed in the TorchScript interpreter" in str(err):
        return _interpreter_cause(err)
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
