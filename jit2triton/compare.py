"""Comparing outputs of a package with the TorchScript model's, through tuples, lists and dicts."""
from __future__ import annotations

from typing import Any

import torch


def max_abs_error(actual: Any, expected: Any) -> float:
    """Largest absolute difference over all tensors; raises ValueError if the structures differ."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or actual.dtype != expected.dtype:
            raise ValueError(f"output mismatch: expected {_short(expected)}, got {_short(actual)}")
        if expected.numel() == 0:
            return 0.0
        a, e = actual.detach().to(expected.device).double(), expected.detach().double()
        diff = (a - e).abs().masked_fill(a.isnan() & e.isnan(), 0.0)
        return float(diff.nan_to_num(float("inf")).max())
    if isinstance(expected, (tuple, list)):
        if type(actual) is not type(expected) or len(actual) != len(expected):
            raise ValueError(f"output mismatch: expected {_short(expected)}, got {_short(actual)}")
        return max([max_abs_error(a, e) for a, e in zip(actual, expected)], default=0.0)
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or actual.keys() != expected.keys():
            raise ValueError(f"output mismatch: expected {_short(expected)}, got {_short(actual)}")
        return max([max_abs_error(actual[k], expected[k]) for k in expected], default=0.0)
    if actual != expected:
        raise ValueError(f"output mismatch: expected {expected!r}, got {actual!r}")
    return 0.0


def _short(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor {str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, (tuple, list, dict)):
        return f"{type(value).__name__} of {len(value)}"
    return type(value).__name__
