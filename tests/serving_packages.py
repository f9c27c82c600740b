"""Packages whose signatures the serving tests read requests against, converted once per process, and the request
reader a replica builds for each (the runtime's own input check, as deploy/serving/server.py makes it)."""
from __future__ import annotations

import functools
import os
import tempfile
from typing import Dict, Tuple

import torch

import jit2triton
from jit2triton.deploy.serving.batching import plan_batching
from jit2triton.deploy.serving.json_form import RequestReader
from jit2triton.deploy.serving.server import request_check


class Tagger(torch.nn.Module):
    """x: float32[batch, seq, 4], ids: int64[batch, seq] -> (float32[batch, seq, 4], Dict{mask: bool[batch, seq]})"""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
        return x * 2.0, {"mask": ids > 0}


class Scaled(torch.nn.Module):
    """x: float32[2], alpha: float = 0.5"""

    def forward(self, x: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
        return x * alpha


class OneInput(torch.nn.Module):
    """x: float32[batch, 4]"""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1.0


def _dims():
    return jit2triton.Dim("batch", min=1, max=16), jit2triton.Dim("seq", min=1, max=8)


def _converted(name: str):
    batch, seq = _dims()
    if name == "tagger":
        return jit2triton.convert(torch.jit.script(Tagger()), (torch.randn(2, 3, 4), torch.randint(0, 9, (2, 3))),
                                  dynamic_shapes={"x": {0: batch, 1: seq}, "ids": {0: batch, 1: seq}})
    if name == "scaled":
        return jit2triton.convert(torch.jit.script(Scaled()), (torch.randn(2),))
    return jit2triton.convert(torch.jit.script(OneInput()), (torch.randn(2, 4),), dynamic_shapes={"x": {0: batch}})


@functools.lru_cache(maxsize=None)
def serving_package(name: str):
    """("tagger", "scaled" or "one_input") -> the package loaded as a replica loads it."""
    path = os.path.join(tempfile.mkdtemp(prefix="j2t-serving-"), f"{name}.j2t")
    _converted(name).save(path)
    return jit2triton.load(path)


def reader_for(name: str, max_batch_size: int = 32) -> RequestReader:
    """The request reader a replica of package `name` builds."""
    loaded = serving_package(name)
    signature = loaded.manifest["signature"]
    return RequestReader(signature, plan_batching(signature, max_batch_size).dim is not None,
                         request_check(loaded._runtime))
