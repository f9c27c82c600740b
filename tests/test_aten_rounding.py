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


# --- the op table's rounds_own_way: every op it does not name rounds as ATen's kernel does, bit for bit -----------

F = torch.nn.functional
PROBES = {  # op -> what computes it, on x in about (-9, 9); each must land in a generated kernel
    "aten::relu": torch.relu, "aten::hardswish": F.hardswish, "aten::hardsigmoid": F.hardsigmoid,
    "aten::hardtanh": F.hardtanh, "aten::leaky_relu": F.leaky_relu, "aten::clamp": lambda x: x.clamp(-1.0, 2.0),
    "aten::rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1), "aten::reciprocal": lambda x: torch.reciprocal(x + 10.0),
    "aten::div.Tensor": lambda x: x / 7.0, "aten::remainder.Scalar": lambda x: torch.remainder(x, 1.7),
    "aten::floor": lambda x: torch.floor(x * 3.3), "aten::where.self": lambda x: torch.where(x > 0, x, x * 0.3),
    "aten::sigmoid": torch.sigmoid, "aten::exp": torch.exp, "aten::log": lambda x: torch.log(x.abs() + 0.1),
    "aten::sin": torch.sin, "aten::cos": torch.cos, "aten::sqrt": lambda x: torch.sqrt(x.abs()),
    "aten::pow.Tensor_Scalar": lambda x: x ** 3, "aten::addcmul": lambda x: torch.addcmul(x, x, x, value=0.5),
    "aten::softmax.int": lambda x: torch.softmax(x, -1), "aten::tanh": torch.tanh, "aten::gelu": F.gelu,
}


class _Probe(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fn(x * 1.5)


def _rounding_probe(op: str, device: str, backend: str) -> None:
    from jit2triton.transpiler.op_table import lookup
    if device in lookup(op).rounds_own_way:
        pytest.skip(f"{op} rounds its own way on {device} (the op table says so)")
    x = torch.randn(64, 96, device=device) * 3
    model = torch.jit.trace(_Probe(PROBES[op]), (x,))
    converted = jit2triton.convert(model, (x,), device=device, backend=backend)
    assert op in {o for kernel in converted.summary()["kernels"] for o in kernel["ops"]}, converted.report()
    for _ in range(2):
        y = torch.randn(64, 96, device=device) * 3  # (fresh values each time)
        with torch.no_grad(), torch.jit.optimized_execution(False):
            want = model(y)
        differ = (converted(y) != want).float().mean().item()
        assert differ == 0, f"{op}: {differ:.3%} of the elements differ from ATen's; add {device!r} to its rounds_own_way"


@pytest.mark.parametrize("op", sorted(PROBES))
def test_an_op_the_table_calls_exact_rounds_as_aten_on_the_cpu(op: str) -> None:
    _rounding_probe(op, "cpu", "cpp")


@on_gpu
@pytest.mark.parametrize("op", sorted(PROBES))
def test_an_op_the_table_calls_exact_rounds_as_aten_on_the_gpu(op: str) -> None:
    _rounding_probe(op, "cuda", "triton")


class FlooredSoftmax(torch.nn.Module):
    """A discrete answer after a float sum: softmax's values scaled, floored, and taken modulo 2 (a parity, as a
    label): the last bit of one sum flips it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = torch.softmax(x * 2.0, -1)
        return torch.remainder(torch.floor(s * 1e7), 2.0) + torch.relu(x)


def test_where_rounding_decides_the_ops_that_round_their_own_way_go_and_the_rest_stay():
    """The kernel that fused softmax with the floor differs from TorchScript: softmax (a sum in its own order) goes to
    ATen, and the arithmetic around it, which rounds as ATen does, stays in kernels; the package then gives
    TorchScript's answers bit for bit. Without the step, the whole kernel went, or (blamed on the floor) it stayed and
    gave other parities."""
    model = torch.jit.script(FlooredSoftmax())
    converted = jit2triton.convert(model, (torch.randn(64, 96),), backend="cpp")
    summary = converted.summary()
    fused = {o for kernel in summary["kernels"] for o in kernel["ops"]}
    assert "aten::softmax.int" not in fused and {"aten::floor", "aten::remainder.Scalar", "aten::relu"} <= fused, \
        converted.report()
    assert summary["verification"]["status"] == "passed"
    assert [r["ops"] for r in summary["verification"]["kernels_removed"]] == [["aten::softmax.int"]]
    assert "does not round as ATen's does on cpu" in converted.report()
    for seed in range(3):
        x = torch.randn(64, 96, generator=torch.Generator().manual_seed(seed))
        assert torch.equal(converted(x), model(x))
