"""The torchaudio structures of tests/fallback_models.py, scripted as torchaudio's models are deployed: ConvTasNet's
TCN and wav2vec2's feature extractor, projection, positional convolution and encoder layers."""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _script(model: nn.Module, draw):
    return torch.jit.script(model.eval()), draw


# --- ConvTasNet (torchaudio.models.conv_tasnet): a TCN of PReLU, global layer norm, dilated depthwise conv1d ------

class ConvBlock(nn.Module):
    def __init__(self, io: int, hidden: int, dilation: int, no_residual: bool) -> None:
        super().__init__()
        self.conv_layers = nn.Sequential(
            nn.Conv1d(io, hidden, 1), nn.PReLU(), nn.GroupNorm(1, hidden, eps=1e-08),
            nn.Conv1d(hidden, hidden, 3, padding=dilation, dilation=dilation, groups=hidden), nn.PReLU(),
            nn.GroupNorm(1, hidden, eps=1e-08))
        self.res_out = None if no_residual else nn.Conv1d(hidden, io, 1)
        self.skip_out = nn.Conv1d(hidden, io, 1)

    def forward(self, input: Tensor) -> tuple[Optional[Tensor], Tensor]:
        feature = self.conv_layers(input)
        residual = None if self.res_out is None else self.res_out(feature)
        return residual, self.skip_out(feature)


class ConvTasNet(nn.Module):
    def __init__(self, sources: int = 2, kernel: int = 16, feats: int = 32, hidden: int = 48, layers: int = 3,
                 stacks: int = 2) -> None:
        super().__init__()
        self.sources, self.kernel, self.stride, self.feats = sources, kernel, kernel // 2, feats
        self.encoder = nn.Conv1d(1, feats, kernel, stride=self.stride, padding=self.stride, bias=False)
        self.input_norm = nn.GroupNorm(1, feats, eps=1e-8)
        self.input_conv = nn.Conv1d(feats, 24, 1)
        self.conv_layers = nn.ModuleList([ConvBlock(24, hidden, 2 ** layer, layer == layers - 1 and s == stacks - 1)
                                          for s in range(stacks) for layer in range(layers)])
        self.output_prelu = nn.PReLU()
        self.output_conv = nn.Conv1d(24, feats * sources, 1)
        self.decoder = nn.ConvTranspose1d(feats, 1, kernel, stride=self.stride, padding=self.stride, bias=False)

    def mask(self, input: Tensor) -> Tensor:
        feats = self.input_conv(self.input_norm(input))
        output = 0.0
        for layer in self.conv_layers:
            residual, skip = layer(feats)
            if residual is not None:
                feats = feats + residual
            output = output + skip
        output = torch.sigmoid(self.output_conv(self.output_prelu(output)))
        return output.view(input.shape[0], self.sources, self.feats, -1)

    def align(self, input: Tensor) -> tuple[Tensor, int]:
        batch, channels, frames = input.shape
        odd = self.kernel % 2
        remaining = frames - (odd + (frames - odd) // self.stride * self.stride)
        if remaining == 0:
            return input, 0
        pads = self.stride - remaining
        pad = torch.zeros(batch, channels, pads, dtype=input.dtype, device=input.device)
        return torch.cat([input, pad], 2), pads

    def forward(self, input: Tensor) -> Tensor:
        padded, pads = self.align(input)
        batch, frames = padded.shape[0], padded.shape[2]
        feats = self.encoder(padded)
        masked = self.mask(feats) * feats.unsqueeze(1)
        decoded = self.decoder(masked.view(batch * self.sources, self.feats, -1))
        output = decoded.view(batch, self.sources, frames)
        if pads > 0:
            output = output[..., :-pads]
        return output


def conv_tasnet_scripted():
    return _script(ConvTasNet(), lambda: (torch.randn(2, 1, 203),))


# --- wav2vec2 (torchaudio.models.wav2vec2.components): conv feature extractor, projection, positional conv ----

class ConvLayerBlock(nn.Module):
    def __init__(self, cin: int, cout: int, kernel: int, stride: int, layer_norm: Optional[nn.Module]) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel, stride
        self.layer_norm = layer_norm
        self.conv = nn.Conv1d(cin, cout, kernel, stride=stride, bias=False)

    def forward(self, x: Tensor, length: Optional[Tensor]) -> tuple[Tensor, Optional[Tensor]]:
        x = self.conv(x)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        x = F.gelu(x)
        if length is not None:
            length = torch.div(length - self.kernel_size, self.stride, rounding_mode="floor") + 1
            length = torch.max(torch.zeros_like(length), length)
        return x, length


class PositionalConv(nn.Module):
    def __init__(self, dim: int, kernel: int, groups: int) -> None:
        super().__init__()
        conv = nn.Conv1d(dim, dim, kernel, padding=kernel // 2, groups=groups)
        self.conv = nn.utils.parametrizations.weight_norm(conv, name="weight", dim=2)
        self.num_remove: int = 1 if kernel % 2 == 0 else 0

    def __prepare_scriptable__(self):
        # as torchaudio does: the weight norm is folded into the weight before scripting
        nn.utils.parametrize.remove_parametrizations(self.conv, "weight")
        return self

    def forward(self, x: Tensor) -> Tensor:
        x = self.conv(x.transpose(-2, -1))
        if self.num_remove > 0:
            x = x[..., :-self.num_remove]
        return F.gelu(x).transpose(-2, -1)


class EncoderLayer(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))
        self.layer_norm, self.final_layer_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.intermediate_dense, self.output_dense = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)
        self.dropout = nn.Dropout(0.1)

    def attention(self, x: Tensor) -> Tensor:
        batch, length, dim = x.size()
        shape = (batch, length, self.heads, dim // self.heads)
        q = self.q_proj(x).view(shape).transpose(2, 1)
        k = self.k_proj(x).view(shape).transpose(2, 1)
        v = self.v_proj(x).view(shape).transpose(2, 1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False)
        return self.out_proj(out.transpose(1, 2).reshape(batch, -1, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = self.layer_norm(x + self.dropout(self.attention(x)))
        feed = self.output_dense(self.dropout(F.gelu(self.intermediate_dense(x))))
        return self.final_layer_norm(x + self.dropout(feed))


class Wav2Vec2(nn.Module):
    def __init__(self, channels: int = 32, dim: int = 32) -> None:
        super().__init__()
        shapes = [(10, 5), (3, 2), (2, 2)]
        self.conv_layers = nn.ModuleList([ConvLayerBlock(
            1 if i == 0 else channels, channels, k, s,
            nn.GroupNorm(channels, channels, affine=True) if i == 0 else None) for i, (k, s) in enumerate(shapes)])
        self.projection_norm = nn.LayerNorm(channels)
        self.projection = nn.Linear(channels, dim)
        self.pos_conv = PositionalConv(dim, 8, 4)
        self.layer_norm = nn.LayerNorm(dim)
        self.layers = nn.ModuleList([EncoderLayer(dim, 4) for _ in range(2)])

    def forward(self, waveforms: Tensor, lengths: Optional[Tensor] = None) -> tuple[Tensor, Optional[Tensor]]:
        x = waveforms.unsqueeze(1)
        for layer in self.conv_layers:
            x, lengths = layer(x, lengths)
        x = self.projection(self.projection_norm(x.transpose(1, 2)))
        x = self.layer_norm(x + self.pos_conv(x))
        for layer in self.layers:
            x = layer(x)
        return x, lengths


def wav2vec2_scripted():
    return _script(Wav2Vec2(), lambda: (torch.randn(2, 400),))


def wav2vec2_with_lengths():
    return _script(Wav2Vec2(), lambda: (torch.randn(2, 400), torch.randint(300, 401, (2,))))
