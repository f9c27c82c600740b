"""What a package cannot carry is refused by name, with what to do, never with an internal error:
- a call back into Python (a function or method marked @torch.jit.ignore: a prim::PythonOp), naming the function and
  its line; the method form said "the graph still uses the module object itself ... please report it";
- a sparse weight or attribute, naming it; ATen's "Could not run 'aten::equal' with arguments from the 'SparseCPU'
  backend" reached the user. (A sparse tensor the model makes is carried: it runs through ATen.)
(No `from __future__ import annotations` here: TorchScript reads the ignored functions' annotations as written.)"""

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
    with pytest.raises(ConversionError, match=rf"prim::PythonOp \({name}\) \(File .*test_refused_model_parts.py.*"
                                              r"drop @torch.jit.ignore"):
        jit2triton.convert(torch.jit.script(model()), (torch.randn(3),), backend="cpp")


class HoldsASparseBuffer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("adjacency", torch.eye(4).to_sparse())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sparse.mm(self.adjacency, x)


def test_a_sparse_weight_is_refused_naming_it() -> None:
    """A package stores dense tensors only: a sparse buffer is refused by name, with what to do (conversion failed
    inside verification with ATen's "Could not run 'aten::equal' with arguments from the 'SparseCPU' backend")."""
    with pytest.raises(ConversionError, match=r"torch.sparse_coo tensor \(adjacency\).*\.to_dense\(\)"):
        jit2triton.convert(torch.jit.script(HoldsASparseBuffer()), (torch.randn(4, 3),), backend="cpp")


class ReturnsSparse(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (torch.relu(x) * 2.0).to_sparse()


def test_a_sparse_tensor_the_model_makes_is_returned_as_torchscript_returns_it(tmp_path) -> None:
    """Not refused: a sparse tensor the model makes runs through ATen (no kernel reads it) and comes back sparse.
    Conversion failed reading its data pointer ("Cannot access data pointer of Tensor that doesn't have storage")."""
    model = torch.jit.script(ReturnsSparse())
    converted = jit2triton.convert(model, (torch.randn(4, 4),), backend="cpp")
    assert converted.summary()["native_nodes"] >= 2  # (relu and the multiply stay a kernel)
    path = str(tmp_path / "sparse.j2t")
    converted.save(path)
    package = jit2triton.load(path)
    x = torch.randn(4, 4)
    got, want = package(x), model(x)
    assert got.layout == torch.sparse_coo and torch.equal(got.to_dense(), want.to_dense())
