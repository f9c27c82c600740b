"""One test per op the op table lowers, generated from the table itself: a new lowering cannot land untested.

Each op's samples (`op_samples.py`) are converted with the C++ backend, saved and loaded; the op must have run in a
generated kernel (a lowering that silently falls back to ATen fails here), and the package must give TorchScript's
outputs on fresh random inputs, passed both contiguous and as permuted views, within tolerances that fit each
output's dtype (integer and bool outputs exactly).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import jit2triton

from helpers import EXAMPLE_SEED, FRESH_SEED, LOWERED, assert_ran_in_a_kernel, assert_same_op_output, permuted
from op_samples import BACKSLASH_CONTINUED_SOURCE, NARROW_INTEGER_MAX_MIN, SAMPLES, Sample

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
    assert_same_op_output(loaded(*fresh), expected, f"{op} {path.stem}")
    assert_same_op_output(loaded(*permuted(fresh)), expected, f"{op} {path.stem}, inputs permuted")


# Bugs outside the lowerings that the samples ran into, kept as tests.

def test_max_and_min_of_narrow_integers_and_bools(tmp_path) -> None:
    check_sample("aten::amax", NARROW_INTEGER_MAX_MIN, tmp_path / "narrow.j2t", FRESH_SEED)


def test_a_source_line_continued_with_a_backslash(tmp_path) -> None:
    check_sample("aten::relu", BACKSLASH_CONTINUED_SOURCE, tmp_path / "continued.j2t", FRESH_SEED)


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
