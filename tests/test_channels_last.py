"""CPU conv nets run on channels-last activations where that is faster (transpiler/channels_last.py): the image
inputs are converted once, convolution weights stored channels-last, and every returned tensor comes back in the
layout TorchScript returned it in. Checked against TorchScript on fresh inputs, values and strides, in the
runtime; the rewrite is forced (`MODE = "always"`) where a test is about its form."""
import pytest
import torch
import torch.nn.functional as F

import jit2triton
from jit2triton.transpiler import channels_last
from helpers import BACKENDS, FRESH_SEED, assert_same, convert_for, on_gpu, to_device


@pytest.fixture
def always(monkeypatch):
    monkeypatch.setattr(channels_last, "MODE", "always")


class ConvNet(torch.nn.Module):
    """Returns a 4-d activation directly, one inside a dict, a pooled vector, and its input unchanged."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(16)
        self.conv2 = torch.nn.Conv2d(16, 16, 3, padding=1, groups=4)

    def forward(self, x):
        a = F.relu(self.bn(self.conv1(x)))
        b = F.gelu(self.conv2(a)) + a
        return b, {"features": a * 2, "pooled": b.mean((2, 3))}, x


def _traced(model, *example):
    torch.manual_seed(0)
    return torch.jit.trace(model.eval(), example, strict=False)


def _same_with_strides(actual, expected, where, tolerances=None):
    assert_same(actual, expected, where, tolerances or {torch.float32: (1e-4, 1e-5)})
    if isinstance(expected, torch.Tensor):
        assert actual.stride() == expected.stride(), f"{where}: strides {actual.stride()}, {expected.stride()}"
    elif isinstance(expected, (tuple, list)):
        for i, (a, e) in enumerate(zip(actual, expected)):
            _same_with_strides(a, e, f"{where}[{i}]", tolerances)
    elif isinstance(expected, dict):
        for key in expected:
            _same_with_strides(actual[key], expected[key], f"{where}[{key!r}]", tolerances)


def test_a_conv_net_runs_channels_last_and_returns_torchscripts_layouts(always, tmp_path):
    traced = _traced(ConvNet(), torch.randn(2, 3, 12, 12))
    converted = jit2triton.convert(traced, (torch.randn(2, 3, 12, 12),))
    steps = converted.manifest["plan"]["steps"]
    first = converted.manifest["nodes"][steps[0]["node"]]
    assert "aten::contiguous" in str(first), first  # the image's one conversion, before anything else
    weights = converted._contents.weights
    conv_weights = [w for w in weights.values() if w.dim() == 4]
    assert conv_weights and all(w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous()
                                for w in conv_weights)
    path = tmp_path / "model.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(2):
        x = torch.randn(2, 3, 12, 12)
        _same_with_strides(loaded(x), traced(x), f"call {call}")


def test_a_model_that_cannot_run_channels_last_keeps_its_layout(always):
    """`view(n, -1)` of a channels-last activation fails: the model keeps NCHW, and converts."""
    class Flattens(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)

        def forward(self, x):
            y = self.conv(x)
            return y.view(y.size(0), -1)

    traced = _traced(Flattens(), torch.randn(2, 3, 8, 8))
    converted = jit2triton.convert(traced, (torch.randn(2, 3, 8, 8),))
    assert not any("contiguous" in str(n) for n in converted.manifest["nodes"])
    x = torch.randn(2, 3, 8, 8)
    _same_with_strides(converted(x), traced(x), "output")


def test_the_timed_choice_keeps_nchw_where_channels_last_is_not_faster(monkeypatch, steady_timing):
    traced = _traced(ConvNet(), torch.randn(1, 3, 12, 12))
    monkeypatch.setattr(channels_last, "MARGIN", 0.0)
    converted = jit2triton.convert(traced, (torch.randn(1, 3, 12, 12),))
    assert not any("contiguous" in str(n) for n in converted.manifest["nodes"])
    assert all(w.is_contiguous() for w in converted._contents.weights.values())
    monkeypatch.setattr(channels_last, "MARGIN", 1e9)
    converted = jit2triton.convert(traced, (torch.randn(1, 3, 12, 12),))
    assert any("contiguous" in str(n) for n in converted.manifest["nodes"])
    x = torch.randn(1, 3, 12, 12)
    _same_with_strides(converted(x), traced(x), "output")


def test_a_dynamic_batch_runs_channels_last_at_every_size(always, tmp_path):
    """Converted at one size and checked at the others conversion observes; served at sizes never seen, values and
    strides as TorchScript's,."""
    traced = _traced(ConvNet(), torch.randn(2, 3, 12, 12))
    batch = jit2triton.Dim("batch", min=1, max=8)
    converted = jit2triton.convert(traced, (torch.randn(2, 3, 12, 12),), dynamic_shapes={0: {0: batch}})
    assert any("contiguous" in str(n) for n in converted.manifest["nodes"])
    path = tmp_path / "model.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for n in (1, 5, 8):
        x = torch.randn(n, 3, 12, 12)
        _same_with_strides(loaded(x), traced(x), f"batch {n}")


def test_a_model_that_runs_channels_last_only_at_some_sizes_keeps_its_layout(always):
    """`reshape` would copy, but `view` of a channels-last activation works only where H = W = 1: at the example
    size it runs, at the other batch sizes too; with a dynamic height it does not, and the model keeps NCHW."""
    class Pools(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)

        def forward(self, x):
            y = torch.nn.functional.adaptive_avg_pool2d(self.conv(x), (x.size(2) // 4, 1))
            return y.view(y.size(0), -1)

    traced = torch.jit.script(Pools().eval())
    size = jit2triton.Dim("height", min=4, max=16)
    converted = jit2triton.convert(traced, (torch.randn(2, 3, 4, 4),), dynamic_shapes={0: {2: size}})
    assert not any("contiguous" in str(n) for n in converted.manifest["nodes"])
    for h in (4, 8, 12):
        x = torch.randn(2, 3, h, 4)
        _same_with_strides(converted(x), traced(x), f"height {h}")


@on_gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_a_half_conv_net_on_cuda_runs_channels_last_and_returns_torchscripts_layouts(dtype):
    """cuDNN's fp16 tensor-core convolutions want NHWC: a half-precision conv net on CUDA is converted (untimed: the
    host-bound plan hides the GPU's time), an fp32 one is not. Against the TorchScript model on the GPU, values
    and strides."""
    torch.manual_seed(0)
    # no TF32 anywhere, CUDA graphs included (captured while verifying): it would differ by layout
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        example = torch.randn(2, 3, 12, 12, device="cuda", dtype=dtype)
        model = torch.jit.trace(ConvNet().eval().cuda().to(dtype), example, strict=False)
        converted = jit2triton.convert(model, (example,), device="cuda")
        assert any("contiguous" in str(n) for n in converted.manifest["nodes"]) == (dtype == torch.float16)
        tolerance = {torch.float32: (1e-4, 1e-4), torch.float16: (1e-2, 1e-2)}
        for call in range(3):
            x = torch.randn(2, 3, 12, 12, device="cuda", dtype=dtype)
            _same_with_strides(converted(x), model(x), f"call {call}", tolerance)


class ScaledConvInput(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(4, 6, 3, padding=1)

    def forward(self, x):
        return self.conv(torch.relu(x) * 2) + x.mean(1, keepdim=True)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
def test_channels_last_example_inputs_are_the_layout_the_package_takes(backend, dynamic, tmp_path):
    """A caller who keeps images channels-last (the example says so) gets kernels built for that layout: the
    inputs were made contiguous at conversion, so every call copied them into NCHW and the first kernel copied
    them back (relu * 2 over 1x64x112x112: 0.5 ms against 0.07). Inputs laid out otherwise are copied, and
    every layout gives TorchScript's answer."""
    torch.manual_seed(0)
    model = torch.jit.trace(ScaledConvInput().eval(), (torch.randn(2, 4, 8, 8),))
    example = torch.randn(2, 4, 8, 8).contiguous(memory_format=torch.channels_last)
    converted = convert_for(model, (example,), backend, **({"dynamic_shapes": "auto"} if dynamic else {}))
    assert converted.manifest["signature"]["inputs"][0]["layout"] == "channels_last"
    assert ("batch" in converted.signature()) == dynamic
    def kernel_steps(steps):
        for step in steps:
            yield from kernel_steps(step.get("steps", ()))  # a graph region's
            if step["kind"] == "kernel":
                yield step
    read = [st for step in kernel_steps(converted.manifest["plan"]["steps"]) for st in step["in_strides"] if st]
    # a kernel reads the input as it comes (over a dynamic batch, the draws were channels-last too)
    assert [1, 32, 4] in [st[1:] for st in read]
    converted.save(tmp_path / "m.j2t")
    generator = torch.Generator().manual_seed(FRESH_SEED)
    loaded = jit2triton.load(tmp_path / "m.j2t")
    for layout in (torch.channels_last, torch.contiguous_format):
        x = torch.randn(3 if dynamic else 2, 4, 8, 8, generator=generator).contiguous(memory_format=layout)
        got = loaded(*to_device((x,), "cuda")) if backend == "cuda" else loaded(x)
        torch.testing.assert_close(got.cpu(), model(x))
