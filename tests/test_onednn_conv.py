"""2-d convolutions by constant weights run as oneDNN's fused `_convolution_pointwise` on the CPU where it is faster
(transpiler/onednn_conv.py), a residual add and an activation after one as its post-ops. Every package is checked
against TorchScript on fresh inputs; the rewrite is forced (`MODE = "always"`) where a test is
about its form, since the timed choice depends on the machine."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import jit2triton
from jit2triton.transpiler import channels_last, onednn_conv, pixel_convs
from helpers import assert_runtimes_match, assert_same

pytestmark = pytest.mark.skipif(not onednn_conv.available(), reason="this torch has no oneDNN fused convolution")


@pytest.fixture(autouse=True)
def convolutions_of_one_pixel_stay(monkeypatch):
    """The nets below hold squeeze-excite's 1x1 convolutions of one pixel, which pixel_convs.py otherwise makes
    GEMMs: kept here, as the convolutions these tests are about."""
    monkeypatch.setattr(pixel_convs, "MODE", "never")


@pytest.fixture(autouse=True)
def no_templates(monkeypatch):
    """These tests are about oneDNN's form and ATen's: the generated templates (test_conv_template.py) are not
    offered, as timing might choose them."""
    monkeypatch.setattr(onednn_conv, "TEMPLATE", "never")


@pytest.fixture
def always(monkeypatch):
    monkeypatch.setattr(onednn_conv, "MODE", "always")


def _bn(channels: int) -> nn.BatchNorm2d:
    bn = nn.BatchNorm2d(channels)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    nn.init.uniform_(bn.weight, 0.5, 1.5)
    nn.init.uniform_(bn.bias, -0.5, 0.5)
    return bn


class Convs(nn.Module):
    """conv+BN+ReLU with stride and padding, a grouped dilated conv with ReLU6, depthwise with SiLU, a 1x1 with a
    residual add then ReLU, a squeeze-excite gate (1x1 convs with ReLU and sigmoid), a bias-free conv with GELU,
    and a conv whose output has two readers (nothing folds)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem, self.stem_bn = nn.Conv2d(3, 16, 3, stride=2, padding=1), _bn(16)
        self.grouped = nn.Conv2d(16, 16, 3, padding=2, dilation=2, groups=4)
        nn.init.uniform_(self.grouped.weight, -2, 2)  # outputs well past ReLU6's bound
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.pointwise = nn.Conv2d(16, 16, 1)
        self.reduce, self.expand = nn.Conv2d(16, 4, 1), nn.Conv2d(4, 16, 1)
        self.plain = nn.Conv2d(16, 8, (3, 1), padding=(1, 0), bias=False)
        self.head = nn.Conv2d(16, 8, 1, bias=False)

    def forward(self, x):
        x = torch.relu(self.stem_bn(self.stem(x)))
        x = F.relu6(self.grouped(x))
        y = F.silu(self.depthwise(x))
        x = torch.relu(self.pointwise(y) + x)
        gate = torch.sigmoid(self.expand(torch.relu(self.reduce(F.adaptive_avg_pool2d(x, 1)))))
        x = x * gate
        z = self.plain(x)
        return F.gelu(self.head(x)), z, z * 2


def _fused(converted) -> list[tuple]:
    ops = (onednn_conv.OP, onednn_conv.BINARY_OP)
    return sorted(tuple(e["from_ops"]) for e in converted.manifest["nodes"] if e["op"] in ops)




@pytest.fixture
def channels_last_always(monkeypatch):
    monkeypatch.setattr(channels_last, "MODE", "always")


def test_each_convolution_runs_fused_with_its_epilogue(always, channels_last_always, tmp_path):
    torch.manual_seed(0)
    make = lambda: torch.randn(2, 3, 20, 18)
    traced = torch.jit.trace(Convs().eval(), make())
    converted = jit2triton.convert(traced, (make(),), choices="fixed")
    conv = "aten::_convolution"
    assert _fused(converted) == sorted([
        (conv, "aten::relu"), (conv, "aten::relu6"), (conv, "aten::silu"), (conv, "aten::add.Tensor", "aten::relu"),
        (conv, "aten::relu"), (conv, "aten::sigmoid"), (conv, "aten::gelu"), (conv,)]), _fused(converted)
    # each weight is reordered for oneDNN once, at load; the package holds plain tensors
    packed = converted.manifest["plan"].get("packed", [])
    assert [e["op"] for e in packed] == [onednn_conv.REORDER_OP] * 8, packed
    assert all(w.layout == torch.strided for w in converted._contents.weights.values())
    assert_runtimes_match(converted, traced, make, tmp_path, tolerance=1e-4)


def test_a_net_in_its_own_nchw_layout_keeps_atens_convolutions(always, monkeypatch, tmp_path):
    """The fused op's output is channels-last whatever its input's layout: an NCHW net keeps ATen's."""
    monkeypatch.setattr(channels_last, "MODE", "never")
    torch.manual_seed(0)
    make = lambda: torch.randn(2, 3, 20, 18)
    traced = torch.jit.trace(Convs().eval(), make())
    converted = jit2triton.convert(traced, (make(),), choices="fixed")
    assert not _fused(converted)
    assert_runtimes_match(converted, traced, make, tmp_path, calls=1, tolerance=1e-4)


def test_a_residual_computed_after_the_convolution_is_not_folded(always, channels_last_always, tmp_path):
    """conv(a) + conv(b): the second conv's output does not exist yet where the first runs, so only the second
    (whose residual is the first's output) takes the add in."""
    class TwoBranches(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(4, 8, 3, padding=1), nn.Conv2d(4, 8, 1)

        def forward(self, x):
            return torch.relu(self.a(x) + self.b(x))

    torch.manual_seed(0)
    make = lambda: torch.randn(1, 4, 7, 9)
    traced = torch.jit.trace(TwoBranches().eval(), make())
    converted = jit2triton.convert(traced, (make(),), choices="fixed")
    assert _fused(converted) == [("aten::_convolution",), ("aten::_convolution", "aten::add.Tensor", "aten::relu")]
    assert_runtimes_match(converted, traced, make, tmp_path, tolerance=1e-4)


def test_a_dynamic_batch_runs_fused_at_every_size(always, channels_last_always, tmp_path):
    torch.manual_seed(0)
    traced = torch.jit.trace(Convs().eval(), torch.randn(2, 3, 16, 16))
    batch = jit2triton.Dim("batch", min=1, max=32)
    converted = jit2triton.convert(traced, (torch.randn(2, 3, 16, 16),), dynamic_shapes={0: {0: batch}},
                                   choices="fixed")
    assert len(_fused(converted)) == 8, _fused(converted)
    sizes = iter([1, 5, 32, 3])
    assert_runtimes_match(converted, traced, lambda: torch.randn(next(sizes), 3, 16, 16), tmp_path, tolerance=1e-4)


def test_fixed_choices_keep_atens_convolution_without_timing(channels_last_always, monkeypatch):
    """choices="fixed" takes FIXED for every convolution, timing nothing, on every machine alike."""
    monkeypatch.setattr(onednn_conv, "_candidates", lambda *a: pytest.fail("fixed choices must time nothing"))
    torch.manual_seed(0)
    traced = torch.jit.trace(Convs().eval(), torch.randn(2, 3, 16, 16))
    converted = jit2triton.convert(traced, (torch.randn(2, 3, 16, 16),), choices="fixed")
    assert not _fused(converted)
    choices = [c for c in converted.summary()["timed_choices"] if "convolution" in c["what"]]
    assert len(choices) == 8 and all(c["fixed"] and c["chosen"] == "aten" for c in choices), choices


def test_the_timed_choice_keeps_aten_where_the_fused_op_is_not_faster(channels_last_always, monkeypatch, steady_timing):
    """`auto` rewrites only where the fused op takes at most MARGIN of ATen's time."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval()
    traced = torch.jit.trace(model, torch.randn(1, 3, 12, 12))
    monkeypatch.setattr(onednn_conv, "_chosen", {})
    monkeypatch.setattr(onednn_conv, "MARGIN", 0.0)
    assert not _fused(jit2triton.convert(traced, (torch.randn(1, 3, 12, 12),)))
    monkeypatch.setattr(onednn_conv, "_chosen", {})
    monkeypatch.setattr(onednn_conv, "MARGIN", 1e9)
    converted = jit2triton.convert(traced, (torch.randn(1, 3, 12, 12),))
    assert _fused(converted) == [("aten::_convolution", "aten::relu")]
    x = torch.randn(1, 3, 12, 12)
    torch.testing.assert_close(converted(x), traced(x), rtol=1e-4, atol=1e-4)


def test_a_torch_without_the_fused_ops_keeps_atens_convolutions(always, channels_last_always, monkeypatch):
    """A torch build without oneDNN's fused convolution (or without oneDNN) converts as before."""
    monkeypatch.setattr(onednn_conv, "available", lambda: False)
    torch.manual_seed(0)
    traced = torch.jit.trace(Convs().eval(), torch.randn(2, 3, 16, 16))
    converted = jit2triton.convert(traced, (torch.randn(2, 3, 16, 16),), choices="fixed")
    assert not _fused(converted) and "packed" not in converted.manifest["plan"]
    x = torch.randn(2, 3, 16, 16)
    assert_same(converted(x), traced(x), "", {torch.float32: (1e-4, 1e-4)})


def test_the_layout_choice_times_channels_last_as_it_will_run_fused(monkeypatch, steady_timing):
    """channels_last.py times the channels-last net with its convolutions fused and their weights reordered in
    advance (ATen's channels-last convolutions alone lost to the model's NCHW on transformers' ResNetModel, fused
    they won by 1.3x); that candidate computes the model's outputs, and each convolution's choice is reported once."""
    timed = []
    plan_run = channels_last._plan_run

    def spy(graph, ctx):
        run = plan_run(graph, ctx)
        timed.append((graph, run()))
        return run

    monkeypatch.setattr(channels_last, "_plan_run", spy)
    monkeypatch.setattr(channels_last, "MARGIN", 1e9)
    monkeypatch.setattr(onednn_conv, "_chosen", {})
    monkeypatch.setattr(onednn_conv, "MARGIN", 1e9)  # every convolution timed, and fused
    torch.manual_seed(0)
    x = torch.randn(2, 3, 16, 16)
    traced = torch.jit.trace(Convs().eval(), x)
    converted = jit2triton.convert(traced, (x,))
    (_, _), (fused, outputs) = timed
    ops = [n.op for n in fused.walk()]
    assert ops.count(onednn_conv.OP) + ops.count(onednn_conv.BINARY_OP) == 8 and onednn_conv.REORDER_OP not in ops
    assert_same(outputs[0], traced(x), "timed channels-last candidate", {torch.float32: (1e-4, 1e-4)})
    whats = [c["what"] for c in converted.summary()["timed_choices"]]
    assert len(whats) == len(set(whats)), whats
    fresh = torch.randn(2, 3, 16, 16)
    assert_same(converted(fresh), traced(fresh), "output", {torch.float32: (1e-4, 1e-4)})

