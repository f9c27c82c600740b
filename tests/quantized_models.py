"""Quantized models as users make them, for tests/test_quantized.py and benchmarks/quantized_bench.py:
`quantize_dynamic` over Linear, LSTM and GRU layers, and eager-mode post-training static quantization of a small
conv net (fused conv-bn-relu, a quantized add, pooling, a quantized cat, a linear) with the x86 qconfig."""
from __future__ import annotations

import torch
import torch.ao.quantization as tq
from torch import nn


class MLP(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.up, self.down, self.out = nn.Linear(width, 4 * width), nn.Linear(4 * width, width), nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x))
        h = self.down(h) * 0.5 + x  # pointwise ops between the dynamic-quantized GEMMs fuse into kernels
        return torch.log_softmax(self.out(h), -1)


class Recurrent(nn.Module):
    """A two-layer RNN (nn.LSTM or nn.GRU) and a pointwise head."""

    def __init__(self, cell: type, width: int = 32, **options) -> None:
        super().__init__()
        self.rnn = cell(width, 2 * width, num_layers=2, batch_first=True, **options)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.rnn(x)[0]
        return torch.tanh(y) * 2.0


class ConvNet(nn.Module):
    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.quant, self.dequant = tq.QuantStub(), tq.DeQuantStub()
        self.conv1, self.bn1, self.relu1 = nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU()
        self.conv2, self.bn2, self.relu2 = nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU()
        self.skip, self.join = nn.quantized.FloatFunctional(), nn.quantized.FloatFunctional()
        self.pool, self.gap = nn.MaxPool2d(2), nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2 * channels, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu1(self.bn1(self.conv1(self.quant(x))))
        z = self.relu2(self.bn2(self.conv2(y)))
        z = self.pool(self.skip.add(y, z))
        z = self.gap(self.join.cat([z, z], 1)).flatten(1)
        return torch.softmax(self.dequant(self.fc(z)) * 0.5, -1)


def dynamic_mlp(width: int = 64) -> nn.Module:
    return tq.quantize_dynamic(MLP(width).eval(), {nn.Linear}, dtype=torch.qint8)


def dynamic_rnn(cell: type, width: int = 32, dtype: torch.dtype = torch.qint8, **options) -> nn.Module:
    return tq.quantize_dynamic(Recurrent(cell, width, **options).eval(), {cell}, dtype=dtype)


def static_convnet(channels: int = 16, image: int = 16) -> nn.Module:
    """Post-training static quantization: conv-bn-relu fused, observers calibrated on random images, converted."""
    model = ConvNet(channels).eval()
    model = tq.fuse_modules(model, [["conv1", "bn1", "relu1"], ["conv2", "bn2", "relu2"]])
    model.qconfig = tq.get_default_qconfig("x86")
    prepared = tq.prepare(model)
    with torch.no_grad():
        for _ in range(4):
            prepared(torch.randn(4, 3, image, image))
    return tq.convert(prepared)


class Embeddings(nn.Module):
    def __init__(self, vocab: int = 100, width: int = 16) -> None:
        super().__init__()
        self.embedding, self.bag = nn.Embedding(vocab, width), nn.EmbeddingBag(vocab, width, mode="sum")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.embedding(ids).sum(1) + self.bag(ids))


def quantized_embeddings() -> nn.Module:
    """8-bit embedding tables, as float_qparams_weight_only_qconfig makes them (recommendation models)."""
    model = Embeddings().eval()
    model.embedding.qconfig = model.bag.qconfig = tq.float_qparams_weight_only_qconfig
    return tq.convert(tq.prepare(model))
