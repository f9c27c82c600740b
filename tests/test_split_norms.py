"""Norms over few rows of huge extent are computed in parallel pieces on CUDA (transpiler/split_norms.py): forced
here on the CPU backends (`MODE = "always"`) and checked against TorchScript on fresh inputs."""
import pytest
import torch

from jit2triton.transpiler import split_norms
from helpers import BACKENDS, assert_matches_torchscript, convert_for


class GlobalNorms(torch.nn.Module):
    """ConvTasNet's global layer norm (GroupNorm with one group) with PReLU, a grouped norm, and a layer norm over
    two trailing dims, each over rows of 32K-64K values."""

    def __init__(self) -> None:
        super().__init__()
        self.glob = torch.nn.GroupNorm(1, 64)
        self.grouped = torch.nn.GroupNorm(2, 64, affine=False)
        self.layer = torch.nn.LayerNorm([64, 1024])
        self.act = torch.nn.PReLU()
        with torch.no_grad():  # affine parameters that are not 1 and 0, so that a dropped one shows
            for p in list(self.glob.parameters()) + list(self.layer.parameters()):
                p.add_(torch.randn_like(p) * 0.5)

    def forward(self, x):
        y = self.act(self.glob(x)) + x
        return self.layer(self.grouped(y) * 2.0), y.sum()


def _draw():
    return (torch.randn(2, 64, 1024) * 3 + 1.5,)  # a mean far from 0: a one-pass variance would lose digits


@pytest.mark.parametrize("backend", BACKENDS)
def test_split_norms_match_torchscript(backend, monkeypatch):
    monkeypatch.setattr(split_norms, "MODE", "always")
    model = torch.jit.trace(GlobalNorms().eval(), _draw())
    converted = convert_for(model, _draw(), backend)
    assert_matches_torchscript(converted, model, _draw)
    kernels = [e for e in converted.manifest["nodes"] if e["category"] == "kernel"]
    partial_sums = [k for k in kernels if [f["op"] for f in k["fused"]][-1:] == ["aten::sum.dim_IntList"]]
    assert len(partial_sums) == 6, [k["kernel"] for k in kernels]  # two passes over each of the three norms


def test_only_few_long_rows_are_split(monkeypatch):
    monkeypatch.setattr(split_norms, "MODE", "always")

    class Short(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.GroupNorm(8, 64)

        def forward(self, x):
            return self.norm(x)
    x = torch.randn(2, 64, 64)  # 16 rows of 512: a kernel per row is fine
    model = torch.jit.trace(Short().eval(), (x,))
    converted = convert_for(model, (x,), "cpp")
    kernels = [e for e in converted.manifest["nodes"] if e["category"] == "kernel"]
    # no partial sums: the norm's kernels (its statistics stored once per group: test_repeated_reductions.py)
    assert kernels and all([f["op"] for f in k["fused"]] == ["aten::group_norm"] for k in kernels)
