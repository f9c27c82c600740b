"""Every model of the zoo, end to end: TorchScript -> convert -> save -> load -> run on fresh inputs.

The loaded package must give TorchScript's outputs on inputs it has never seen (not the example inputs that drove
conversion), with the same structure, dtypes and shapes, and must leave its inputs untouched.
"""
from __future__ import annotations

import os
from collections import Counter

import pytest
import torch

import jit2triton

from helpers import EXAMPLE_SEED, assert_same_outputs, build, copied, fresh_calls
from models import MODELS, ModelSpec, loop_branch_calls

# Models that fail through a gap or bug in jit2triton, not in the test: name -> (what it raises, the message).
KNOWN_FAILURES: dict[str, tuple[type[Exception], str]] = {}


def model_params():
    for spec in MODELS:
        marks = []
        if spec.name in KNOWN_FAILURES:
            raises, message = KNOWN_FAILURES[spec.name]
            marks.append(pytest.mark.xfail(strict=True, raises=raises, reason=f"{raises.__name__}: {message}"))
        yield pytest.param(spec, id=spec.name, marks=marks)


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


def plan_steps(steps):
    """Every step of a manifest plan, those inside if/loop blocks and graph regions included."""
    for step in steps:
        yield step
        for block in step.get("blocks", ()):
            yield from plan_steps(block["steps"])
        yield from plan_steps(step.get("steps", ()))


@pytest.mark.parametrize("spec", model_params())
def test_summary_agrees_with_the_plan_that_runs(spec: ModelSpec, tmp_path) -> None:
    """The summary is counted from the conversion's node table; the plan is what the package runs. They must tell
    the same story: each op the summary says falls back runs as an ATen call step, each kernel it lists is
    launched by a kernel step (and the plan launches no other), and the package holds exactly those kernels."""
    source, _, example = build(spec, tmp_path)
    # fixed choices: which ops a timed choice hands to oneDNN (a conv with its ReLU as a post-op) depends on the
    # machine's timing, and what is counted below must not
    converted = jit2triton.convert(source, example_inputs=example, device="cpu", choices="fixed")
    summary, manifest = converted.summary(), converted.manifest
    steps = list(plan_steps(manifest["plan"]["steps"]))
    assert {s["kind"] for s in steps} <= {"call", "kernel", "if", "loop", "graph"}, steps
    calls = Counter(s["op"] for s in steps if s["kind"] == "call")
    for op, count in summary["fallback_ops"].items():
        assert calls[op] >= count, f"{op}: {count} fallback node(s) in the summary, {calls[op]} call step(s) in the plan"
    assert set(summary["fallback_reasons"]) == set(summary["fallback_ops"]), summary
    launched = {s["kernel"] for s in steps if s["kind"] == "kernel"}
    listed = [k["name"] for k in summary["kernels"]]
    assert len(listed) == len(set(listed)), f"a kernel is listed twice: {listed}"
    assert set(listed) == launched, f"summary lists {sorted(listed)}, the plan launches {sorted(launched)}"
    assert len(summary["kernels"]) == len(launched)
    assert {k["name"] for k in manifest["kernels"]} == launched, converted.report()
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


class Joined(torch.nn.Module):
    def __init__(self, inputs: int) -> None:
        super().__init__()
        self.inputs = inputs

    def forward(self, x):
        return torch.relu(torch.cat([x * (k + 1) if k % 2 else x for k in range(self.inputs)], 1))


@pytest.mark.parametrize("backend", ["cpp", "triton"])
def test_a_join_of_many_tensors_runs_as_atens_cat_and_its_reader_fuses_over_one_buffer(backend) -> None:
    """A fused cat loads every input at every element and its code grows with the inputs (DenseNet's cats of
    every earlier feature map made C++ that grew with the square of the depth): past MAX_FUSED_INPUTS it is
    ATen's cat, counted extern, and the relu reading it is a kernel of its own."""
    from jit2triton.transpiler.lower_cat import MAX_FUSED_INPUTS
    torch.manual_seed(EXAMPLE_SEED)
    example = (torch.randn(2, 3, 4),)
    for inputs, fused in ((MAX_FUSED_INPUTS, True), (MAX_FUSED_INPUTS + 1, False)):
        traced = torch.jit.trace(Joined(inputs), example)
        converted = _convert(traced, example, backend)
        summary = converted.summary()
        assert summary["fallback_nodes"] == 0, converted.report()
        assert summary["extern_nodes"] == (0 if fused else 1), converted.report()
        assert any("aten::cat" in k["ops"] for k in summary["kernels"]) == fused, converted.report()
        fresh = (torch.randn(2, 3, 4),)
        torch.testing.assert_close(converted(*fresh), traced(*fresh))


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
    # the result's size follows n, which conversion runs at other values too: the cat, through ATen, makes a size
    # no polynomial explains, which the runtime reads from its output, and the add after it is a kernel over it
    assert summary["fallback_ops"] == {"aten::cat": 1}, converted.report()
    assert "reads a count from its output" in summary["fallback_reasons"]["aten::cat"]
    assert ["aten::add.Scalar"] in [k["ops"] for k in summary["kernels"]], summary["kernels"]
    for n in (2, 4, 0):
        call = (torch.randn(3, 4), torch.randn(3, 4), n)
        torch.testing.assert_close(converted(*call), grown(*call))


def test_the_scripted_loop_keeps_stack_on_aten_because_its_length_is_the_loop_count(tmp_path) -> None:
    spec = next(s for s in MODELS if s.name == "scripted_loop_branch")
    source, _, example = build(spec, tmp_path)
    converted = jit2triton.convert(source, example_inputs=example, device="cpu")
    summary = converted.summary()
    assert "aten::stack" in summary["fallback_ops"], summary  # (its size follows the loop count, an input)
    for calls in loop_branch_calls():
        torch.testing.assert_close(converted(*calls), source(*calls))


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
