"""Generated convolutions for channels-last CPU nets (emitters/cpp_conv.py, transpiler/conv_kernels.py): the 1x1 and
depthwise templates with the pointwise kernel after each as its epilogue. The template is forced
(`onednn_conv.TEMPLATE = "always"`) where a test is about its form, since the timed choice depends on the machine;
every package is checked against TorchScript on fresh inputs."""
import math
import random

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jit2triton
from jit2triton.emitters import conv_timing, cpp_conv
from jit2triton.transpiler import channels_last, onednn_conv, pixel_convs
from helpers import assert_ran_in_a_kernel, assert_runtimes_match, assert_same

pytestmark = pytest.mark.skipif(not onednn_conv.available(), reason="this torch has no oneDNN (no channels-last nets)")


@pytest.fixture(autouse=True)
def template_always(monkeypatch):
    monkeypatch.setattr(onednn_conv, "TEMPLATE", "always")
    monkeypatch.setattr(channels_last, "MODE", "always")
    monkeypatch.setattr(pixel_convs, "MODE", "never")  # (squeeze-excite's one-pixel 1x1s stay convolutions)


def _bn(channels: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    nn.init.uniform_(bn.weight, 0.5, 1.5)
    return bn


class Blocks(nn.Module):
    """Every shape the templates handle, at odd sizes (pixel counts that are no multiple of the 6-pixel tile, rows
    whose interior is no multiple of 4 pixels, channels that are no multiple of 16): a dense 3x3 stem (its
    product read by the expand and by the residual add), an expand 1x1 + BN + SiLU, a depthwise 3x3 + ReLU6 read twice (squeeze-excite's pool and its multiply), a
    project 1x1 + residual add, a strided depthwise 5x5 with dilation on 24 channels (8 past the last 16-block),
    a 1x1 to 40 channels without a bias, and a 1x1 whose product two ops read (no epilogue)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 24, 3, padding=1)  # a dense 3x3
        self.expand, self.expand_bn = nn.Conv2d(24, 48, 1), _bn(48)
        self.depthwise = nn.Conv2d(48, 48, 3, padding=1, groups=48)
        self.reduce, self.excite = nn.Conv2d(48, 8, 1), nn.Conv2d(8, 48, 1)
        self.project = nn.Conv2d(48, 24, 1)
        self.strided = nn.Conv2d(24, 24, 5, stride=2, padding=4, dilation=2, groups=24)
        self.wide = nn.Conv2d(24, 40, 1, bias=False)
        self.twice = nn.Conv2d(40, 16, 1)

    def forward(self, x):
        x = self.stem(x)
        h = F.silu(self.expand_bn(self.expand(x)))
        h = F.relu6(self.depthwise(h))
        h = h * torch.sigmoid(self.excite(torch.relu(self.reduce(F.adaptive_avg_pool2d(h, 1)))))
        x = self.project(h) + x
        x = torch.relu(self.strided(x))
        y = self.twice(self.wide(x))
        return y.sigmoid(), y * 2


def _templates(converted) -> list[str]:
    return sorted(k["name"] for k in converted.summary()["kernels"] if "_conv" in k["name"] and k["name"][0] == "c")


def test_each_template_convolution_computes_what_torchscript_does(tmp_path):
    torch.manual_seed(0)
    make = lambda: torch.randn(2, 3, 13, 11)  # noqa: E731
    traced = torch.jit.trace(Blocks().eval(), make())
    converted = jit2triton.convert(traced, (make(),), choices="fixed")
    names = _templates(converted)
    # the expand, depthwise and project take their activation or residual add, the strided depthwise its ReLU;
    # squeeze-excite's 1x1s of one pixel store their products (their activations sweep no channels-last tile), as
    # do the 1x1 to 40 channels (the next 1x1 reads it) and the last (its readers write the model's NCHW outputs)
    assert [n.split("_", 1)[1] for n in names] == [
        "dense_conv", "pointwise_conv_silu", "depthwise_conv_relu6", "pointwise_conv", "pointwise_conv", "pointwise_conv_add",
        "depthwise_conv_relu", "pointwise_conv", "pointwise_conv"], (names, converted.report())
    assert "depthwise 3x3 over x[2, 13, 11, 48]" in converted.code  # the readable template, with its provenance
    assert "aten::_convolution" in converted.code
    assert_runtimes_match(converted, traced, make, tmp_path, tolerance=1e-4)


def test_a_batch_of_one_and_pixels_fewer_than_a_tile(tmp_path):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 16, 1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1, groups=16), nn.Hardswish())
    make = lambda: torch.randn(1, 3, 2, 2)  # noqa: E731
    traced = torch.jit.trace(model.eval(), make())
    converted = jit2triton.convert(traced, (make(),), choices="fixed")
    assert len(_templates(converted)) == 2, converted.report()
    assert_runtimes_match(converted, traced, make, tmp_path, tolerance=1e-4)


def test_the_templates_without_avx2_compute_the_same(monkeypatch, tmp_path):
    """Built for the x86-64 baseline (a package rebuilt for a CPU without AVX2 and FMA, or another architecture),
    the templates' plain C++ loops run instead of the AVX2 tiles: checked the same way."""
    from jit2triton.emitters import build
    monkeypatch.setattr(build, "host_isa", lambda: "x86-64")
    torch.manual_seed(4)
    make = lambda: torch.randn(2, 3, 13, 11)  # noqa: E731
    traced = torch.jit.trace(Blocks().eval(), make())
    converted = jit2triton.convert(traced, (make(),), choices="fixed")
    assert converted.manifest["cpp"]["isa"] == "x86-64" and len(_templates(converted)) == 9, converted.report()
    assert_runtimes_match(converted, traced, make, tmp_path, tolerance=1e-4)


def test_a_dilated_1x1_convolution_in_a_channels_last_net(tmp_path):
    """oneDNN in torch 2.13 crashes the process on a channels-last 1x1 convolution with dilation 2; its dilation
    changes nothing (one tap), so the channels-last rewrite sets it to 1 (channels_last.py)."""
    torch.manual_seed(5)
    model = nn.Sequential(nn.Conv2d(8, 15, 2), nn.Sigmoid(), nn.Conv2d(15, 22, 1, stride=2, padding=1, dilation=2))
    make = lambda: torch.randn(2, 8, 12, 2)  # noqa: E731
    traced = torch.jit.trace(model.eval(), make())
    converted = jit2triton.convert(traced, (make(),), choices="fixed")
    assert_runtimes_match(converted, traced, make, tmp_path, tolerance=1e-4)


def test_a_template_kernel_that_disagrees_with_aten_is_taken_out(monkeypatch, tmp_path):
    """A template rendered wrong (its bias subtracted) but timed right: verification takes the kernel out, and the
    convolution runs as ATen's, right."""
    render = cpp_conv.render_conv
    monkeypatch.setattr(cpp_conv, "render_conv", lambda k: render(k).replace("] + in_", "] - in_"))
    monkeypatch.setattr(conv_timing, "conv_templates", lambda kernels: [lambda: None for _ in kernels])
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 1), nn.ReLU())
    make = lambda: torch.randn(2, 3, 8, 8)  # noqa: E731
    traced = torch.jit.trace(model.eval(), make())
    converted = jit2triton.convert(traced, (make(),), choices="fixed")
    assert not _templates(converted), converted.report()
    assert "verification" in converted.report()
    assert_runtimes_match(converted, traced, make, tmp_path, tolerance=1e-4)


def test_the_timed_choice_is_reported_with_both_times(monkeypatch, tmp_path, steady_timing):
    """Timed (not forced), the choice is in the report with both forms' times, and the package has the template
    exactly where the choice says so; fixed choices time nothing and keep no template."""
    monkeypatch.setattr(onednn_conv, "TEMPLATE", "auto")
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.Conv2d(16, 32, 1), nn.ReLU())
    make = lambda: torch.randn(2, 3, 16, 16)  # noqa: E731
    traced = torch.jit.trace(model.eval(), make())
    converted = jit2triton.convert(traced, (make(),))
    choices = [c for c in converted.summary()["timed_choices"] if c["what"].startswith("generated or oneDNN")]
    assert len(choices) == 2 and all(set(c["times_us"]) == {"onednn", "generated"} for c in choices), choices
    assert len(_templates(converted)) == sum(c["chosen"] == "generated" for c in choices)
    assert_runtimes_match(converted, traced, make, tmp_path, tolerance=1e-4)
    fixed = jit2triton.convert(traced, (make(),), choices="fixed")
    assert not _templates(fixed) and not any(c["what"].startswith("generated")
                                             for c in fixed.summary()["timed_choices"])


def test_clamps_by_constants_keep_nan_and_infinities(tmp_path):
    """ReLU, ReLU6 and clamp render as `c > x ? c : x` (two vector instructions): a NaN still passes through, as
    torch's does."""

    class Clamps(nn.Module):
        def forward(self, x):
            return torch.relu(x), F.relu6(x), torch.clamp(x, -1.5, 2.0), torch.clamp(x, max=0.5) * 2

    x = torch.randn(4, 33)
    x[0, :5] = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 7.0])
    traced = torch.jit.trace(Clamps(), x)
    converted = jit2triton.convert(traced, (x,))
    for op in ("aten::relu", "aten::relu6", "aten::clamp"):  # in the kernel (verification would take out one
        assert_ran_in_a_kernel(op, converted)                # that loses the NaN, and ATen would answer)
    path = tmp_path / "clamps.j2t"
    converted.save(path)
    out = jit2triton.load(path)(x)
    assert_same(out, traced(x))
    assert all(torch.isnan(o[0, 0]) for o in out)



def _random_net(rng) -> tuple[nn.Module, tuple]:
    """A random chain of convolutions the templates take, each followed by a random activation, at random small
    sizes: kernels, strides, paddings and dilations that reach past the image's edges, 1 to 40 channels, images
    of 1 to 13 pixels a side. -> (the module, its input's shape)."""
    shape = (rng.randint(1, 3), rng.randint(2, 24), rng.randint(1, 13), rng.randint(1, 13))  # (1 channel: no layout)
    layers, c, size = [], shape[1], shape[2:]
    while len(layers) < 2 * rng.randint(1, 4):
        kind = rng.choice(["pointwise", "depthwise", "dense", "dense"])
        k, stride, padding, dilation = (1, 1, 0, 1) if kind == "pointwise" else (
            rng.randint(1, 5), rng.randint(1, 2), rng.randint(0, 2), rng.randint(1, 2))
        reach = dilation * (k - 1) + 1
        if any(n + 2 * padding < reach for n in size):
            continue
        out = c if kind == "depthwise" else rng.randint(1, 40)
        layers += [nn.Conv2d(c, out, k, stride, padding, dilation, groups=c if kind == "depthwise" else 1,
                             bias=rng.random() < 0.8),
                   rng.choice([nn.ReLU(), nn.ReLU6(), nn.SiLU(), nn.Hardswish(), nn.Identity(), nn.Sigmoid()])]
        size, c = tuple((n + 2 * padding - reach) // stride + 1 for n in size), out
    return nn.Sequential(*layers).eval(), shape


def _check_chain(seed: int, tmp_path) -> bool:
    """The random chain of `seed` converted and checked against TorchScript; -> whether it has a
    template kernel (a chain whose convolution ATen gave an NCHW output stays ATen's)."""
    model, shape = _random_net(random.Random(seed))
    torch.manual_seed(seed)
    make = lambda: torch.randn(shape)  # noqa: E731
    traced = torch.jit.trace(model, make())
    converted = jit2triton.convert(traced, (make(),), choices="fixed")
    assert_runtimes_match(converted, traced, make, tmp_path, calls=1, tolerance=1e-4)
    return bool(_templates(converted))


@pytest.mark.parametrize("seed", range(6))
def test_random_convolution_chains(seed, tmp_path):
    """Random chains of template convolutions and activations against TorchScript, in the runtime
    (`python tests/test_conv_template.py N` runs N more seeds)."""
    assert _check_chain(seed, tmp_path)  # (these seeds' chains all take a template)


if __name__ == "__main__":  # more seeds than the suite runs: python tests/test_conv_template.py [seeds] [first]
    import pathlib
    import sys
    import tempfile
    onednn_conv.TEMPLATE, channels_last.MODE, pixel_convs.MODE = "always", "always", "never"
    count, first = int(sys.argv[1]) if len(sys.argv) > 1 else 100, int(sys.argv[2]) if len(sys.argv) > 2 else 100
    failed = without = 0
    for seed in range(first, first + count):
        try:
            without += not _check_chain(seed, pathlib.Path(tempfile.mkdtemp()))
        except Exception as err:  # noqa: BLE001 - every seed's failure is reported
            failed += 1
            print(f"seed {seed}: {type(err).__name__}: {str(err)[:400]}")
    print(f"{count - failed} of {count} seeds passed ({without} without a template kernel)")
