"""A speech encoder's padding mask made from a `lengths` input (torchaudio's Conformer does this) and given to
MultiheadAttention converts and matches TorchScript on fresh inputs whose lengths are drawn valid (issue 44). MultiheadAttention checks `key_padding_mask.dtype != torch.bool`: a dtype compared with the
constant 11, which the Python runtime's prim::dtype (torch's dtype object) never equalled, so the check raised on the
model's own bool mask (found converting the Conformer on the GPU machine)."""
import torch

import jit2triton


class MaskedEncoder(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(16, 2)
        self.out = torch.nn.Linear(16, 16)

    def forward(self, input: torch.Tensor, lengths: torch.Tensor):
        longest = int(torch.max(lengths).item())
        mask = torch.arange(longest, dtype=lengths.dtype).expand(lengths.shape[0], longest) >= lengths.unsqueeze(1)
        x = input.transpose(0, 1)
        x, _ = self.attn(query=x, key=x, value=x, key_padding_mask=mask, need_weights=False)
        return self.out(x.transpose(0, 1)), lengths


def _draw(batch: int, frames: int, generator: torch.Generator):
    lengths = torch.randint(1, frames + 1, (batch,), generator=generator)
    lengths[0] = frames  # the padded axis is as long as the longest
    return torch.randn(batch, frames, 16, generator=generator), lengths


def test_a_mask_from_lengths_passes_multihead_attention_s_check_and_matches():
    """Through ATen (the check is a host op, the same for every backend), verified in the runtime; dims on batch
    and time are tests/gpu_conformer.py's (the Conformer itself, on the GPU machine)."""
    torch.manual_seed(0)
    scripted = torch.jit.script(MaskedEncoder().eval())
    generator = torch.Generator().manual_seed(0)
    converted = jit2triton.convert(scripted, _draw(3, 12, generator), backend="aten", choices="fixed")
    verification = converted.summary()["verification"]
    assert verification["status"] == "passed" and verification["runtime"] == "cpp", verification
    for _ in range(3):
        x, lengths = _draw(3, 12, generator)
        got, expected = converted(x, lengths), scripted(x, lengths)
        torch.testing.assert_close(got[0], expected[0], rtol=1e-4, atol=1e-5)
        assert torch.equal(got[1], expected[1])
