"""A complex64 tensor's magnitude runs in a generated kernel over its float view (transpiler/complex_magnitude.py):
ATen's complex abs took over half of a Spectrogram's call. Checked against TorchScript on fresh inputs (an STFT's
bins, and values near float32's range ends where a float32 re**2 would overflow or underflow), with the pieces in
one kernel fused with what reads the magnitude, and undone where a piece does not lower or verification takes its
kernel out."""
from __future__ import annotations

from collections import Counter

import pytest
import torch


from helpers import BACKENDS, assert_matches_torchscript, break_lowering, convert_for

PIECES = {"aten::view_as_real", "aten::select.int", "aten::sqrt", "aten::mul.Tensor", "aten::add.Tensor"}


class Power(torch.nn.Module):
    """torchaudio's Spectrogram: |STFT| ** 2."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("window", torch.hann_window(64))

    def forward(self, wave):
        spec = torch.stft(wave, 64, 16, window=self.window, center=True, return_complex=True)
        return spec.abs().pow(2.0)


class Magnitude(torch.nn.Module):
    def forward(self, re, im):
        return torch.complex(re, im).abs() + 1


def _wave():
    return (torch.randn(3, 800),)


def _extremes():
    """Parts near float32's ends (re**2 past its range either way, in float32) and ordinary ones, with zeros."""
    scale = torch.tensor([1e-30, 1e-20, 1.0, 1e20, 3e38]).repeat_interleave(8)
    re, im = torch.randn(40) * scale, torch.randn(40) * scale
    re[::7] = 0
    return re, im


def _aten_steps(converted) -> Counter:
    return Counter(e["op"] for e in converted.manifest["nodes"] if e["category"] != "kernel")


def _kernel_ops(converted) -> list[str]:
    return [f["op"] for e in converted.manifest["nodes"] if e["category"] == "kernel" for f in e["fused"]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_magnitude_runs_in_the_kernel_that_reads_it(backend) -> None:
    model = torch.jit.script(Power())
    converted = convert_for(model, _wave(), backend)
    assert "aten::abs" not in _aten_steps(converted), _aten_steps(converted)
    assert {"aten::sqrt", "aten::pow.Tensor_Scalar"} <= set(_kernel_ops(converted)), _kernel_ops(converted)
    assert_matches_torchscript(converted, model, _wave, calls=3)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_magnitude_near_float32s_range_ends_matches_torchscript(backend) -> None:
    model = torch.jit.script(Magnitude())
    converted = convert_for(model, _extremes(), backend)
    assert "aten::abs" not in _aten_steps(converted)
    assert_matches_torchscript(converted, model, _extremes, calls=3)
    re, im = _extremes()
    overflows, underflows = re.abs() > 2e19, (re.abs() < 1e-19) & (re != 0)  # (re**2 in float32: inf, 0)
    assert overflows.any() and underflows.any()
    got, expected = converted(re.to(converted.device), im.to(converted.device)).cpu(), model(re, im)
    assert torch.isfinite(got[overflows & torch.isfinite(expected)]).all()


def test_a_complex128_magnitude_stays_with_aten() -> None:
    model = torch.jit.script(Magnitude())
    example = tuple(x.double() for x in _extremes())
    converted = convert_for(model, example, "cpp")
    assert _aten_steps(converted)["aten::abs"] == 1
    assert_matches_torchscript(converted, model, lambda: tuple(x.double() for x in _extremes()))


@pytest.mark.parametrize("how", ["raise", "wrong"])
def test_a_magnitude_whose_piece_fails_runs_as_atens_abs(how, monkeypatch) -> None:
    break_lowering(monkeypatch, "aten::sqrt", how)  # (a negated root: Power's square would hide it, Magnitude's + 1 does not)
    model = torch.jit.script(Magnitude())
    draw = lambda: (torch.randn(6, 5), torch.randn(6, 5))  # noqa: E731
    converted = convert_for(model, draw(), "cpp")
    steps = _aten_steps(converted)
    assert steps["aten::abs"] == 1 and not PIECES & set(steps), steps
    assert not PIECES & set(_kernel_ops(converted)), _kernel_ops(converted)
    assert_matches_torchscript(converted, model, draw)
