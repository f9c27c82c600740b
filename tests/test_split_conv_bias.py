"""A convolution's bias leaves the convolution for the kernel after it on CUDA (transpiler/split_conv_bias.py).

The pass runs on CUDA only; here it is forced on a CPU conversion (the rewrite does not depend on the device), and
the result is compared with TorchScript on fresh inputs. On a GPU the zoo's CNNs run it for real (test_models.py).
"""
from __future__ import annotations

import torch

import jit2triton
from jit2triton.transpiler import pipeline, pixel_convs
from jit2triton.transpiler.split_conv_bias import split_conv_bias

from helpers import assert_same_outputs, build, copied, fresh_calls, replace_pass
from models import MODELS

CNN = next(s for s in MODELS if s.name == "small_cnn_bn_se")


def test_conv_bias_moves_into_the_kernel_after_it(monkeypatch, tmp_path) -> None:
    counts = []
    replace_pass(monkeypatch, "split_conv_bias", lambda graph, ctx: counts.append(split_conv_bias(graph, "cuda")),
                 devices=pipeline.ALL_DEVICES)
    monkeypatch.setattr(pixel_convs, "MODE", "never")  # CUDA's form: its one-pixel convolutions stay convolutions
    source, reference, example = build(CNN, tmp_path)
    converted = jit2triton.convert(source, example_inputs=example, choices="fixed")  # no timed oneDNN conv
    assert counts == [4]  # every convolution of the model (batch norm folded into them)
    convolutions = [s for s in converted.manifest["plan"]["steps"] if s.get("op") == "aten::_convolution"]
    assert len(convolutions) == 4 and all(s["args"][2] == ["c", None] for s in convolutions)
    assert converted.summary()["fallback_nodes"] == 0
    for call in fresh_calls(CNN, example):
        assert_same_outputs(converted(*copied(call)), reference(*copied(call)), CNN)


def test_on_the_cpu_the_bias_stays_in_the_convolution(tmp_path) -> None:
    source, reference, example = build(CNN, tmp_path)
    converted = jit2triton.convert(source, example_inputs=example, choices="fixed")  # no timed oneDNN conv
    convolutions = [s for s in converted.manifest["plan"]["steps"] if s.get("op") == "aten::_convolution"]
    assert convolutions and all(s["args"][2][0] == "w" for s in convolutions)


def test_an_unbatched_convolution_keeps_its_bias(monkeypatch) -> None:
    counts = []
    replace_pass(monkeypatch, "split_conv_bias", lambda graph, ctx: counts.append(split_conv_bias(graph, "cuda")),
                 devices=pipeline.ALL_DEVICES)
    torch.manual_seed(0)
    conv = torch.jit.script(torch.nn.Conv2d(3, 6, 3).eval())  # called on (C, H, W): no batch dim
    converted = jit2triton.convert(conv, example_inputs=(torch.randn(3, 8, 8),))
    assert counts == [0]
    x = torch.randn(3, 8, 8)
    torch.testing.assert_close(converted(x), conv(x))
