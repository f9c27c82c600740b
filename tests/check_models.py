"""Models for the tests of `run --check` and `j2t-run --torchscript`: a package, the model it came from, and another
model with the same signature and other weights, which a check must tell apart."""
from __future__ import annotations

from pathlib import Path

import torch

import jit2triton


def _mlp(seed: int) -> torch.jit.ScriptModule:
    torch.manual_seed(seed)
    layers = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    return torch.jit.trace(layers, torch.randn(2, 8))


def two_models_one_signature(folder: Path) -> tuple[Path, Path, Path]:
    """(package, right.pt it was converted from, other.pt: the same layers, seeded otherwise)."""
    right, other, package = folder / "right.pt", folder / "other.pt", folder / "right.j2t"
    torch.jit.save(_mlp(0), right)
    torch.jit.save(_mlp(1), other)
    jit2triton.convert(str(right), example_inputs=(torch.randn(2, 8),)).save(package)
    return package, right, other
