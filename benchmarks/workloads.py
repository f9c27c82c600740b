"""The benchmark workloads, shared by the CPU and GPU benchmarks: each builds a model and its inputs."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass
class Workload:
    name: str
    build: Callable[[str, torch.dtype], tuple[nn.Module, tuple]]  # (device, dtype) -> (eager model, inputs)


class SinCos(nn.Module):
    def forward(self, x):
        return torch.sin(x) ** 2 + torch.cos(x) ** 2


class SinPlusCos(nn.Module):
    def forward(self, x):
        return torch.sin(x) + torch.cos(x)


class NumpyFn(nn.Module):
    """The seed's numpy function, written in torch."""

    def forward(self, a, b):
        m = a.mean(0)
        s = a.std(0)
        z = (a - m) / (s + 1e-5)
        w = torch.where(z > 0, z, 0.1 * z)
        outer = (w[:, :, None] * b[:, None, :]).sum(dim=(1, 2))
        c = torch.clamp(outer, -10, 10)
        return torch.exp(c / 10) + b.sum()


class MLPBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up, self.down, self.norm = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim), nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(x + self.down(torch.nn.functional.gelu(self.up(x))))


class Attention(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads, self.qkv, self.out = heads, nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(d // self.heads), dim=-1)
        return self.out((weights @ v).transpose(1, 2).reshape(b, n, d))


class EncoderLayer(nn.Module):
    """A BERT-style post-norm encoder layer with an additive attention mask."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.attention = Attention(dim, heads)
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.up, self.down = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        x = self.norm1(x + self.attention(x))
        return self.norm2(x + self.down(torch.nn.functional.gelu(self.up(x))))


def _randn(*shape, device, dtype):
    return torch.randn(*shape, device=device, dtype=dtype)


WORKLOADS = {
    "sin+cos 0-d": Workload("sin+cos 0-d", lambda dev, dt: (SinPlusCos(), (torch.randn((), device=dev),))),
    "sin2+cos2 16M": Workload("sin2+cos2 16M", lambda dev, dt: (SinCos(), (_randn(1 << 24, device=dev, dtype=torch.float32),))),
    "numpy_fn 1024x640": Workload("numpy_fn 1024x640", lambda dev, dt: (
        NumpyFn(), (_randn(1024, 640, device=dev, dtype=torch.float32), _randn(1024, 640, device=dev, dtype=torch.float32)))),
    "MLP+LayerNorm 8x512x1024": Workload("MLP+LayerNorm 8x512x1024", lambda dev, dt: (
        MLPBlock(1024).to(dev, dt), (_randn(8, 512, 1024, device=dev, dtype=dt),))),
    "attention 8x256x768": Workload("attention 8x256x768", lambda dev, dt: (
        Attention(768, 12).to(dev, dt), (_randn(8, 256, 768, device=dev, dtype=dt),))),
    "BERT-like layer 8x128x768": Workload("BERT-like layer 8x128x768", lambda dev, dt: (
        EncoderLayer(768, 12).to(dev, dt), (_randn(8, 128, 768, device=dev, dtype=dt),))),
}
