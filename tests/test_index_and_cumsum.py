"""Integer-tensor indexing (`aten::index.Tensor`, a gather kernel: transpiler/lower_views.py) and cumulative sums
(`aten::cumsum`, a prefix-masked sum per element: transpiler/lower_reductions.py) run in generated kernels on both
backends, match TorchScript on fresh inputs with no kernel taken out at verification, and an index out of range
raises as ATen's does (transpiler/check_indices.py)."""
from __future__ import annotations

import pytest
import torch

import jit2triton
from helpers import BACKENDS, assert_matches_torchscript, convert_for


def index_forms(x, rows, cols):
    # one index, two broadcast together, adjacent after a whole dim, apart (their dims go first), negative ones
    return x[rows] * 2.0, x[rows, :, cols], x[:, rows % 3, cols], x[:, rows % 3, :, cols], x[-rows - 1].sum(0)


def relative_position_bias(table, index):  # Swin's `table[relative_position_index]`, then its epilogue
    return 16.0 * torch.sigmoid(table[index].view(16, 16, -1).permute(2, 0, 1))


def cumsum_forms(x, m):
    # fairseq's position ids from a padding mask, a row cumsum read back in the same kernel, a float64 one
    positions = torch.cumsum(m.ne(0).int(), dim=1) * m.ne(0).long()
    return positions, torch.cumsum(x * 2.0, -1).sum(-1), torch.cumsum(x.transpose(0, 1), 0, dtype=torch.float64)


CASES = {
    "index_forms": (index_forms, lambda: (torch.randn(4, 3, 6, 6), torch.randint(-4, 4, (2, 3)),
                                          torch.randint(-6, 6, (3,)))),
    "relative_position_bias": (relative_position_bias, lambda: (torch.randn(49, 3), torch.randint(0, 49, (256,)))),
    "cumsum_forms": (cumsum_forms, lambda: (torch.randn(3, 40), torch.randint(0, 3, (2, 9)))),
}
OPS = {"index_forms": "aten::index.Tensor", "relative_position_bias": "aten::index.Tensor",
       "cumsum_forms": "aten::cumsum"}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(CASES))
def test_runs_in_kernels_and_matches_torchscript(name: str, backend: str) -> None:
    fn, draw = CASES[name]
    torch.manual_seed(0)
    model = torch.jit.script(fn)
    converted = convert_for(model, draw(), backend)
    summary = converted.summary()
    assert summary["verification"]["kernels_removed"] == [], converted.report()
    assert summary["fallback_nodes"] == 0 and summary["extern_nodes"] == 0, converted.report()
    assert any(OPS[name] in kernel["ops"] for kernel in summary["kernels"]), converted.report()
    assert_matches_torchscript(converted, model, draw)


def long_cumsum(x):
    return torch.cumsum(x, 1) + 1.0


def gathered(x, i):
    return x[i] + 1.0


def test_a_cumsum_over_a_long_dim_stays_aten() -> None:
    model = torch.jit.script(long_cumsum)
    converted = jit2triton.convert(model, (torch.randn(2, 1000),))
    assert "a cumulative sum over more than" in converted.summary()["fallback_reasons"]["aten::cumsum"]


@pytest.mark.parametrize("bad", [4, -5])
def test_an_index_out_of_range_raises(bad: int) -> None:
    model = torch.jit.script(gathered)
    converted = jit2triton.convert(model, (torch.randn(4, 3), torch.tensor([0, -4, 3])))
    with pytest.raises(Exception, match="index out of range"):
        converted(torch.randn(4, 3), torch.tensor([0, bad, 1]))
