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


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        skip = x if self.downsample is None else self.downsample(x)
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + skip)


class ResNet18(nn.Module):
    """torchvision's resnet18, written out: torchvision's wheels need a CUDA torch, so the CPU machine has none."""

    def __init__(self, classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        widths = [64, 64, 128, 256, 512]
        self.layers = nn.Sequential(*[nn.Sequential(BasicBlock(widths[i], widths[i + 1], 1 if i == 0 else 2),
                                                    BasicBlock(widths[i + 1], widths[i + 1], 1)) for i in range(4)])
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


def resnet18() -> nn.Module:
    """torchvision's resnet18 where torchvision is installed, else the same architecture written out."""
    try:
        import torchvision
        return torchvision.models.resnet18()
    except Exception:  # noqa: BLE001 - not installed, or its wheel does not match this torch
        return ResNet18()


class DenseLayer(nn.Module):
    """torchvision's _DenseLayer: BN-ReLU-conv1x1-BN-ReLU-conv3x3 over the concatenation of every earlier feature."""

    def __init__(self, cin: int, growth: int, bn_size: int = 4) -> None:
        super().__init__()
        self.norm1, self.conv1 = nn.BatchNorm2d(cin), nn.Conv2d(cin, bn_size * growth, 1, bias=False)
        self.norm2 = nn.BatchNorm2d(bn_size * growth)
        self.conv2 = nn.Conv2d(bn_size * growth, growth, 3, padding=1, bias=False)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        x = self.conv1(torch.relu(self.norm1(torch.cat(features, 1))))
        return self.conv2(torch.relu(self.norm2(x)))


class DenseBlock(nn.Module):
    """`layers` dense layers, each reading every feature before it (the list grows by one tensor a layer)."""

    def __init__(self, layers: int, cin: int, growth: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(cin + i * growth, growth) for i in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


class DenseNet(nn.Module):
    """torchvision's DenseNet written out (torchvision is not installable on the CPU machine); `DenseNet()` is
    densenet121: blocks of 6, 12, 24 and 16 layers, growth 32, with transitions that halve channels and size."""

    def __init__(self, blocks: tuple[int, ...] = (6, 12, 24, 16), growth: int = 32, stem: int = 64,
                 classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, stem, 7, 2, 3, bias=False), nn.BatchNorm2d(stem), nn.ReLU(),
                                   nn.MaxPool2d(3, 2, 1)]
        channels = stem
        for i, depth in enumerate(blocks):
            layers.append(DenseBlock(depth, channels, growth))
            channels += depth * growth
            if i != len(blocks) - 1:
                layers += [nn.BatchNorm2d(channels), nn.ReLU(), nn.Conv2d(channels, channels // 2, 1, bias=False),
                           nn.AvgPool2d(2, 2)]
                channels //= 2
        layers.append(nn.BatchNorm2d(channels))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Linear(channels, classes)

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(torch.relu(self.features(x)), 1)
        return self.classifier(torch.flatten(x, 1))


def densenet121() -> nn.Module:
    """torchvision's densenet121 where torchvision is installed, else the same architecture written out."""
    try:
        import torchvision
        return torchvision.models.densenet121()
    except Exception:  # noqa: BLE001 - not installed, or its wheel does not match this torch
        return DenseNet()


def _conv_bn(cin: int, cout: int, kernel: int = 1, stride: int = 1, groups: int = 1) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]


class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, squeezed: int) -> None:
        super().__init__()
        self.reduce, self.expand = nn.Conv2d(channels, squeezed, 1), nn.Conv2d(squeezed, channels, 1)

    def forward(self, x):
        s = torch.nn.functional.adaptive_avg_pool2d(x, 1)
        return x * torch.sigmoid(self.expand(torch.relu(self.reduce(s))))


class EdgeBlock(nn.Module):
    """MobileNetV2/EfficientNet's inverted residual: 1x1 expand, depthwise 3x3 (ReLU6), squeeze-excite, 1x1
    project, residual add."""

    def __init__(self, channels: int, expanded: int) -> None:
        super().__init__()
        self.expand = nn.Sequential(*_conv_bn(channels, expanded), nn.SiLU())
        self.depthwise = nn.Sequential(*_conv_bn(expanded, expanded, 3, groups=expanded), nn.ReLU6())
        self.excite = SqueezeExcite(expanded, expanded // 4)
        self.project = nn.Sequential(*_conv_bn(expanded, channels))

    def forward(self, x):
        return x + self.project(self.excite(self.depthwise(self.expand(x))))


class EdgeConvNet(nn.Module):
    """A conv-BN / depthwise / squeeze-excite net of the kind deployed on edge CPUs (issues #35, #37): 2x3x64x64
    in, a stride-2 stem, two inverted residual blocks, a 1x1 head conv with SiLU and a global average pool."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(*_conv_bn(3, 32, 3, stride=2), nn.ReLU6())
        self.blocks = nn.Sequential(EdgeBlock(32, 64), EdgeBlock(32, 64))
        self.head = nn.Sequential(*_conv_bn(32, 64), nn.SiLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(64, classes))

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)))


def edge_convnet() -> nn.Module:
    """EdgeConvNet with non-trivial BatchNorm statistics, so that a folded BN is really exercised."""
    model = EdgeConvNet()
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        nn.init.uniform_(bn.weight, 0.5, 1.5)
    return model.eval()


class BertOutput(nn.Module):
    """transformers' BertModel (random weights: speed does not depend on them) returning its last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        import transformers
        self.config = transformers.BertConfig(attn_implementation="eager")
        self.bert = transformers.BertModel(self.config)

    def forward(self, input_ids):
        return self.bert(input_ids=input_ids, return_dict=False)[0]


def bert_base(batch: int, seq: int) -> Callable[[str, torch.dtype], tuple[nn.Module, tuple]]:
    def build(dev, dt):
        model = BertOutput().to(dev, dt).eval()
        return model, (torch.randint(0, model.config.vocab_size, (batch, seq), device=dev),)
    return build


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
    "resnet18 1x224": Workload("resnet18 1x224", lambda dev, dt: (
        resnet18().to(dev, dt).eval(), (_randn(1, 3, 224, 224, device=dev, dtype=dt),))),
    "BERT base 1x9": Workload("BERT base 1x9", bert_base(1, 9)),
}
