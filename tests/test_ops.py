"""One test per op the op table lowers, generated from the table itself: a new lowering cannot land untested.

Each op's samples (`op_samples.py`) are converted with the C++ backend, saved and loaded; the op must have run in a
generated kernel (a lowering that silently falls back to ATen fails here), and the package must give TorchScript's
outputs on fresh random inputs, passed both contiguous and as permuted views, within tolerances that fit each
output's dtype (integer and bool outputs exactly).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

import jit2triton
from jit2triton.transpiler.lowering import load_lowerings
from jit2triton.transpiler.op_table import OP_TABLE

from op_samples import BACKSLASH_CONTINUED_SOURCE, NARROW_INTEGER_MAX_MIN, SAMPLES, Sample

load_lowerings()
LOWERED = sorted(op for op, info in OP_TABLE.items() if info.lowering is not None)
EXAMPLE_SEED, FRESH_SEED = 0, 1234
TOLERANCES = {torch.float32: (1e-5, 1e-5), torch.float64: (1e-7, 1e-7), torch.bfloat16: (1.6e-2, 1e-2),
              torch.float16: (1e-3, 1e-3)}  # (rtol, atol); every other dtype must match exactly

# Ops whose test fails through a bug outside the lowerings (renderer, kernel IR, fusion): op -> the exact error.
# None now: the bugs the samples found outside the lowerings have their own strict xfails below.
KNOWN_BUGS: dict[str, str] = {}


def op_params():
    for op in LOWERED:
        marks = [pytest.mark.xfail(strict=True, reason=KNOWN_BUGS[op])] if op in KNOWN_BUGS else []
        yield pytest.param(op, id=op, marks=marks)


def test_every_lowered_op_has_a_sample() -> None:
    missing = [op for op in LOWERED if op not in SAMPLES]
    assert not missing, f"lowered ops without a sample in tests/op_samples.py: {missing}"
    stale = sorted(set(SAMPLES) - set(LOWERED))
    assert not stale, f"tests/op_samples.py has samples for ops the op table does not lower: {stale}"


@pytest.mark.parametrize("op", op_params())
def test_op_runs_in_a_generated_kernel_and_matches_torchscript(op: str, tmp_path) -> None:
    assert op in SAMPLES, f"{op} has a lowering but no sample: add one to tests/op_samples.py"
    for i, sample in enumerate(SAMPLES[op]):
        check_sample(op, sample, tmp_path / f"sample{i}.j2t", FRESH_SEED + i)


def check_sample(op: str, sample: Sample, path: Path, fresh_seed: int) -> None:
    torch.manual_seed(EXAMPLE_SEED)
    example = sample.make_inputs()
    model = sample.build(example)
    jit2triton.convert(model, example_inputs=example, device="cpu", backend="cpp").save(path)
    loaded = jit2triton.load(path)
    assert_ran_in_a_kernel(op, loaded)
    torch.manual_seed(fresh_seed)
    fresh = sample.make_inputs()
    assert not all(torch.equal(a, b) for a, b in zip(fresh, example)), "fresh inputs repeat the example"
    expected = model(*fresh)
    assert_same(loaded(*fresh), expected, f"{op} {path.stem}")
    assert_same(loaded(*permuted(fresh)), expected, f"{op} {path.stem}, inputs permuted")


# Bugs outside the lowerings that the samples ran into, kept as tests.

def test_max_and_min_of_narrow_integers_and_bools(tmp_path) -> None:
    check_sample("aten::amax", NARROW_INTEGER_MAX_MIN, tmp_path / "narrow.j2t", FRESH_SEED)


def test_a_source_line_continued_with_a_backslash(tmp_path) -> None:
    check_sample("aten::relu", BACKSLASH_CONTINUED_SOURCE, tmp_path / "continued.j2t", FRESH_SEED)


def assert_ran_in_a_kernel(op: str, loaded: jit2triton.Converted) -> None:
    summary = loaded.summary()
    assert op not in summary["fallback_ops"], (
        f"{op} ran through ATen ({summary['fallback_reasons'][op]}):\n{loaded.report()}")
    assert op in {o for kernel in summary["kernels"] for o in kernel["ops"]}, (
        f"{op} is in no generated kernel (does the sample call this overload?):\n{loaded.report()}")


def permuted(call: tuple) -> tuple:
    """The same values, with every matrix-like input as a non-contiguous (transposed-storage) view."""
    views = tuple(x.mT.contiguous().mT if isinstance(x, torch.Tensor) and x.dim() >= 2 and min(x.shape[-2:]) > 1
                  else x for x in call)
    assert any(isinstance(x, torch.Tensor) and not x.is_contiguous() for x in views), "no input to permute"
    return views


def assert_same(actual: Any, expected: Any, where: str) -> None:
    assert type(actual) is type(expected), f"{where}: got {type(actual).__name__}, expected {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype}, expected {expected.dtype}"
        assert actual.shape == expected.shape, f"{where}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        rtol, atol = TOLERANCES.get(expected.dtype, (0.0, 0.0))
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol, equal_nan=True,
                                   msg=lambda message: f"{where}: {message}")
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), f"{where}: {len(actual)} outputs, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same(a, e, f"{where} output {i}")
    else:
        assert actual == expected, f"{where}: {actual!r}, expected {expected!r}"


def test_integer_division_by_zero_raises_instead_of_crashing(tmp_path) -> None:
    scripted = torch.jit.script(_floor_divide)
    a, b = torch.tensor([7, 8, -9]), torch.tensor([2, 3, 4])
    module = jit2triton.convert(scripted, example_inputs=(a, b), backend="cpp")
    assert module.summary()["kernels"]
    torch.testing.assert_close(module(a, b), scripted(a, b))
    with pytest.raises(jit2triton.Jit2TritonError, match="ZeroDivisionError: integer division by zero"):
        module(a, torch.tensor([2, 0, 4]))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        scripted(a, torch.tensor([2, 0, 4]))  # TorchScript refuses it too


def _floor_divide(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.floor_divide(a, b)
