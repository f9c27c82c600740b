"""The C++ renderer's tables: a value that varies only along a kernel's innermost swept dim and costs a libm call or
a division (a BatchNorm's scale, 1/sqrt(var + eps) * weight, with channels innermost) is computed once per index of
that dim, before the rows, not once per element (emitters/cpp.py, `table`). The same operations on the same
operands: the package still gives TorchScript's bits."""
import re

import torch

import jit2triton
from helpers import assert_same

TABLE = re.compile(r"float table\d+\[")


class ConvBatchNorm(torch.nn.Module):
    """A convolution, BatchNorm and an activation, with an argmax after: a discrete output keeps BatchNorm out of
    the convolution's weights (discrete_outputs.py), so its kernel computes ATen's formula after it."""

    def __init__(self, channels: int = 24) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(8, channels, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(channels)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.2, 3)
            self.bn.weight.uniform_(0.5, 2)
            self.bn.bias.uniform_(-1, 1)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.bn(self.conv(x)))
        return y, y.mean(1).flatten(1).argmax(1)


def _image(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 8, 12, 12).contiguous(memory_format=torch.channels_last)


def test_a_channels_last_batch_norm_scales_once_per_channel(tmp_path):
    torch.manual_seed(0)
    model = torch.jit.script(ConvBatchNorm().eval())
    converted = jit2triton.convert(model, (_image(),), backend="cpp")
    assert converted.summary()["verification"]["status"] == "passed", converted.report()
    code = converted.code
    assert TABLE.search(code) and "std::sqrt" in code, code
    # the square root is computed where the tables are filled, never in an `omp simd` sweep
    for kernel in code.split("J2T_KERNEL")[1:]:
        for sweep in kernel.split("#pragma omp simd")[1:]:
            assert "std::sqrt" not in sweep, kernel
    converted.save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t")
    for _ in range(6):
        x = _image()
        with torch.no_grad():
            assert_same(loaded(x), model(x), tolerances={torch.float32: (0, 0)})  # bit for bit


def test_no_table_past_its_size():
    """A dim wider than a table holds keeps the value in the sweep (and the kernel right)."""
    from jit2triton.emitters import cpp
    torch.manual_seed(0)
    channels = cpp.TABLE_SIZE + 8
    model = torch.jit.script(ConvBatchNorm(channels).eval())
    x = torch.randn(1, 8, 2, 2).contiguous(memory_format=torch.channels_last)
    converted = jit2triton.convert(model, (x,), backend="cpp")
    assert not TABLE.search(converted.code)
    x = torch.randn(1, 8, 2, 2).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        assert_same(converted(x), model(x), tolerances={torch.float32: (0, 0)})


class ScaledSum(torch.nn.Module):
    """A per-column scale, 1/sqrt(v + eps) of an input (of a weight it would be folded at conversion), inside a sum
    over the columns: the table serves a reduction's loop."""

    def forward(self, x, v):
        return (x * torch.rsqrt(v + 1e-5)).sum(-1)


def test_a_reduction_reads_its_scale_from_a_table():
    torch.manual_seed(0)
    model = torch.jit.script(ScaledSum().eval())
    converted = jit2triton.convert(model, (torch.randn(64, 96), torch.rand(96) + 0.5), backend="cpp")
    code = converted.code
    assert TABLE.search(code), code
    for kernel in code.split("J2T_KERNEL")[1:]:
        for loop in kernel.split("#pragma omp simd")[1:]:
            assert "std::sqrt" not in loop, kernel
    for _ in range(6):
        x, v = torch.randn(64, 96), torch.rand(96) + 0.5
        with torch.no_grad():
            assert_same(converted(x, v), model(x, v), tolerances={torch.float32: (1e-5, 1e-5)})


def test_the_tables_benchmark_runs():
    """benchmarks/cpp_tables.py, whose numbers docs/benchmarks.md quotes, still runs (one round)."""
    import os
    import subprocess
    import sys
    script = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "cpp_tables.py")
    done = subprocess.run([sys.executable, script, "--rounds", "1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| 1x")]
    assert len(rows) == 6 and all(line.endswith("x |") for line in rows), done.stdout  # (two layouts)


class NchwBatchNorm(torch.nn.Module):
    """BatchNorm + hardswish on NCHW activations 12 wide, with an argmax after (BatchNorm stays unfolded)."""

    def __init__(self) -> None:
        super().__init__()
        self.bn = ConvBatchNorm().bn

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.bn(x))
        return y, y.flatten(1).argmax(1)


def test_a_short_last_dim_is_swept_with_the_one_before_it(tmp_path):
    """A kernel whose last dim is short sweeps its last two dims in each row (emitters/cpp.py, SHORT_SWEEP), so the
    BatchNorm's scale is computed once per channel and H x W: the same bits as TorchScript, over
    six calls."""
    torch.manual_seed(0)
    model = torch.jit.script(NchwBatchNorm().eval())
    converted = jit2triton.convert(model, (torch.randn(2, 24, 10, 12),), backend="cpp")
    kernel = next(k for k in converted.summary()["kernels"] if "batch_norm" in k["name"])
    body = converted.code[converted.code.find(f"int {kernel['name']}("):].split("return j2t_status")[0]
    assert re.search(r"row < 48;.*for \(int64_t \w+ = 0; \w+ < 10;.*#pragma omp simd\s+for \(int64_t \w+ = 0; \w+ < 12;",
                     body, re.S), body
    path = tmp_path / "nchw.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(6):
        x = torch.randn(2, 24, 10, 12)
        with torch.no_grad():
            assert_same(loaded(x), model(x), f"call {call}", tolerances={torch.float32: (0, 0)})
