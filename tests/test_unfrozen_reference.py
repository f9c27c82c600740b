"""Verification's reference is the model as the user loads it, not torch.jit.freeze's output, and a model whose outputs
depend discretely on its values (a score threshold, top-k, NMS) is frozen without conv-BatchNorm folding, whose
rounding could pick another box than the user's model (issue 46, item 3). A feed-forward conv net keeps folding."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn as nn

import jit2triton
from jit2triton.loaders import load_script
from jit2triton.loaders.discrete_outputs import discrete_decisions

# BatchNorm constants for the score channel (whose convolution weights are zero, so every position scores the conv
# bias through BN): ATen's BatchNorm gives exactly THRESHOLD, the folded convolution one float below it
SCORE_BIAS, MEAN, VAR, GAMMA, BETA = (-1.54607093334198, 0.11263976246118546, 0.9669770002365112,
                                      1.7089712619781494, 0.39173391461372375)
THRESHOLD = -2.4909369945526123


class ThresholdDetector(nn.Module):
    """Conv + BN, a score threshold picking positions (nonzero), their boxes ordered by a top-k."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.threshold = THRESHOLD
        with torch.no_grad():
            self.conv.weight[0].zero_()
            self.conv.bias[0] = SCORE_BIAS
            for buffer, value in [(self.bn.running_mean, MEAN), (self.bn.running_var, VAR),
                                  (self.bn.weight, GAMMA), (self.bn.bias, BETA)]:
                buffer.uniform_(0.5, 1.5)
                buffer[0] = value

    def forward(self, x):
        y = self.bn(self.conv(x))
        scores = y[:, 0].flatten()
        boxes = y[:, 1:].permute(0, 2, 3, 1).reshape(-1, 3)
        keep = (scores >= self.threshold).nonzero().squeeze(1)
        picked = boxes[keep]
        order = picked[:, 0].topk(min(4, picked.size(0))).indices
        return picked[order], keep


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


@pytest.fixture(scope="module")
def detector():
    return torch.jit.script(ThresholdDetector().eval())


def _frozen(model):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.freeze(model)


def test_folding_would_flip_the_threshold(detector):
    """The premise: the frozen (folded) model keeps no position where the model as loaded keeps them all."""
    x = torch.randn(1, 3, 5, 5)
    assert detector(x)[1].numel() == 25 and _frozen(detector)(x)[1].numel() == 0


def test_a_detector_is_not_folded_and_matches_the_model_as_loaded(detector):
    script = load_script(detector)
    assert script.graph.findAllNodes("aten::batch_norm")
    assert any("conv-BatchNorm folding left out" in note and "aten::nonzero" in note for note in script.notes)
    converted = jit2triton.convert(detector, (torch.randn(1, 3, 5, 5),))
    assert "conv-BatchNorm folding left out" in converted.report()
    for seed in range(3):
        x = torch.randn(1, 3, 5, 5, generator=torch.Generator().manual_seed(seed))
        (boxes, keep), (expected_boxes, expected_keep) = converted(x), detector(x)
        assert torch.equal(keep, expected_keep)
        torch.testing.assert_close(boxes, expected_boxes)


def test_a_feed_forward_conv_net_keeps_folding():
    script = load_script(torch.jit.script(ConvBN().eval()))
    assert not script.graph.findAllNodes("aten::batch_norm") and not script.notes


def test_where_the_analysis_misses_a_decision_verification_against_the_model_as_loaded_catches_it(
        detector, monkeypatch):
    """Folded anyway, the package would give the frozen model's answer (no position kept); verification compares
    with the model as loaded, so it is not shipped: the model is converted again unfolded, and the report says why."""
    from jit2triton.loaders import torchscript
    monkeypatch.setattr(torchscript, "discrete_decisions", lambda graph: [])
    assert load_script(detector).folded
    converted = jit2triton.convert(detector, (torch.randn(1, 3, 5, 5),), backend="aten")
    assert "converted with it, the model differed from the model as loaded" in converted.report()
    x = torch.randn(1, 3, 5, 5)
    assert torch.equal(converted(x)[1], detector(x)[1])


@pytest.mark.parametrize("source, decides", [
    ("def f(x):\n    return x.argmax(-1)", True),
    ("def f(x):\n    return x.topk(2)[0]", False),
    ("def f(x):\n    return x.topk(2)[1]", True),
    ("def f(x, ids):\n    return x.masked_fill(ids == 0, 0.0)", False),
    ("def f(x):\n    return x[x > 0]", True),
    ("def f(x, n: int):\n    if n > 3 and x.size(0) > 2:\n        x = x + 1\n    return x", False),
    ("def f(x):\n    if bool(x.sum() > 0):\n        x = x + 1\n    return x", True),
    ("def f(x):\n    if x.max().item() > 0.5:\n        x = x + 1\n    return x", True),
])
def test_which_graphs_decide_on_values(source: str, decides: bool):
    graph = torch.jit.CompilationUnit(source + "\n").f.graph
    assert bool(discrete_decisions(graph)) == decides, discrete_decisions(graph)


class Normalised(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm2d(16)
        with torch.no_grad():
            for buffer in (self.bn.running_mean, self.bn.weight, self.bn.bias):
                buffer.normal_()
            self.bn.running_var.uniform_(0.1, 2.0)

    def forward(self, x):
        return self.bn(x) * 2.0


def test_batch_norm_kernels_round_as_aten_does():
    """BatchNorm left unfolded computes ATen's CPU formula to the bit (x * alpha + beta, fused multiply-adds): a
    score at a threshold then decides as the model does."""
    model = torch.jit.script(Normalised().eval())
    converted = jit2triton.convert(model, (torch.randn(2, 16, 4, 4),))
    assert converted.summary()["kernels"][0]["ops"][0] == "aten::batch_norm"
    x = torch.randn(2, 16, 4, 4)
    assert torch.equal(converted(x), model(x))


class Predictor(nn.Module):
    """A detector's box predictor: two linears read one input (FastRCNNPredictor)."""

    def __init__(self):
        super().__init__()
        self.cls, self.box = nn.Linear(64, 8), nn.Linear(64, 32)

    def forward(self, x):
        return torch.softmax(self.cls(x), -1), self.box(x)


class ThresholdPredictor(Predictor):
    """... whose scores' threshold picks the boxes."""

    def forward(self, x):
        scores, boxes = torch.softmax(self.cls(x), -1), self.box(x)
        keep = scores[:, 1] > 0.125
        return boxes[keep], scores[keep]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.jit.freeze merges linears only on CUDA")
@pytest.mark.parametrize("model, merged", [(Predictor, True), (ThresholdPredictor, False)])
def test_linears_reading_one_input_are_merged_only_where_no_decision_follows(model, merged: bool):
    """torch.jit.freeze merges linears that read one input into one GEMM (FrozenConcatLinear, also with
    optimize_numerics=False), which rounds otherwise: Faster R-CNN's scores crossed its threshold (63 boxes where
    TorchScript gave 62). A model that decides on values is frozen without it; any other keeps the merge."""
    scripted = torch.jit.script(model().eval().cuda())
    linears = load_script(scripted).graph.findAllNodes("aten::linear", True)
    assert len(linears) == (1 if merged else 2)
    x = torch.randn(256, 64, device="cuda")
    converted = jit2triton.convert(scripted, (x,), device="cuda")
    assert converted.summary()["verification"]["status"] in ("passed", "matched up to rounding"), converted.report()


@pytest.mark.parametrize("conv, device, cudnn_tf32, noted", [
    (True, "cuda", True, True), (True, "cuda", False, False), (True, "cpu", True, False), (False, "cuda", True, False)])
def test_float32_is_compared_at_tf32_tolerance_where_tf32_convolutions_run(conv, device, cudnn_tf32, noted,
                                                                            monkeypatch):
    """On CUDA with cuDNN's TF32 on (torch's default), TorchScript and the package each round convolutions through
    TF32 in the algorithm cuDNN picks per call: Mask R-CNN's masks parted by 7e-3 with every op through ATen, and
    the conversion was refused. Verification then compares float32 at 10x its tolerance, and says so."""
    from jit2triton.verify import tf32_note
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", cudnn_tf32)
    model = torch.jit.script(ConvBN().eval() if conv else Predictor().eval())
    graph = model.graph.copy()
    torch._C._jit_pass_inline(graph)
    note = tf32_note(graph, torch.device(device))
    assert (note is not None) == noted
    if noted:
        assert "TF32" in note
