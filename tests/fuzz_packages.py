"""Packages for the mutation fuzz (tests/mutate_packages.py) beyond the small traced one: a plan with control flow
and a dynamic dim, and one that builds and mutates lists and dicts, so that mutations reach every kind of step."""
from __future__ import annotations

import hashlib
import json
from typing import Dict, List

import torch

import jit2triton
from jit2triton.deploy.cpp_runtime import CARRIED

from package_tools import read_members, write_members


class Small(torch.nn.Module):
    """conftest's small_package: a linear through ATen, then one kernel."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x, y):
        return torch.relu(self.linear(x)) + y


class Looped(torch.nn.Module):
    """A loop, a branch and a dynamic dim."""

    def forward(self, x, n: int):
        y = x
        for _ in range(n):
            if bool(y.sum() > 0):
                y = torch.relu(y) * 2 - 1
            else:
                y = y.exp() + 1
        return y.sin()


class Containers(torch.nn.Module):
    """Lists and dicts built, stored into and read back, and returned: an edited argument may alias a container
    into itself."""

    def forward(self, x, y):
        found: Dict[str, torch.Tensor] = {"x": x}
        found["y"] = torch.relu(y)
        parts: List[torch.Tensor] = [found["x"], found["y"]]
        parts.append(x * y + 1)
        totals: Dict[str, List[torch.Tensor]] = {"parts": parts}
        return {"sum": torch.stack(totals["parts"]).sum(0), "first": parts[0]}, parts


class Damageable(torch.nn.Module):
    """A kernel reading a weight, a branch, outputs planned into the arena, a dynamic batch and a dict returned as
    built: the places the hand edits of issue 34 (item 4) crashed."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.randn(32))
        self.linear = torch.nn.Linear(32, 32)

    def forward(self, x, flag: bool):
        y = torch.relu(x * self.scale + 1)
        if flag:
            y = y.sin() * 2
        else:
            y = y.cos() + 1
        found: Dict[str, torch.Tensor] = {"y": y}
        found["z"] = torch.tanh(self.linear(y)) + y
        return found


def _saved(module, path: str) -> str:
    """The package at `path` without the C++ runtime build it carries (runtime/...): 1.4 MB in which random damage
    would mostly land, where only a checksum reads it; the mutations are meant for what the runtimes interpret (and
    the seeds where they once disagreed keep their mutations)."""
    module.save(path)
    members = {name: data for name, data in read_members(path).items()
               if not name.startswith(CARRIED) and name != "checksums.json"}
    members["checksums.json"] = json.dumps({n: hashlib.sha256(d).hexdigest() for n, d in members.items()},
                                           indent=1).encode()
    write_members(path, members)
    return path


def damageable_package(folder) -> str:
    path = str(folder / "damageable.j2t")
    batch = jit2triton.Dim("b", min=1, max=64)
    torch.manual_seed(0)  # its weights: Damageable() after the same seed has them
    return _saved(jit2triton.convert(torch.jit.script(Damageable()), (torch.randn(4, 32), True),
                                     dynamic_shapes=[{0: batch}, None]), path)


def small_package(folder) -> str:
    path = str(folder / "small.j2t")
    torch.manual_seed(0)
    example = (torch.randn(2, 4), torch.randn(2, 3))
    return _saved(jit2triton.convert(torch.jit.trace(Small().eval(), example), example), path)


def looped_package(folder) -> str:
    path = str(folder / "looped.j2t")
    batch = jit2triton.Dim("b", min=1, max=64)
    torch.manual_seed(0)  # the plan depends on the example's values (seed 3 gives other slots): one seed, one mutation
    return _saved(jit2triton.convert(torch.jit.script(Looped()), (torch.randn(4, 8), 3),
                                     dynamic_shapes=[{0: batch}, None]), path)


def containers_package(folder) -> str:
    path = str(folder / "containers.j2t")
    return _saved(jit2triton.convert(torch.jit.script(Containers()), (torch.randn(3, 5), torch.randn(3, 5))), path)
