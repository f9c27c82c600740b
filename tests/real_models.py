"""Models built the way deployed TorchScript models are: transformers architectures from small configs with random
weights (no downloads), and the conv-net, mixer, dense-block and detection-head patterns real vision models use.

Each entry: name -> () -> (TorchScript model, a function drawing one call's inputs). Shapes stay small so the whole
set converts in seconds on a CPU.
"""
from __future__ import annotations

import warnings
from typing import Callable

import torch
from torch import nn

Build = Callable[[], tuple[torch.jit.ScriptModule, Callable[[], tuple]]]


def _trace(model: nn.Module, make_inputs: Callable[[], tuple]):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(model.eval(), make_inputs(), strict=False, check_trace=False), make_inputs


def _token_inputs(vocab: int, batch: int = 2, seq: int = 7, mask: bool = True) -> Callable[[], tuple]:
    def draw():
        ids = torch.randint(0, vocab, (batch, seq))
        if not mask:
            return (ids,)
        attention = torch.ones(batch, seq, dtype=torch.long)
        attention[0, seq - 2:] = 0  # padding in the first sequence
        return ids, attention
    return draw


class _KeywordInputs(nn.Module):
    """Calls a transformers model with `input_ids` and `attention_mask` by name, as serving code does."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def _transformers():
    import transformers
    return transformers


SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
             hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)


def bert():
    t = _transformers()
    config = t.BertConfig(vocab_size=120, max_position_embeddings=32, torchscript=True, **SMALL)
    return _trace(t.BertModel(config), _token_inputs(120))


def gpt2():
    t = _transformers()
    config = t.GPT2Config(vocab_size=120, n_positions=32, n_embd=32, n_layer=2, n_head=4, resid_pdrop=0.0,
                          embd_pdrop=0.0, attn_pdrop=0.0, torchscript=True, use_cache=False)
    return _trace(_KeywordInputs(t.GPT2LMHeadModel(config)), _token_inputs(120))


def bart():
    t = _transformers()
    config = t.BartConfig(vocab_size=120, max_position_embeddings=32, d_model=32, encoder_layers=1,
                          decoder_layers=1, encoder_attention_heads=4, decoder_attention_heads=4,
                          encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.0, attention_dropout=0.0,
                          activation_dropout=0.0, torchscript=True, use_cache=False)
    return _trace(t.BartModel(config), _token_inputs(120))


def vit():
    t = _transformers()
    config = t.ViTConfig(image_size=16, patch_size=4, num_channels=3, torchscript=True, **SMALL)
    return _trace(t.ViTModel(config, add_pooling_layer=True), lambda: (torch.randn(2, 3, 16, 16),))


def convnext():
    t = _transformers()
    config = t.ConvNextConfig(num_channels=3, hidden_sizes=[8, 16], depths=[1, 1], num_stages=2, image_size=32,
                              torchscript=True)
    return _trace(t.ConvNextModel(config), lambda: (torch.randn(2, 3, 32, 32),))


class GroupedDilatedNet(nn.Module):
    """ResNeXt-style grouped convs, a dilated conv, depthwise 3x3, BatchNorm, residuals, global pooling."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU())
        self.grouped = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1, groups=4), nn.BatchNorm2d(16), nn.ReLU6())
        self.dilated = nn.Conv2d(16, 16, 3, padding=2, dilation=2)
        self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = self.stem(x)
        x = x + self.grouped(x)
        x = torch.nn.functional.hardswish(self.dilated(x)) + self.depthwise(x)
        return self.head(x.mean((2, 3)))


class MixerBlock(nn.Module):
    """MLP-Mixer: a token-mixing MLP over transposed patches, LayerNorm over channels, a patch-embedding conv."""

    def __init__(self, channels: int = 16, tokens: int = 16) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, channels, 4, stride=4)
        self.norm1, self.norm2 = nn.LayerNorm(channels), nn.LayerNorm(channels)
        self.token_mlp = nn.Sequential(nn.Linear(tokens, 32), nn.GELU(), nn.Linear(32, tokens))
        self.channel_mlp = nn.Sequential(nn.Linear(channels, 32), nn.GELU(), nn.Linear(32, channels))
        self.head = nn.Linear(channels, 4)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = x + self.token_mlp(self.norm1(x).transpose(1, 2)).transpose(1, 2)
        x = x + self.channel_mlp(self.norm2(x))
        return self.head(x.mean(1))


class DenseBlock(nn.Module):
    """DenseNet: each layer reads the concatenation of every earlier feature map."""

    def __init__(self, layers: int = 5, growth: int = 4) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(8 + i * growth), nn.ReLU(), nn.Conv2d(8 + i * growth, growth, 3, padding=1))
            for i in range(layers))

    def forward(self, x):
        features = [x]
        for layer in self.layers:
            features.append(layer(torch.cat(features, 1)))
        return torch.nn.functional.avg_pool2d(torch.cat(features, 1), 2)


class DetectionHead(nn.Module):
    """An SSD/RetinaNet-style head: per-level conv predictions reshaped with view/permute and concatenated."""

    def __init__(self, anchors: int = 3, classes: int = 4) -> None:
        super().__init__()
        self.anchors, self.classes = anchors, classes
        self.cls = nn.ModuleList(nn.Conv2d(8, anchors * classes, 3, padding=1) for _ in range(2))
        self.box = nn.ModuleList(nn.Conv2d(8, anchors * 4, 3, padding=1) for _ in range(2))

    def forward(self, p3, p4):
        scores, boxes = [], []
        for level, feature in enumerate((p3, p4)):
            n, _, h, w = feature.shape
            c = self.cls[level](feature).view(n, self.anchors, self.classes, h, w).permute(0, 3, 4, 1, 2)
            scores.append(c.reshape(n, -1, self.classes))
            b = self.box[level](feature).view(n, self.anchors, 4, h, w).permute(0, 3, 4, 1, 2)
            boxes.append(b.reshape(n, -1, 4))
        return torch.cat(scores, 1).sigmoid(), torch.cat(boxes, 1)


def _with_trained_batchnorm(model: nn.Module) -> nn.Module:
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            m.weight.data.uniform_(0.5, 1.5)
    return model


REAL_MODELS: dict[str, Build] = {
    "bert": bert,
    "gpt2": gpt2,
    "bart": bart,
    "vit": vit,
    "convnext": convnext,
    "grouped_dilated_convnet": lambda: _trace(_with_trained_batchnorm(GroupedDilatedNet()),
                                              lambda: (torch.randn(2, 3, 16, 16),)),
    "mlp_mixer": lambda: _trace(MixerBlock(), lambda: (torch.randn(2, 3, 16, 16),)),
    "dense_block": lambda: _trace(_with_trained_batchnorm(DenseBlock()), lambda: (torch.randn(2, 8, 8, 8),)),
    "detection_head": lambda: _trace(DetectionHead(), lambda: (torch.randn(2, 8, 8, 8), torch.randn(2, 8, 4, 4))),
}
TRANSFORMERS_MODELS = {"bert", "gpt2", "bart", "vit", "convnext"}
