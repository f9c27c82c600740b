"""An op a rewrite writes as pieces for kernels (transpiler/decompositions.py) runs whole through ATen wherever its
pieces do not all reach kernels: a piece that does not lower, a kernel verification takes out, kernel generation
failing. HDemucs on an H100 lost its kernels and ran its 16 split group norms as 64 sums, 48 muls, 32 divs and 16
rsqrts, subs and adds through ATen (0.66x TorchScript). Checked on HDemucs's residual block (Conv1d, GroupNorm(1, C),
GELU, Conv1d, GroupNorm, GLU, LayerScale), its norms split as on CUDA (split_norms.MODE forced here), against
TorchScript on fresh inputs."""
from __future__ import annotations

import dataclasses
from collections import Counter

import pytest
import torch

from jit2triton import conversion
from jit2triton.transpiler import split_norms
from jit2triton.transpiler.lowering import load_lowerings
from jit2triton.transpiler.op_table import OP_TABLE
from jit2triton.transpiler.split_conv_bias import split_conv_bias

from helpers import BACKENDS, assert_matches_torchscript, break_lowering, convert_for, replace_pass

# the ops split_norms writes a norm with (its views aside)
PIECES = {"aten::sum.dim_IntList", "aten::div.Scalar", "aten::sub.Tensor", "aten::rsqrt", "aten::add.Scalar"}


class LayerScale(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(torch.rand(channels) + 0.5)

    def forward(self, x):
        return self.scale[:, None] * x


class DConvBlock(torch.nn.Module):
    """One layer of HDemucs's DConv residual branch, as torchaudio writes it; each norm is one row of 32K-128K values,
    as split_norms splits them on CUDA."""

    def __init__(self, channels: int = 32, hidden: int = 16) -> None:
        super().__init__()
        self.layer = torch.nn.Sequential(
            torch.nn.Conv1d(channels, hidden, 3, padding=1), torch.nn.GroupNorm(1, hidden), torch.nn.GELU(),
            torch.nn.Conv1d(hidden, 2 * channels, 1), torch.nn.GroupNorm(1, 2 * channels), torch.nn.GLU(1),
            LayerScale(channels))
        with torch.no_grad():  # affine parameters that are not 1 and 0, so that a dropped one shows
            for norm in (self.layer[1], self.layer[4]):
                norm.weight.add_(torch.randn_like(norm.weight) * 0.5)
                norm.bias.add_(torch.randn_like(norm.bias) * 0.5)

    def forward(self, x):
        return x + self.layer(x)


def _draw():
    return (torch.randn(1, 32, 2048) * 2 + 0.5,)


@pytest.fixture
def block(monkeypatch):
    monkeypatch.setattr(split_norms, "MODE", "always")
    torch.manual_seed(0)
    return torch.jit.trace(DConvBlock().eval(), _draw())


def _aten_steps(converted) -> Counter:
    """The ops of the plan's steps that run through ATen."""
    return Counter(e["op"] for e in converted.manifest["nodes"] if e["category"] != "kernel")


def _kernel_ops(converted) -> list[str]:
    return [f["op"] for e in converted.manifest["nodes"] if e["category"] == "kernel" for f in e["fused"]]


def _break_rsqrt(monkeypatch, how: str) -> None:
    """The rsqrt of a split norm's variance: its lowering raises, or gives the values negated."""
    break_lowering(monkeypatch, "aten::rsqrt", how)


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_norms_fuse_into_kernels(block, backend):
    converted = convert_for(block, _draw(), backend)
    steps = _aten_steps(converted)
    assert "aten::group_norm" not in steps and not PIECES & set(steps), steps
    assert _kernel_ops(converted).count("aten::sum.dim_IntList") == 8  # two passes of two sums per norm
    assert_matches_torchscript(converted, block, _draw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_split_norm_whose_piece_does_not_lower_runs_as_one_aten_group_norm(block, backend, monkeypatch):
    _break_rsqrt(monkeypatch, "raise")
    converted = convert_for(block, _draw(), backend)
    steps = _aten_steps(converted)
    assert steps["aten::group_norm"] == 2 and not PIECES & set(steps), steps
    kernel_ops = _kernel_ops(converted)
    assert {"aten::gelu", "aten::glu"} <= set(kernel_ops) and not PIECES & set(kernel_ops), kernel_ops
    why = converted.summary()["fallback_reasons"]["aten::group_norm"]
    assert "split_norms wrote it as pieces" in why and "an injected bug" in why, why
    assert_matches_torchscript(converted, block, _draw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_split_norm_kernel_verification_takes_out_runs_as_one_aten_group_norm(block, backend, monkeypatch):
    _break_rsqrt(monkeypatch, "wrong")
    converted = convert_for(block, _draw(), backend)
    removed = converted.summary()["verification"]["kernels_removed"]
    assert removed and all("aten::rsqrt" in r["ops"] for r in removed), removed
    steps = _aten_steps(converted)
    assert steps["aten::group_norm"] == 2 and not PIECES & set(steps), steps
    assert not PIECES & set(_kernel_ops(converted)), _kernel_ops(converted)
    assert_matches_torchscript(converted, block, _draw)


def test_without_kernels_every_split_op_runs_whole(block, monkeypatch):
    """Kernel generation failing for the whole model (as HDemucs's complex pad made it): the norms run as ATen's
    group_norm, and each convolution, its bias split out as on CUDA, with its bias again."""
    replace_pass(monkeypatch, "split_conv_bias", lambda g, c: split_conv_bias(g, "cuda"), devices=("cpu", "cuda"))

    def fails(*args, **kwargs):
        raise RuntimeError("an injected renderer bug")
    monkeypatch.setattr(conversion, "build_kernels", fails)
    converted = convert_for(block, _draw(), "cpp")
    assert "an injected renderer bug" in converted.summary()["generation_failed"]
    steps = _aten_steps(converted)
    assert steps["aten::group_norm"] == 2 and not PIECES & set(steps), steps
    assert steps["aten::add.Tensor"] == 1, steps  # the residual add alone: no bias added after a convolution
    convolutions = [e for e in converted.manifest["nodes"] if e["op"] == "aten::_convolution"]
    assert len(convolutions) == 2
    assert_matches_torchscript(converted, block, _draw)


def test_split_conv_bias_with_kernels_adds_the_bias_in_one(block, monkeypatch):
    """The same forced split with kernels: the bias adds fuse (the rewrite stays), and the outputs match."""
    replace_pass(monkeypatch, "split_conv_bias", lambda g, c: split_conv_bias(g, "cuda"), devices=("cpu", "cuda"))
    converted = convert_for(block, _draw(), "cpp")
    steps = _aten_steps(converted)
    assert steps["aten::add.Tensor"] == 0 and "aten::group_norm" not in steps, steps
    assert _kernel_ops(converted).count("aten::add.Tensor") >= 3  # two biases and the residual
    assert_matches_torchscript(converted, block, _draw)


def test_a_convolution_whose_bias_add_does_not_lower_takes_its_bias_back(block, monkeypatch):
    """The bias split out as on CUDA, and adds that do not lower: each convolution adds its bias itself again (one
    ATen add, the residual's, not three), and still counts as a vendor call (it has no lowering to refuse)."""
    monkeypatch.setattr(split_norms, "MODE", "never")
    replace_pass(monkeypatch, "split_conv_bias", lambda g, c: split_conv_bias(g, "cuda"), devices=("cpu", "cuda"))
    load_lowerings()
    original = OP_TABLE["aten::add.Tensor"]

    def raises(ctx, *args):
        raise KeyError("an injected bug")
    monkeypatch.setitem(OP_TABLE, "aten::add.Tensor", dataclasses.replace(original, lowering=raises))
    converted = convert_for(block, _draw(), "cpp")
    steps = _aten_steps(converted)
    assert steps["aten::add.Tensor"] == 1 and steps["aten::_convolution"] == 2, steps
    assert converted.summary()["extern_nodes"] == 2, converted.summary()
    assert_matches_torchscript(converted, block, _draw)
