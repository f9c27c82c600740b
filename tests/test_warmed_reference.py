"""A model the user ran before converting (warmed up, as a benchmark does) is verified against TorchScript's plain
interpreter, not against the fused plan its executor keeps from then on.

TorchScript's profiling executor keeps the first plan it makes for a method for good, and
`torch.jit.optimized_execution(False)` (verification's reference runs under it) does not turn an optimised plan off.
On CUDA that plan runs TorchScript's fuser, which contracts a multiply-add into one FMA where ATen rounds twice, and a
threshold after it decides otherwise: Faster R-CNN warmed by three calls was refused with every op through ATen. The
reference now runs the method's graph in an executor of its own (loaders/torchscript.py, `_OwnExecutor`)."""
from __future__ import annotations

import io

import pytest
import torch
import torch.nn as nn

import jit2triton
from jit2triton.loaders import load_script


def decide() -> torch.jit.ScriptModule:
    """A new scripted model each time: TorchScript compiles a Python class once and its modules share one executor
    per method (so one plan), whichever device or test ran it first."""

    class Decide(nn.Module):
        """How many of x * y + z are positive, and their sum: with z = -(x * y) rounded, ATen's multiply then add
        gives exactly 0 everywhere (none positive), an FMA the rounding error of each product (about half)."""

        def forward(self, x, y, z, scale: float = 1.0):
            s = x * y + z
            return (s > 0).sum(), s.sum() * scale

    return torch.jit.script(Decide().eval())


class Counter(nn.Module):
    """A model with state, warmed before converting: each call starts from the state the last one left."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x, y, z):
        self.calls += 1
        return torch.sigmoid(x * y + z) * self.calls


def _cancelling(device: str, n: int = 4096, seed: int = 0) -> tuple:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(n, generator=g), torch.randn(n, generator=g)
    return x.to(device), y.to(device), (-(x * y)).to(device)


def _warm(model, inputs, calls: int = 4) -> list:
    with torch.inference_mode():
        return [model(*inputs) for _ in range(calls)]


def _pristine(model: torch.jit.ScriptModule) -> torch.jit.ScriptModule:
    """The model saved and loaded again, as a new process would have it: its own types, so executors that have made
    no plan (TorchScript's plain answer, under optimized_execution(False))."""
    buffer = io.BytesIO()
    torch.jit.save(model, buffer)
    buffer.seek(0)
    return torch.jit.load(buffer)


def _plain(model, inputs):
    with torch.no_grad(), torch.jit.optimized_execution(False):
        return model(*inputs)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA")])])
def test_a_warmed_model_is_verified_against_the_plain_interpreter(device: str):
    inputs = _cancelling(device)
    model = decide()
    pristine = _pristine(model)
    fresh = _plain(pristine, inputs)
    assert fresh[0].item() == 0  # ATen's rounding: nothing left over
    warmed = _warm(model, inputs)[-1]
    if device == "cuda":  # the premise: this torch's fuser made the warmed plan round otherwise, and it sticks
        assert warmed[0].item() > 0, "TorchScript's fuser did not contract the multiply-add"
        assert _plain(model, inputs)[0].item() == warmed[0].item()
    reference = load_script(model).function
    assert torch.equal(_plain(reference, inputs)[0], fresh[0])
    converted = jit2triton.convert(model, inputs, device=device)
    assert converted.summary()["verification"]["status"] == "passed"
    for seed in (0, 1):
        drawn = _cancelling(device, seed=seed)
        count, total = converted(*drawn)
        expected = _plain(pristine, drawn)
        assert count.item() == expected[0].item()
        torch.testing.assert_close(total, expected[1], rtol=1e-4, atol=1e-4)


def test_the_reference_fills_the_methods_defaults_and_runs_in_its_own_executor():
    """The reference is a new function over the method's graph: TorchScript's defaults are filled (its schema has
    none), and running it leaves the user's module's executor as it was."""
    model = decide()
    inputs = _cancelling("cpu")
    _warm(model, inputs)
    reference = load_script(model).function
    assert reference.run is not None and reference.name == "forward"
    for args in (inputs, (*inputs, 2.5)):
        got, expected = _plain(reference, args), _plain(model, args)
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def test_a_warmed_model_with_state_converts_and_continues_its_sequence():
    model = torch.jit.script(Counter().eval())
    twin = _pristine(model)
    inputs = _cancelling("cpu", n=64)
    _warm(model, inputs, calls=3)
    converted = jit2triton.convert(model, inputs)
    assert model.calls == 3  # (conversion ran a copy: the user's module is left as it was)
    twin.calls = 3
    for seed in range(3):
        drawn = _cancelling("cpu", n=64, seed=seed)
        torch.testing.assert_close(converted(*drawn), _plain(twin, drawn), rtol=1e-6, atol=1e-6)


def test_a_warmed_script_function_converts():
    @torch.jit.script
    def decide(x, y, z):
        return (x * y + z > 0).sum()

    inputs = _cancelling("cpu")
    expected = _plain(decide, inputs)  # (TorchScript's first call, in its plain interpreter: before any warming)
    _warm(decide, inputs)
    reference = load_script(decide).function
    assert torch.equal(_plain(reference, inputs), expected)
    converted = jit2triton.convert(decide, inputs)
    assert torch.equal(converted(*inputs), expected)
