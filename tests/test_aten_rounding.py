"""Generated Triton kernels round as ATen's CUDA kernels do, bit for bit, for the ops a detector's decisions rest on
(emitters/triton_math.py): float32 division and reciprocal IEEE-rounded, exp, sigmoid and rsqrt as libdevice gives
them, and BatchNorm in eval by ATen's CUDA formula (transpiler/lower_reductions.py). A last-bit difference there
is another box after a top-k or NMS: FCOS and Mask R-CNN lost every generated kernel to verification for it.

On the GPU the package must equal TorchScript exactly; on the CPU (the Triton interpreter, which has no
libdevice) the same source takes triton.language's forms and still matches."""
from __future__ import annotations

import pytest
import torch

import jit2triton
from helpers import on_cpu, on_gpu


class DecodeLike(torch.nn.Module):
    """What a detector's head does after its convolutions: BatchNorm (not after a convolution, so no folding takes
    it), scores through sigmoid, box deltas through exp and divisions, a normalisation by rsqrt."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm2d(8)
        with torch.no_grad():
            self.norm.running_mean.uniform_(-1, 1)
            self.norm.running_var.uniform_(0.2, 3.0)
            self.norm.weight.uniform_(-2, 2)
            self.norm.bias.uniform_(-1, 1)

    def forward(self, x: torch.Tensor, widths: torch.Tensor):
        y = torch.relu(self.norm(x))
        scores = torch.sigmoid(x * 3.0)
        dw = torch.exp(x.clamp(max=4.0)) * widths / 7.5
        centre = (x + 1.0) / (widths + 0.5)
        scale = torch.rsqrt(x * x + 1e-3) + torch.reciprocal(widths + 2.0)
        return y, scores, dw, centre, scale


def _inputs(seed: int, device: str) -> tuple:
    g = torch.Generator().manual_seed(seed)
    return ((torch.randn(2, 8, 13, 17, generator=g) * 3).to(device),
            (torch.rand(2, 8, 13, 17, generator=g) * 40 + 1).to(device))


def _converted(device: str):
    model = torch.jit.script(DecodeLike().eval().to(device))
    converted = jit2triton.convert(model, _inputs(0, device), device=device, backend="triton")
    summary = converted.summary()
    for op in ("aten::batch_norm", "aten::sigmoid", "aten::exp", "aten::div.Tensor", "aten::rsqrt",
               "aten::reciprocal"):
        assert op in {o for kernel in summary["kernels"] for o in kernel["ops"]}, converted.report()
    return model, converted


@on_gpu
def test_kernels_equal_aten_bit_for_bit_on_the_gpu():
    model, converted = _converted("cuda")
    for seed in (1, 2, 3):
        inputs = _inputs(seed, "cuda")
        # (TorchScript's plain interpreter: ATen's kernels, as verification runs it; after two calls its profiling
        # executor would fuse this chain with NNC, which rounds its own way)
        with torch.no_grad(), torch.jit.optimized_execution(False):
            expected = model(*inputs)
        for name, got, want in zip(("batch_norm+relu", "sigmoid", "exp/div", "div", "rsqrt+reciprocal"),
                                   converted(*inputs), expected):
            differ = (got != want).float().mean().item()
            assert differ == 0, f"{name}: {differ:.3%} of the elements differ from ATen's in the last bits"


@on_cpu
def test_the_same_source_runs_under_the_interpreter():
    model, converted = _converted("cpu")
    sources = "".join(data.decode() for name, data in converted._contents.files.items()
                      if name.startswith("kernels/"))
    assert "libdevice.exp" in sources and "tl.math.div_rn" in sources, sources
    for seed in (1, 2):
        inputs = _inputs(seed, "cpu")
        for got, want in zip(converted(*inputs), model(*inputs)):
            torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
