"""nn.MultiheadAttention's inference fast path (`aten::_native_multi_head_attention`) is written out as two linears
and scaled_dot_product_attention (transpiler/decompose_mha.py), so its GEMMs take the GEMM rewrites and the ops
around it fuse; calls it does not cover stay as they are. Every package is checked against TorchScript on fresh
inputs,."""
import pytest
import torch

import jit2triton
from helpers import assert_same

MHA = "aten::_native_multi_head_attention"


class Block(torch.nn.Module):
    """A pre-norm encoder block as torchvision's ViT writes it."""

    def __init__(self, dim=64, heads=4, mode="self"):
        super().__init__()
        self.norm = torch.nn.LayerNorm(dim)
        self.attn = torch.nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mode = mode

    def forward(self, x):
        y = self.norm(x)
        if self.mode == "weights":  # the attention weights are read: stays
            out, weights = self.attn(y, y, y, need_weights=True)
            return x + out, weights
        if self.mode == "mask":  # a key padding mask: stays
            pad = torch.zeros(x.shape[0], x.shape[1], dtype=torch.bool)
            pad[:, -1] = True
            out = self.attn(y, y, y, key_padding_mask=pad, need_weights=False)[0]
            return x + out
        return x + self.attn(y, y, y, need_weights=False)[0]


def _convert(mode, shape=(2, 7, 64)):
    torch.manual_seed(0)
    model = Block(mode=mode).eval()
    with torch.no_grad():
        traced = torch.jit.trace(model, torch.randn(*shape))
    assert MHA in str(traced.inlined_graph), "the fast path did not trace as the fused op: the test needs it"
    return traced, jit2triton.convert(traced, (torch.randn(*shape),))


def _check(traced, converted, tmp_path, shape=(2, 7, 64)):
    path = tmp_path / "m.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(2):
        x = torch.randn(*shape)
        with torch.no_grad():
            assert_same(loaded(x), traced(x), f"call {call}", {torch.float32: (1e-5, 1e-5)})


def test_self_attention_is_written_out_and_matches_torchscript(tmp_path):
    traced, converted = _convert("self")
    ops = [e["op"] for e in converted.manifest["nodes"]]
    assert MHA not in ops and "aten::scaled_dot_product_attention" in ops, ops
    assert converted.summary()["fallback_nodes"] == 0, converted.summary()["fallback_reasons"]
    _check(traced, converted, tmp_path)


@pytest.mark.parametrize("mode", ["weights", "mask"])
def test_calls_it_does_not_cover_stay_as_they_are(mode, tmp_path):
    traced, converted = _convert(mode)
    ops = [e["op"] for e in converted.manifest["nodes"]]
    assert MHA in ops, ops
    _check(traced, converted, tmp_path)


def test_the_written_out_attention_serves_other_batch_and_sequence_sizes(tmp_path):
    torch.manual_seed(0)
    model = Block().eval()
    with torch.no_grad():
        traced = torch.jit.trace(model, torch.randn(2, 7, 64))
    dims = {"x": {0: jit2triton.Dim("batch", min=1, max=8), 1: jit2triton.Dim("seq", min=2, max=32)}}
    converted = jit2triton.convert(traced, (torch.randn(2, 7, 64),), dynamic_shapes=dims)
    assert MHA not in [e["op"] for e in converted.manifest["nodes"]]
    for shape in ((1, 3, 64), (5, 19, 64), (8, 32, 64)):
        _check(traced, converted, tmp_path, shape)
