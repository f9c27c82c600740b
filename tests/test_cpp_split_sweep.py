"""A C++ pointwise kernel whose reads take its innermost dim apart by a constant is swept as two loops
(emitters/cpp_split_sweep.py): an attention's heads merged (`transpose(1, 2).reshape(b, s, h * d)`), read dense in
the inner loop. Each package is checked against TorchScript on fresh inputs; the loop nest is read off the code."""
import re

import pytest
import torch

import jit2triton
from jit2triton.emitters import cpp_split_sweep
from helpers import assert_same


class MergeHeads(torch.nn.Module):
    def forward(self, x):
        b, h, s, d = x.shape
        return torch.tanh(x.transpose(1, 2).reshape(b, s, h * d)) * 2


def _converted(heads: int, width: int, dynamic: bool):
    torch.manual_seed(0)
    example = torch.randn(2, heads, 24, width)
    traced = torch.jit.trace(MergeHeads(), example)
    dims = ({2: jit2triton.Dim("S", min=2, max=64)},) if dynamic else None
    return traced, jit2triton.convert(traced, (example,), backend="cpp", dynamic_shapes=dims)


def _split(code: str) -> bool:
    """Whether the kernel sweeps its last dim as rows of a constant width, the inner loop vectorized."""
    rows = r"for \(int64_t (\w+)o = 0;[^\n]*\n\s*#pragma omp simd\n\s*for \(int64_t \1i = 0; \1i < 32;"
    return re.search(rows, code) is not None


@pytest.mark.parametrize("dynamic", [False, True])
def test_merged_heads_are_read_dense_in_rows_of_the_head_width(dynamic, tmp_path):
    traced, converted = _converted(6, 32, dynamic)
    assert _split(converted.code), converted.code
    converted.save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t")
    for length in (24, 2, 64, 17, 24, 40) if dynamic else (24,) * 6:
        x = torch.randn(2, 6, length, 32)
        assert_same(loaded(x), traced(x), f"length {length}")


def test_a_narrow_head_keeps_one_loop(monkeypatch):
    """Below MIN_INNER lanes an inner loop would not fill the vectors the gather fills."""
    monkeypatch.setattr(cpp_split_sweep, "MIN_INNER", 64)
    _, converted = _converted(6, 32, False)
    assert not _split(converted.code) and "#pragma omp simd" in converted.code
