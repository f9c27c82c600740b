"""A module attribute that holds tensors in a container (a Dict[str, Tensor] table by name, a list or tuple of
tensors) becomes, once frozen, a constant container: it is built at run time from one weight per tensor
(transpiler/from_torchscript.py). A dict of tensors raised "TypeError: cannot store a literal of
type Tensor in a package"."""
from __future__ import annotations

import os
from typing import Dict, List

import pytest
import torch

import jit2triton

from helpers import FRESH_SEED


class Tables(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.by_name: Dict[str, torch.Tensor] = {"small": torch.randn(4), "large": torch.randn(4) * 10}
        self.by_id: Dict[int, torch.Tensor] = {0: torch.randn(4), 7: torch.randn(4)}
        self.pairs: List[Dict[str, torch.Tensor]] = [{"w": torch.randn(4)}, {"w": torch.randn(4)}]

    def forward(self, x: torch.Tensor, name: str = "small", index: int = 7) -> torch.Tensor:
        return x * self.by_name[name] + self.by_id[index] - self.pairs[1]["w"]


@pytest.mark.parametrize("backend", ["cpp", "aten"])
def test_a_dict_of_tensors_attribute_converts_and_runs_in_the_runtime(backend: str, tmp_path) -> None:
    torch.manual_seed(0)
    model = torch.jit.script(Tables().eval())
    converted = jit2triton.convert(model, (torch.randn(4),), backend=backend)
    path = os.path.join(tmp_path, "tables.j2t")
    converted.save(path)
    g = torch.Generator().manual_seed(FRESH_SEED)
    package = jit2triton.load(path)
    for name, index in (("small", 7), ("large", 7)):  # (an int input is served at its example value)
        x = torch.randn(4, generator=g)
        torch.testing.assert_close(package(x, name, index), model(x, name, index), rtol=1e-6, atol=1e-6)
