"""Every model of the zoo, end to end: TorchScript -> convert -> save -> load -> run on fresh inputs.

The loaded package must give TorchScript's outputs on inputs it has never seen (not the example inputs that drove
conversion), with the same structure, dtypes and shapes, and must leave its inputs untouched.
"""
from __future__ import annotations

import os
from typing import Any

import pytest
import torch

import jit2triton

from models import MODELS, ModelSpec

EXAMPLE_SEED = 0
FRESH_SEED = 1234

# Models that fail through a gap or bug in jit2triton, not in the test: name -> (what it raises, the message).
KNOWN_FAILURES: dict[str, tuple[type[Exception], str]] = {}


def model_params():
    for spec in MODELS:
        marks = []
        if spec.name in KNOWN_FAILURES:
            raises, message = KNOWN_FAILURES[spec.name]
            marks.append(pytest.mark.xfail(strict=True, raises=raises, reason=f"{raises.__name__}: {message}"))
        yield pytest.param(spec, id=spec.name, marks=marks)


def build(spec: ModelSpec, tmp_path) -> tuple[Any, Any, tuple]:
    """-> (what to convert, the TorchScript reference to compare against, the example inputs)."""
    torch.manual_seed(EXAMPLE_SEED)
    model, example = spec.build()
    if not spec.from_file:
        return model, model, example
    path = tmp_path / f"{spec.name}.pt"
    torch.jit.save(model, str(path))
    return path, torch.jit.load(str(path)), example


def fresh_calls(spec: ModelSpec, example: tuple) -> list[tuple]:
    torch.manual_seed(FRESH_SEED)
    calls = spec.fresh_inputs()
    example_tensors = [x for x in example if isinstance(x, torch.Tensor)]
    for call in calls:
        tensors = [x for x in call if isinstance(x, torch.Tensor)]
        assert not all(torch.equal(a, b) for a, b in zip(tensors, example_tensors)), "fresh inputs repeat the example"
    return calls


def copied(call: tuple) -> tuple:
    return tuple(x.clone() if isinstance(x, torch.Tensor) else x for x in call)


def assert_same_outputs(actual: Any, expected: Any, spec: ModelSpec, where: str = "output") -> None:
    assert type(actual) is type(expected), f"{where}: got {type(actual).__name__}, expected {type(expected).__name__}"
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype, f"{where}: dtype {actual.dtype}, expected {expected.dtype}"
        assert actual.shape == expected.shape, f"{where}: shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        exact = not (expected.is_floating_point() or expected.is_complex())
        torch.testing.assert_close(actual, expected, rtol=0 if exact else spec.rtol, atol=0 if exact else spec.atol,
                                   msg=lambda m: f"{spec.name} {where}: {m}")
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected), f"{where}: {len(actual)} items, expected {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_same_outputs(a, e, spec, f"{where}[{i}]")
    elif isinstance(expected, dict):
        assert list(actual) == list(expected), f"{where}: keys {list(actual)}, expected {list(expected)}"
        for key in expected:
            assert_same_outputs(actual[key], expected[key], spec, f"{where}[{key!r}]")
    else:
        assert actual == expected, f"{where}: {actual!r}, expected {expected!r}"


@pytest.mark.parametrize("spec", model_params())
def test_loaded_package_matches_torchscript_on_fresh_inputs(spec: ModelSpec, tmp_path) -> None:
    source, reference, example = build(spec, tmp_path)
    package = tmp_path / f"{spec.name}.j2t"
    jit2triton.convert(source, example_inputs=example, device="cpu").save(package)
    loaded = jit2triton.load(package)
    for call in fresh_calls(spec, example):
        expected = reference(*copied(call))
        pristine = copied(call)
        actual = loaded(*call)
        assert_same_outputs(actual, expected, spec)
        for i, (after, before) in enumerate(zip(call, pristine)):
            if isinstance(before, torch.Tensor):
                assert torch.equal(after, before), f"the package modified input {i} in place"


@pytest.mark.parametrize("spec", model_params())
def test_summary_counts_add_up(spec: ModelSpec, tmp_path) -> None:
    source, _, example = build(spec, tmp_path)
    summary = jit2triton.convert(source, example_inputs=example, device="cpu").summary()
    placed = (summary["native_nodes"] + summary["extern_nodes"] + summary["host_nodes"] + summary["alias_nodes"]
              + summary["fallback_nodes"])
    assert placed == summary["nodes"], summary
    assert summary["fallback_nodes"] == sum(summary["fallback_ops"].values()), summary
    # every zoo model has pointwise ops: the C++ backend (the CPU default) runs them in generated kernels
    assert (summary["native_nodes"] > 0 and bool(summary["kernels"])) == spec.generates_kernels, summary
    assert sum(k["nodes"] for k in summary["kernels"]) >= summary["native_nodes"], summary


# --- joining tensors: cat and stack fuse as indexing; a list that may change stays with ATen -------------------


def _convert(source, example, backend: str):
    if backend == "triton":
        pytest.importorskip("triton")
        from jit2triton.emitters.compile_triton import interpreter_active
        if not interpreter_active():
            pytest.skip("Triton kernels run on the CPU only under its interpreter: start Python with TRITON_INTERPRET=1")
    return jit2triton.convert(source, example_inputs=example, device="cpu", backend=backend)


@pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # numpy, on masked-off interpreter lanes
@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_cat_and_stack_fuse_with_their_pointwise_consumers_into_one_kernel(backend, tmp_path) -> None:
    spec = next(s for s in MODELS if s.name == "cat_stack_pointwise")
    source, reference, example = build(spec, tmp_path)
    converted = _convert(source, example, backend)
    summary = converted.summary()
    assert summary["fallback_nodes"] == 0 and summary["host_nodes"] == 0, converted.report()
    assert len(summary["kernels"]) == 1, converted.report()
    assert {"aten::cat", "aten::stack", "aten::relu", "aten::sigmoid"} <= set(summary["kernels"][0]["ops"])
    for call in fresh_calls(spec, example):
        assert_same_outputs(converted(*call), reference(*copied(call)), spec)


def returned_list(x, y):
    parts = [torch.sin(x), y]
    return torch.cat(parts, 0) + 1, parts


def appended_list(x, y, n: int):
    parts = [x]
    for _ in range(n):
        parts.append(y)
    return torch.cat(parts, 0) + 1


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_cat_reads_the_items_of_a_list_that_must_stay_and_not_of_one_that_changes(backend) -> None:
    torch.manual_seed(EXAMPLE_SEED)
    kept = torch.jit.script(returned_list)
    example = (torch.randn(3, 4), torch.randn(2, 4))
    converted = _convert(kept, example, backend)
    summary = converted.summary()
    assert summary["fallback_nodes"] == 0, converted.report()
    assert [k["ops"][-2:] for k in summary["kernels"]] == [["aten::sin"], ["aten::cat", "aten::add.Scalar"]]
    fresh = (torch.randn(3, 4), torch.randn(2, 4))
    torch.testing.assert_close(converted(*fresh), kept(*fresh))

    grown = torch.jit.script(appended_list)
    converted = _convert(grown, example[:1] + (torch.randn(3, 4), 2), backend)
    summary = converted.summary()
    assert summary["fallback_ops"] == {"aten::cat": 1}, converted.report()
    assert "is appended to" in summary["fallback_reasons"]["aten::cat"]
    call = (torch.randn(3, 4), torch.randn(3, 4), 2)  # the result's shape follows n: the example's n
    torch.testing.assert_close(converted(*call), grown(*call))


def test_the_scripted_loop_keeps_stack_on_aten_because_its_list_grows_in_the_loop(tmp_path) -> None:
    spec = next(s for s in MODELS if s.name == "scripted_loop_branch")
    source, _, example = build(spec, tmp_path)
    summary = jit2triton.convert(source, example_inputs=example, device="cpu").summary()
    assert summary["fallback_ops"] == {"aten::stack": 1}, summary
    assert "is appended to" in summary["fallback_reasons"]["aten::stack"]


def test_a_branch_the_example_inputs_did_not_take_still_fuses() -> None:
    @torch.jit.script
    def branchy(x):
        if bool(x.sum() > 0):
            return torch.sin(x) * 2.0
        return torch.sigmoid(x) - x.abs()

    example = torch.rand(4, 8) + 0.5  # positive: only the first branch runs while converting
    converted = jit2triton.convert(branchy, example_inputs=(example,))
    assert converted.summary()["fallback_nodes"] == 0, converted.summary()["fallback_reasons"]
    for x in (-(torch.rand(4, 8) + 0.5), torch.rand(4, 8) + 0.5):
        torch.testing.assert_close(converted(x), branchy(x))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_runtime_scalars_reach_kernels_and_promote_as_python_scalars(backend) -> None:
    if backend == "triton" and not os.environ.get("TRITON_INTERPRET"):
        pytest.skip("the Triton backend runs on the CPU only under TRITON_INTERPRET=1")

    @torch.jit.script
    def scaled(x, ids, s: float, k: int):
        return torch.sin(x) * s + k, ids * k + ids * s, x.sum() * s

    example = (torch.randn(3, 5), torch.randint(-9, 9, (3, 5)), 0.5, 2)
    converted = jit2triton.convert(scaled, example_inputs=example, backend=backend)
    assert converted.summary()["fallback_nodes"] == 0, converted.summary()["fallback_reasons"]
    for s, k in ((2.5, -3), (-0.125, 7)):
        call = (torch.randn(3, 5), torch.randint(-9, 9, (3, 5)), s, k)
        for got, want in zip(converted(*call), scaled(*call)):
            assert got.dtype == want.dtype  # float32 stays float32, int64 * float is float32, as in eager
            torch.testing.assert_close(got, want)
