"""A reduction a kernel would compute again for every index that divides to the same result (a group norm's
statistics, read for each channel of its group) is stored once, as its own kernel over its few results
(transpiler/fuse.py, store_repeated_reductions). HDemucs' GroupNorm(4, 1536) + GLU kernels summed each group's
values once per channel: 0.44x TorchScript on the CPU, 1.00x with the statistics stored."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import jit2triton
from helpers import BACKENDS, assert_matches_torchscript, convert_for


class GroupNormGlu(nn.Module):
    """HDemucs' encoder rewrite: a 1x1 convolution, GroupNorm(4, 64), GLU over the channels (each output channel
    reads two groups)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv1d(16, 64, 1)
        self.norm = nn.GroupNorm(4, 64)
        with torch.no_grad():  # affine parameters that are not 1 and 0, so that a dropped one shows
            self.norm.weight.add_(torch.randn(64) * 0.5)
            self.norm.bias.add_(torch.randn(64) * 0.5)

    def forward(self, x):
        return F.glu(self.norm(self.conv(x)), dim=1) * 2.0


def _draw():
    return (torch.randn(2, 16, 300) * 3 + 1.5,)  # a mean far from 0: a one-pass variance would lose digits


@pytest.mark.parametrize("backend", BACKENDS[:2])  # (the CPU's: on CUDA, split_norms.py handles norms)
def test_group_statistics_are_computed_once_per_group(backend):
    torch.manual_seed(0)
    model = torch.jit.trace(GroupNormGlu().eval(), _draw())
    converted = convert_for(model, _draw(), backend)
    assert_matches_torchscript(converted, model, _draw)
    # the mean and the variance each a kernel over (batch, groups): 2 x 4 numbers, read by the normalizing kernel
    statistics = [k["name"] for k in converted.manifest["kernels"]
                  if any(math.prod(shape) == 2 * 4 for _, shape in k["outputs"])]
    assert len(statistics) == 2, [(k["name"], k["outputs"]) for k in converted.manifest["kernels"]]
    assert converted.summary()["verification"]["kernels_removed"] == []


@pytest.mark.parametrize("backend", BACKENDS[:2])
def test_group_statistics_over_a_dynamic_length_are_computed_once_per_group(backend):
    """The same with the length dynamic: each group sums a number of values known only at run time, and is still
    summed once, not once per channel; the package matches TorchScript at lengths across the range."""
    torch.manual_seed(0)
    model = torch.jit.trace(GroupNormGlu().eval(), _draw())
    length = jit2triton.Dim("length", min=8, max=400)
    converted = convert_for(model, _draw(), backend, dynamic_shapes=({2: length},))
    sizes = iter([8, 37, 300, 400, 129, 64])
    assert_matches_torchscript(converted, model, lambda: (torch.randn(2, 16, next(sizes)) * 3 + 1.5,), calls=6)
    statistics = [k["name"] for k in converted.manifest["kernels"]
                  if any(math.prod(shape) == 2 * 4 for _, shape in k["outputs"])]
    assert len(statistics) == 2, [(k["name"], k["outputs"]) for k in converted.manifest["kernels"]]
