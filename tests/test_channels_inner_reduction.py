"""Reductions over channels-last activations run with the channels innermost in the C++ kernels
(emitters/cpp_channels_inner.py): a global pool's loads are then contiguous and vectorize. Each package is checked
against TorchScript on fresh inputs."""
import pytest
import torch
import torch.nn.functional as F

import jit2triton
from jit2triton.emitters import cpp_channels_inner
from jit2triton.transpiler import channels_last
from helpers import assert_runtimes_match, assert_same, kernel_body


@pytest.fixture(autouse=True)
def channels_last_always(monkeypatch):
    monkeypatch.setattr(channels_last, "MODE", "always")


class Pools(torch.nn.Module):
    """A SiLU then global average pool (EfficientNet's head), a max over H and W, a squeeze-excite gate, over
    72 channels: one full block of 64 and a partial one."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 72, 3, padding=1)
        self.reduce, self.expand = torch.nn.Conv2d(72, 18, 1), torch.nn.Conv2d(18, 72, 1)

    def forward(self, x):
        y = self.conv(x)
        pooled = torch.flatten(F.adaptive_avg_pool2d(F.silu(y), 1), 1)
        gate = torch.sigmoid(self.expand(torch.relu(self.reduce(F.adaptive_avg_pool2d(F.hardtanh(y, 0, 6), 1)))))
        return pooled, y.amax((2, 3)), y * gate


def _interchanged(converted) -> list[str]:
    code = converted.code
    return [k["name"] for k in converted.summary()["kernels"]
            if "channel_block" in code[code.find(f"int {k['name']}("):][:3000].split("return j2t_status")[0]]




def test_global_pools_over_channels_last_run_channels_innermost(tmp_path):
    torch.manual_seed(0)
    make = lambda: torch.randn(2, 3, 9, 10)
    traced = torch.jit.trace(Pools().eval(), make())
    converted = jit2triton.convert(traced, (make(),), choices="fixed")
    interchanged = _interchanged(converted)
    assert any("silu_adaptive_avg_pool2d" in k for k in interchanged), interchanged
    assert any("amax" in k for k in interchanged), interchanged
    assert any("hardtanh_adaptive_avg_pool2d" in k for k in interchanged), interchanged
    assert_runtimes_match(converted, traced, make, tmp_path)


def test_a_dynamic_batch_pools_channels_innermost_at_every_size(tmp_path):
    torch.manual_seed(0)
    traced = torch.jit.trace(Pools().eval(), torch.randn(2, 3, 9, 10))
    batch = jit2triton.Dim("batch", min=1, max=64)
    converted = jit2triton.convert(traced, (torch.randn(2, 3, 9, 10),), dynamic_shapes={0: {0: batch}},
                                   choices="fixed")
    interchanged = _interchanged(converted)
    assert any("silu_adaptive_avg_pool2d" in k for k in interchanged), interchanged
    sizes = iter([1, 5, 64, 3])
    assert_runtimes_match(converted, traced, lambda: torch.randn(next(sizes), 3, 9, 10), tmp_path)


def test_contiguous_nchw_pools_keep_the_usual_form():
    """Without channels-last the reduction dims are the contiguous ones: the usual form already vectorizes."""
    torch.manual_seed(0)
    model = torch.jit.trace(Pools().eval(), torch.randn(2, 3, 9, 10))
    channels_last.MODE = "never"
    converted = jit2triton.convert(model, (torch.randn(2, 3, 9, 10),), choices="fixed")
    assert not _interchanged(converted)
    x = torch.randn(2, 3, 9, 10)
    assert_same(converted(x), model(x))


def test_nan_propagates_through_a_channels_inner_max(tmp_path):
    torch.manual_seed(0)
    traced = torch.jit.trace(Pools().eval(), torch.randn(2, 3, 9, 10))
    converted = jit2triton.convert(traced, (torch.randn(2, 3, 9, 10),), choices="fixed")
    x = torch.randn(2, 3, 9, 10)
    x[1, :, 4, 4] = float("nan")
    got, want = converted(x)[1], traced(x)[1]
    assert torch.isnan(got[1]).any() and torch.equal(torch.isnan(got), torch.isnan(want))
    assert cpp_channels_inner.BLOCK == 64  # (72 channels: the test covers a full block and a partial one)


class ChannelReductions(torch.nn.Module):
    """Reductions over NCHW channels (a spatial attention map's max and mean, a channel argmax): for each output
    pixel the channels lie H*W floats apart, as channels-last activations' pixels do for a pool."""

    def forward(self, x):
        return x.amax(1), x.mean(1, keepdim=True), x.sum(1).flatten(1).argmax(1)


@pytest.mark.parametrize("batch", [1, 2])
def test_reductions_over_nchw_channels_run_with_the_output_row_innermost(batch, tmp_path):
    """A batch of one once kept them in the usual form (the batch dim, which no reduction reads, swept after the
    reduction: a loop of one), reading every output's channels 25,600 floats apart: 8x ATen's time."""
    make = lambda: torch.randn(batch, 16, 12, 40)
    scripted = torch.jit.script(ChannelReductions().eval())
    converted = jit2triton.convert(scripted, (make(),), choices="fixed")
    interchanged = _interchanged(converted)
    assert any("amax" in k for k in interchanged) and any("mean" in k for k in interchanged), interchanged
    assert_runtimes_match(converted, scripted, make, tmp_path)


class ChannelsFirstNorms(torch.nn.Module):
    """Reductions over a dim that is not the last, then a sweep over it: a softmax over dim 1 of [N, C, L], and a
    channels-first LayerNorm over C of NCHW (ConvNeXt's LayerNorm2d: a mean, a variance that reads it, then the
    normalised, scaled values)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight, self.bias = torch.nn.Parameter(torch.randn(24)), torch.nn.Parameter(torch.randn(24))

    def forward(self, x, y):
        u = y.mean(1, keepdim=True)
        s = (y - u).pow(2).mean(1, keepdim=True)
        normed = self.weight[:, None, None] * ((y - u) / torch.sqrt(s + 1e-6)) + self.bias[:, None, None]
        return torch.softmax(x, 1), normed


@pytest.mark.parametrize("batch", [1, 3])
def test_a_sweep_after_reductions_over_a_middle_dim_runs_channels_innermost(batch, tmp_path, monkeypatch):
    """Each of their C values lies L (or H*W) floats apart per output point: the softmax over dim 1 of 32x256x64
    took 7.8x ATen's time in the usual form. Interchanged, its reductions and its sweep read contiguous rows."""
    monkeypatch.setattr(channels_last, "MODE", "never")
    make = lambda: (torch.randn(batch, 40, 72), torch.randn(batch, 24, 9, 10) * 3 + 1)
    scripted = torch.jit.script(ChannelsFirstNorms().eval())
    converted = jit2triton.convert(scripted, make(), choices="fixed")
    interchanged = _interchanged(converted)
    assert any("softmax" in k for k in interchanged), interchanged
    assert any("mean" in k for k in interchanged), interchanged
    name = next(k["name"] for k in converted.summary()["kernels"] if "softmax" in k["name"])
    softmax = kernel_body(converted.code, name).split("return j2t_status")[0]
    assert softmax.count("expf") == 1 and "stashed" in softmax, softmax  # (each exp once, read back by the sweep)
    path = tmp_path / "model.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(6):
        inputs = make()
        with torch.no_grad():
            assert_same(loaded(*inputs), scripted(*inputs), f"call {call}", {torch.float32: (1e-5, 1e-5)})


def row_sums(x):
    return x.sum(-1)


def column_sums(x):
    return x.sum(0)


@pytest.mark.parametrize("sums, shape", [(row_sums, (4, 200_000)), (column_sums, (200_000, 24))])
def test_float_sums_stay_accurate_over_long_rows(sums, shape):
    """A float sum's lanes add in float over chunks of the row (emitters/common.py's FLOAT_SUM_CHUNK), each chunk's
    sum then in double: as close to the exact sum as a double accumulator, where lanes adding a whole row of 200,000
    floats in float would drift from it by about 1e-5. The same for a column's sums, channels innermost."""
    torch.manual_seed(0)
    scripted = torch.jit.script(sums)
    x = 1.0 + 1e-3 * torch.randn(*shape)
    converted = jit2triton.convert(scripted, (x,), choices="fixed")
    assert "part" in converted.code  # (the chunked form)
    assert ("channel_block" in converted.code) == (sums is column_sums)
    for _ in range(3):
        x = 1.0 + 1e-3 * torch.randn(*shape)
        exact = x.double().sum(-1 if sums is row_sums else 0)
        assert ((converted(x).double() - exact).abs() / exact).max() < 2e-7


class PermutedLayerNorm(torch.nn.Module):
    """transformers' ConvNextLayerNorm over channels first: a LayerNorm over C of a permuted NCHW activation, stored
    NHWC. In the usual form each output point read its 96 channels 1,024 floats apart (1.02 ms at 2x96x32x32, where
    TorchScript takes 0.42); interchanged, the reads are contiguous and the stores 96 apart (0.08 ms)."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(96)

    def forward(self, x):
        return self.norm(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def test_a_layer_norm_over_permuted_channels_runs_channels_innermost(tmp_path, monkeypatch):
    monkeypatch.setattr(channels_last, "MODE", "never")
    torch.manual_seed(0)
    traced = torch.jit.trace(PermutedLayerNorm().eval(), torch.randn(2, 96, 16, 32))
    converted = jit2triton.convert(traced, (torch.randn(2, 96, 16, 32),), choices="fixed")
    assert any("layer_norm" in k for k in _interchanged(converted)), converted.code
    assert_runtimes_match(converted, traced, lambda: torch.randn(2, 96, 16, 32), tmp_path, calls=6)
