"""Dim ranges the model cannot serve are found at convert time: refused with an error naming the dim, the furthest
size that ran and the failing statement, or with narrow_dims narrowed to what ran; never a package that fails at
call time inside its declared range."""
from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner

import jit2triton
from jit2triton import ConversionError, Dim, InputError
from jit2triton.cli import main
from jit2triton.dim_ranges import failure_text

from helpers import FRESH_SEED, assert_same

POSITIONS = 24


class Positions(torch.nn.Module):
    """A learned position table of 24 rows, sliced to the sequence's length: longer sequences cannot run."""

    def __init__(self) -> None:
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(1, POSITIONS, 8))
        self.mix = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.mix(x + self.table[:, : x.shape[1]]).relu()


def traced() -> torch.jit.ScriptModule:
    return torch.jit.trace(Positions().eval(), torch.randn(2, 10, 8))


def test_a_range_past_what_the_model_runs_is_refused_naming_the_dim_the_largest_size_and_the_op():
    with pytest.raises(ConversionError) as caught:
        jit2triton.convert(traced(), (torch.randn(2, 10, 8),), dynamic_shapes={"x": {1: Dim("seq", 2, 40)}})
    message = str(caught.value)
    assert "Dim seq" in message and "seq=40" in message
    assert f"largest seq that ran is {POSITIONS}" in message and f"max={POSITIONS}" in message
    assert "self.table[:, : x.shape[1]]" in message and "must match" in message  # the statement, and why
    assert "\n" not in message


def test_narrow_dims_narrows_the_range_to_what_ran_and_says_so():
    reference = traced()
    converted = jit2triton.convert(reference, (torch.randn(2, 10, 8),), narrow_dims=True,
                                   dynamic_shapes={"x": {0: Dim("batch", 1, 4), 1: Dim("seq", 2, 40)}})
    signature = converted._contents.manifest["signature"]["dims"]
    assert signature["seq"]["max"] == POSITIONS and signature["batch"]["max"] == 4
    notes = converted._contents.manifest["report"]["verification"]["notes"]
    assert any("seq's max narrowed from 40 to 24" in note for note in notes)
    generator = torch.Generator().manual_seed(FRESH_SEED)
    for batch, seq in [(1, 2), (3, 17), (4, POSITIONS)]:
        x = torch.randn(batch, seq, 8, generator=generator)
        assert_same(converted(x), reference(x))
    with pytest.raises(InputError, match="seq"):
        converted(torch.randn(2, POSITIONS + 1, 8))


class NeedsPairs(torch.nn.Module):
    """Splits the batch into pairs: a batch of 1 cannot run, so a range from 1 is refused at its low end."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        pairs = x.view(x.shape[0] // 2, 2, x.shape[1])
        return (pairs[:, 0] * pairs[:, 1]).sum(-1)


def test_a_range_below_what_the_model_runs_is_refused_at_its_low_end():
    model = torch.jit.trace(NeedsPairs(), torch.randn(4, 6))
    with pytest.raises(ConversionError, match="does not run at batch=1.*smallest batch that ran is 2"):
        jit2triton.convert(model, (torch.randn(4, 6),), dynamic_shapes=[{0: Dim("batch", 1, 8)}])


def test_a_range_the_model_serves_converts_unchanged():
    converted = jit2triton.convert(traced(), (torch.randn(2, 10, 8),), dynamic_shapes={"x": {1: Dim("seq", 2, 24)}})
    assert converted._contents.manifest["signature"]["dims"]["seq"]["max"] == POSITIONS
    notes = converted._contents.manifest["report"]["verification"]["notes"]
    assert not any("narrowed" in note for note in notes)


def test_the_cli_refuses_in_one_line_and_narrows_with_narrow_dims(tmp_path):
    path, reference = str(tmp_path / "positions.pt"), traced()
    reference.save(path)
    args = ["convert", path, "--input", "2xSx8", "--dim", "S=2:40:10", "-o", str(tmp_path / "p.j2t")]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "Dim S" in refused.output and "Traceback" not in refused.output
    narrowed = CliRunner().invoke(main, args + ["--narrow-dims"])
    assert narrowed.exit_code == 0, narrowed.output
    loaded = jit2triton.load(str(tmp_path / "p.j2t"))
    x = torch.randn(2, POSITIONS, 8)
    assert_same(loaded(x), reference(x))


def test_failure_text_points_at_the_statement_of_a_torchscript_error():
    try:
        traced()(torch.randn(1, 30, 8))
    except Exception as err:  # noqa: BLE001
        text = failure_text(err)
    assert text.startswith("`") and "line" in text and "RuntimeError" in text and "\n" not in text
    assert failure_text(ValueError("plain")) == "ValueError: plain"
