"""Conversion never dies: a draw conversion invents that crashes TorchScript natively is skipped in a child process
and named in the report (the converting process lives on, and the package is right); a crash on the example is a
ConversionError; invented integer inputs stay where the model accepts them (indices, offsets, lengths, or the
user's input_ranges); and a conversion that runs past its time budget stops, naming the stage."""
from __future__ import annotations

import time

import pytest
import torch

import crashing_ops
import jit2triton
from jit2triton import ConversionError, Dim

from helpers import assert_same


class Fragile(torch.nn.Module):
    """Runs on values within crashing_ops.CRASH_ABOVE; a native crash past it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.ops.j2t_tests.segfault_above(x)) + torch.ops.j2t_tests.abort_above(x)


def _example() -> torch.Tensor:
    return torch.rand(16, 16, generator=torch.Generator().manual_seed(0))  # in [0, 1): below the crash


def test_a_draw_that_crashes_torchscript_is_skipped_and_named(tmp_path):
    scripted = torch.jit.script(Fragile())
    converted = jit2triton.convert(scripted, (_example(),))
    verification = converted.summary()["verification"]
    crashed = [n for n in verification["notes"] if "crashed TorchScript itself" in n]
    assert any(n.startswith("fresh random inputs crashed TorchScript itself: signal 11 (SIGSEGV)") for n in crashed), \
        verification["notes"]
    assert "crashing_ops.py" in crashed[0]  # the last Python frame faulthandler saw
    assert verification["status"] == "passed" and verification["input_sets"] == 1  # the example still compared
    assert "crashed TorchScript itself" in converted.report()
    converted.save(tmp_path / "fragile.j2t")
    loaded = jit2triton.load(tmp_path / "fragile.j2t")
    x = torch.rand(16, 16) * 2 - 1  # other values it runs on
    assert_same(loaded(x), scripted(x))


def test_a_crash_on_the_example_is_a_conversion_error():
    example = _example() + crashing_ops.CRASH_ABOVE
    with pytest.raises(ConversionError, match=r"TorchScript crashed on the example inputs: signal 11 \(SIGSEGV\)"):
        jit2triton.convert(torch.jit.script(Fragile()), (example,))
    assert jit2triton.convert(torch.jit.script(Fragile()), (_example(),), backend="aten").summary()  # still alive


class Batches(torch.nn.Module):
    """Asserts that its lengths, offsets and indices are valid, as a model that would crash on invalid ones would
    need to: x (batch, time, 8), lengths (batch,) of time, ids (n,) into a bag table, offsets (batch,) into ids,
    idx (k,) positions along time."""

    def __init__(self) -> None:
        super().__init__()
        self.bag = torch.nn.EmbeddingBag(50, 8, mode="sum")

    def forward(self, x, lengths, ids, offsets, idx):
        torch._assert(bool((lengths >= 1).all()) and int(lengths.max()) <= x.size(1), "lengths past the time axis")
        torch._assert(int(offsets[0]) == 0 and bool((offsets[1:] >= offsets[:-1]).all())
                      and int(offsets[-1]) <= ids.numel(), "offsets out of order")
        torch._assert(int(idx.min()) >= 0 and int(idx.max()) < x.size(1), "idx past the time axis")
        mask = (torch.arange(x.size(1)).unsqueeze(0) < lengths.unsqueeze(1)).to(x.dtype)
        pooled = (x * mask.unsqueeze(2)).sum(1) / lengths.unsqueeze(1).to(x.dtype)
        return pooled + self.bag(ids, offsets) + x.index_select(1, idx).mean(1)


def _batches_example():
    x = torch.randn(3, 6, 8)
    return (x, torch.tensor([6, 2, 4]), torch.tensor([3, 7, 41, 0, 9, 12, 5]), torch.tensor([0, 2, 5]),
            torch.tensor([0, 5, 3, 1]))


def test_lengths_offsets_and_indices_are_drawn_where_the_model_accepts_them():
    batch, time_, n = Dim("batch", min=1, max=8), Dim("time", min=2, max=16), Dim("n", min=1, max=32)
    converted = jit2triton.convert(
        torch.jit.script(Batches()), _batches_example(), backend="aten",
        dynamic_shapes={"x": {0: batch, 1: time_}, "lengths": {0: batch}, "ids": {0: n}, "offsets": {0: batch}})
    verification = converted.summary()["verification"]
    assert not [n for n in verification["notes"] if "raised" in n or "crashed" in n], verification["notes"]
    assert verification["input_sets"] == 5  # the example, a fresh draw, each range's ends together, another size
    draws = verification["draws"]
    assert draws["lengths"].startswith("lengths of x's axis 1") and draws["offsets"].startswith("offsets into ids")
    assert draws["ids"] == "indices into embedding_bag's table of 50 rows: 0..49"
    assert draws["idx"].startswith("indices into index_select's dim 1 of x") and draws["x"] == "normal(0, 1)"


class Padded(torch.nn.Module):
    """lengths measure the time axis; the example's do not reach it, so the graph cannot tell."""

    def forward(self, x, lengths):
        torch._assert(int(lengths.max()) <= x.size(1), "lengths past the time axis")
        mask = (torch.arange(x.size(1)).unsqueeze(0) < lengths.unsqueeze(1)).to(x.dtype)
        return (x * mask).sum(1)


def test_input_ranges_say_what_the_graph_cannot():
    example = (torch.randn(2, 10), torch.tensor([7, 9]))
    shapes = {"x": {1: Dim("T", min=2, max=12)}}
    with pytest.raises(ConversionError, match="lengths past the time axis"):  # T=2 with the example's lengths
        jit2triton.convert(torch.jit.script(Padded()), example, backend="aten", dynamic_shapes=shapes)
    converted = jit2triton.convert(torch.jit.script(Padded()), example, backend="aten", dynamic_shapes=shapes,
                                   input_ranges={"lengths": (1, "T")})
    verification = converted.summary()["verification"]
    assert verification["draws"]["lengths"] == "1..T (input_ranges)"
    assert not [n for n in verification["notes"] if "raised" in n], verification["notes"]
    with pytest.raises(ConversionError, match="'S' is neither a number nor a declared Dim"):
        jit2triton.convert(torch.jit.script(Padded()), example, backend="aten", input_ranges={"lengths": (1, "S")})


def test_verify_inputs_adds_input_sets():
    example = (torch.randn(2, 10), torch.tensor([7, 9]))
    plain = jit2triton.convert(torch.jit.script(Padded()), example, backend="aten")
    extra = jit2triton.convert(torch.jit.script(Padded()), example, backend="aten",
                               verify_inputs=lambda: [(torch.randn(2, 10), torch.tensor([1, 10]))])
    assert extra.summary()["verification"]["input_sets"] == plain.summary()["verification"]["input_sets"] + 1


@torch.jit.script
def _spin(x: torch.Tensor, n: int) -> torch.Tensor:
    for _ in range(n):
        x = torch.sin(x)
    return x


class Slow(torch.nn.Module):
    """Runs for hours on its example: a hundred million steps."""

    def forward(self, x):
        return _spin(x, 100_000_000)


@pytest.mark.parametrize("verify, stage", [(True, "reference"), (False, "observe")])
def test_a_conversion_past_its_budget_stops_naming_the_stage(verify, stage):
    started = time.monotonic()
    with pytest.raises(ConversionError, match=f"ran past its time budget of 3 s in stage {stage}"):
        jit2triton.convert(torch.jit.script(Slow()), (torch.randn(4),), backend="aten", verify=verify, timeout=3)
    assert time.monotonic() - started < 30


def test_the_command_line_takes_a_timeout_and_input_sets(tmp_path):
    from click.testing import CliRunner
    from jit2triton.cli import main

    torch.jit.script(Slow()).save(str(tmp_path / "slow.pt"))
    slow = CliRunner().invoke(main, ["convert", str(tmp_path / "slow.pt"), "--input", "4", "--backend", "aten",
                                     "--timeout", "3"])
    assert slow.exit_code != 0 and "time budget of 3 s in stage reference" in slow.output, slow.output
    torch.jit.script(Padded()).save(str(tmp_path / "padded.pt"))
    torch.save([(torch.randn(2, 10), torch.tensor([1, 10]))], tmp_path / "sets.pt")
    args = ["convert", str(tmp_path / "padded.pt"), "--input", "2x10", "--input", "2:int64:1-10", "--backend", "aten"]
    plain = CliRunner().invoke(main, args + ["-o", str(tmp_path / "a.j2t")])
    extra = CliRunner().invoke(main, args + ["-o", str(tmp_path / "b.j2t"),
                                             "--verify-inputs", str(tmp_path / "sets.pt")])
    assert plain.exit_code == 0 and extra.exit_code == 0, plain.output + extra.output
    counts = [jit2triton.load(tmp_path / f"{n}.j2t").summary()["verification"]["input_sets"]
              for n in "ab"]
    assert counts[1] == counts[0] + 1


class _Adds(torch.nn.Module):
    def forward(self, x):
        return x + 1


class _Refuses(torch.nn.Module):
    def forward(self, x):
        if bool(x.sum() > -1e30):
            raise RuntimeError("refuses every input")
        return x


def test_the_child_probes_the_model_it_is_given_when_another_took_its_memory():
    """A model's bytes freed and another's allocated at the same address (so with the same id()) must not leave the
    child probing the first model: CI's run of the budget test above ran a model for minutes in this process because
    the child had answered for a model freed before it."""
    from jit2triton import reference_child
    runs, refuses = torch.jit.script(_Adds()).save_to_buffer(), torch.jit.script(_Refuses()).save_to_buffer()
    size = max(len(runs), len(refuses))  # the same size, so that malloc hands the freed block to the next model
    runs, refuses = runs.ljust(size, b"\0"), refuses.ljust(size, b"\0")  # (a zip reader skips what follows it)
    child, calls = reference_child._Child(), [[torch.ones(3)]]
    try:
        for _ in range(3):
            first = bytes(memoryview(runs))
            assert child.run((first, "forward", []), calls, 60)[0] == "ran"
            del first
            second = bytes(memoryview(refuses))
            assert child.run((second, "forward", []), calls, 60)[0] == "raised"
            del second
    finally:
        child.close()
