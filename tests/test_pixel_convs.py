"""A 1x1 convolution of a one-pixel image runs as `linear` on the CPU, and the gate it makes is stored once
(transpiler/pixel_convs.py): checked against TorchScript on fresh inputs."""
import pytest
import torch

import jit2triton
from jit2triton.transpiler import pixel_convs
from helpers import BACKENDS, assert_matches_torchscript, convert_for


class Excite(torch.nn.Module):
    """Squeeze-excite twice: after a global pool (bias, relu, sigmoid) and after a keepdim mean (no bias, a stride
    that one pixel makes moot, hardsigmoid); and a 1x1 conv of a 2x2 image, which stays a convolution."""

    def __init__(self) -> None:
        super().__init__()
        self.reduce, self.expand = torch.nn.Conv2d(24, 6, 1), torch.nn.Conv2d(6, 24, 1)
        self.squeeze = torch.nn.Conv2d(24, 8, 1, stride=2, bias=False)
        self.unsqueeze = torch.nn.Conv2d(8, 24, 1, bias=False)
        self.wide = torch.nn.Conv2d(24, 24, 1)

    def forward(self, x):
        x = x * torch.sigmoid(self.expand(torch.relu(self.reduce(torch.nn.functional.adaptive_avg_pool2d(x, 1)))))
        s = x.mean((2, 3), keepdim=True)
        x = x * torch.nn.functional.hardsigmoid(self.unsqueeze(self.squeeze(s)))
        return x + self.wide(torch.nn.functional.adaptive_avg_pool2d(x, 2)).repeat(1, 1, 5, 5)


def _draw():
    return (torch.randn(2, 24, 10, 10),)


def _fused_ops(converted):
    return [[f["op"] for f in e["fused"]] for e in converted.manifest["nodes"] if e["category"] == "kernel"]


@pytest.mark.parametrize("backend", BACKENDS[:2])
def test_pixel_convs_match_torchscript(backend):
    model = torch.jit.trace(Excite().eval(), _draw())
    converted = convert_for(model, _draw(), backend, choices="fixed")  # no timed choices: ATen's convs and GEMMs
    assert_matches_torchscript(converted, model, _draw)
    ops = [e["op"] for e in converted.manifest["nodes"]]
    assert ops.count("aten::linear") == 4 and ops.count("aten::_convolution") == 1, ops
    # each gate is stored by a kernel of its own, not recomputed by the one that multiplies it in
    gates = [fused for fused in _fused_ops(converted) if fused[-1] in ("aten::sigmoid", "aten::hardsigmoid")]
    assert len(gates) == 2, _fused_ops(converted)


def test_a_dynamic_batch_stores_its_gates_too(tmp_path):
    model = torch.jit.trace(Excite().eval(), _draw())
    batch = jit2triton.Dim("batch", min=1, max=8)
    converted = jit2triton.convert(model, _draw(), dynamic_shapes={0: {0: batch}}, choices="fixed")
    assert len([f for f in _fused_ops(converted) if f[-1] in ("aten::sigmoid", "aten::hardsigmoid")]) == 2
    sizes = iter([1, 5, 8, 3])
    assert_matches_torchscript(converted, model, lambda: (torch.randn(next(sizes), 24, 10, 10),))


def test_never_keeps_the_convolutions(monkeypatch):
    monkeypatch.setattr(pixel_convs, "MODE", "never")
    model = torch.jit.trace(Excite().eval(), _draw())
    converted = convert_for(model, _draw(), "cpp", choices="fixed")
    assert [e["op"] for e in converted.manifest["nodes"]].count("aten::_convolution") == 5
