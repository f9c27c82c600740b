"""`jit2triton demo`: a bundled model, traced, converted, saved, loaded and checked against TorchScript."""
from __future__ import annotations

import os
import tempfile
import time
from typing import Callable, Optional

import torch
from torch import nn


class ConvBlock(nn.Module):
    """conv-BN-ReLU, a depthwise conv and squeeze-excite: the shape of a mobile CNN stage."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.depthwise = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, groups=channels),
                                       nn.BatchNorm2d(channels), nn.Hardswish())
        self.squeeze = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(channels, 4, 1), nn.ReLU(),
                                     nn.Conv2d(4, channels, 1), nn.Sigmoid())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.depthwise(self.stem(x))
        return y * self.squeeze(y)


class AttentionBlock(nn.Module):
    """Pre-norm multi-head self-attention and a GELU MLP, each with a residual."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        attention = torch.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5, dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.norm2(x))


class DemoModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = ConvBlock(16)
        self.attention = AttentionBlock(16, 4)
        self.head = nn.Linear(16, 10)

    def forward(self, image: torch.Tensor):
        features = self.conv(image)  # [b, 16, h, w]
        tokens = features.flatten(2).transpose(1, 2)  # [b, h*w, 16]
        tokens = self.attention(tokens)
        return self.head(tokens.mean(1)), tokens


def build_demo_model(seed: int = 0) -> tuple[torch.jit.ScriptModule, torch.Tensor]:
    torch.manual_seed(seed)
    model = DemoModel()
    with torch.no_grad():  # non-trivial BN statistics, so folding conv+BN is really exercised
        for module in model.modules():
            if isinstance(module, nn.BatchNorm2d):
                module.running_mean.uniform_(-0.5, 0.5)
                module.running_var.uniform_(0.5, 1.5)
    model.eval()
    example = torch.randn(2, 3, 8, 8)
    return torch.jit.trace(model, example), example


def run_demo(device: str = "cpu", keep: Optional[str] = None, echo: Callable[[str], None] = print,
             progress: Optional[Callable[[str], None]] = None) -> float:
    """Returns the max abs error against TorchScript; raises if it is out of tolerance."""
    from .api import convert, load
    from .compare import max_abs_error

    traced, example = build_demo_model()
    echo("demo: a CNN block (conv-BN-ReLU, depthwise, squeeze-excite) and an attention block, traced")
    converted = convert(traced, example_inputs=(example,), device=device, progress=progress)
    with tempfile.TemporaryDirectory() as folder:
        path = keep or os.path.join(folder, "demo.j2t")
        converted.save(path)
        start = time.perf_counter()
        loaded = load(path)
        load_ms = (time.perf_counter() - start) * 1e3
        echo(f"saved and loaded {os.path.basename(path)} ({os.path.getsize(path) / 1e3:.1f} kB) in {load_ms:.1f} ms")
    fresh = torch.randn(2, 3, 8, 8, device=device)
    traced = traced.to(device)
    error = max_abs_error(loaded(fresh), traced(fresh))
    echo(loaded.report())
    echo(f"max abs error against TorchScript on fresh inputs: {error:.2e}")
    if not error < 1e-4:
        raise AssertionError(f"demo output differs from TorchScript by {error:.2e}")
    echo("demo OK")
    return error
