"""A model that calls back into Python (a function or method marked @torch.jit.ignore: a prim::PythonOp in its graph)
is refused with what to do, naming the function and its line. The method form said "the graph still uses the module
object itself ... please report it", as if it were a bug. (No `from __future__ import annotations` here: TorchScript
reads the ignored functions' annotations as written.)"""

import pytest
import torch

import jit2triton
from jit2triton.errors import ConversionError


@torch.jit.ignore
def _python_side(x: torch.Tensor) -> torch.Tensor:
    return x + 1


class CallsAFunction(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _python_side(x.relu())


class CallsAMethod(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.python_side(x.relu())

    @torch.jit.ignore
    def python_side(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


@pytest.mark.parametrize("model, name", [(CallsAFunction, "_python_side"), (CallsAMethod, "python_side")])
def test_a_call_back_into_python_is_refused_with_what_to_do(model, name: str) -> None:
    with pytest.raises(ConversionError, match=rf"prim::PythonOp \({name}\) \(File .*test_python_calls.py.*"
                                              r"drop @torch.jit.ignore"):
        jit2triton.convert(torch.jit.script(model()), (torch.randn(3),), backend="cpp")
