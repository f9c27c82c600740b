"""A zoo of small TorchScript models for the end-to-end tests in `test_models.py`.

Each `ModelSpec` says how to build the TorchScript model with its example inputs, how to make fresh inputs of the
same signature, and how close the package's outputs must come to TorchScript's. Adding a model is one entry in
`MODELS`. Shapes stay small: the whole zoo converts and runs in seconds on a laptop CPU.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, List

import torch
from torch import Tensor, nn

Inputs = tuple  # the positional arguments of one call


@dataclass(frozen=True)
class ModelSpec:
    name: str
    build: Callable[[], tuple[Any, Inputs]]  # -> (ScriptModule or ScriptFunction, example inputs)
    fresh_inputs: Callable[[], list[Inputs]]  # one or more calls on new random data, same signature as the example
    rtol: float = 1.3e-6  # for floating outputs; integer and bool outputs must match exactly
    atol: float = 1e-5
    from_file: bool = False  # convert from a torch.jit.save'd .pt path, as a user holding only the file does
    generates_kernels: bool = True  # false for a model made only of extern ops and views: nothing to fuse


def randn(*shape: int) -> Callable[[], Tensor]:
    return lambda: torch.randn(shape)


# ---- 1, 2: pointwise on a 0-d tensor and on a long vector

def sin_plus_cos(x):
    return torch.sin(x) + torch.cos(x)


def pythagorean_identity(x):
    return torch.sin(x) ** 2 + torch.cos(x) ** 2


# ---- 3: a numpy-style function written in torch

def numpy_fn(a, b):
    m = a.mean(0)
    s = a.std(0)
    z = (a - m) / (s + 1e-5)
    w = torch.where(z > 0, z, 0.1 * z)
    outer = (w[:, :, None] * b[:, None, :]).sum(dim=(1, 2))  # the outer product of rows, summed
    c = torch.clamp(outer, -10, 10)
    return torch.exp(c / 10) + b.sum()


# ---- 4, 5, 7: transformer pieces

class ResidualMLP(nn.Module):
    def __init__(self, dim: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x):
        return self.norm(x + self.fc2(nn.functional.gelu(self.fc1(x))))


class SelfAttention(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.head_dim = dim // heads
        self.scale = 1.0 / math.sqrt(self.head_dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)

    def scores(self, x):
        batch, tokens, dim = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(batch, tokens, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        return q @ k.transpose(-2, -1) * self.scale, v

    def merge(self, attention, v):
        batch, heads, tokens, head_dim = v.shape
        mixed = (attention @ v).transpose(1, 2).reshape(batch, tokens, heads * head_dim)
        return self.out(mixed)

    def forward(self, x):
        scores, v = self.scores(x)
        return self.merge(scores.softmax(dim=-1), v)


class EncoderLayer(nn.Module):
    """BERT's post-LayerNorm encoder layer; `keep` marks the real tokens (False = padding, never attended to)."""

    def __init__(self, dim: int = 32, heads: int = 4, hidden: int = 64) -> None:
        super().__init__()
        self.attention = SelfAttention(dim, heads)
        self.norm1 = nn.LayerNorm(dim)
        self.ffn = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.norm2 = nn.LayerNorm(dim)

    def forward(self, x, keep):
        scores, v = self.attention.scores(x)
        scores = scores.masked_fill(~keep[:, None, None, :], torch.finfo(scores.dtype).min)
        x = self.norm1(x + self.attention.merge(scores.softmax(dim=-1), v))
        return self.norm2(x + self.ffn(x))


def padding_mask(batch: int = 2, tokens: int = 8) -> Tensor:
    """True for real tokens: each sequence keeps a random length of at least one token, the rest is padding."""
    lengths = torch.randint(1, tokens + 1, (batch, 1))
    return torch.arange(tokens)[None, :] < lengths


# ---- 6: a small CNN

class SqueezeExcite(nn.Module):
    def __init__(self, channels: int, reduction: int = 4) -> None:
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.reduce = nn.Conv2d(channels, channels // reduction, 1)
        self.expand = nn.Conv2d(channels // reduction, channels, 1)

    def forward(self, x):
        s = torch.relu(self.reduce(self.pool(x)))
        return x * torch.sigmoid(self.expand(s))


class SmallCNN(nn.Module):
    def __init__(self, channels: int = 16, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, channels, 3, padding=1), nn.BatchNorm2d(channels), nn.ReLU())
        self.depthwise = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, groups=channels),
                                       nn.BatchNorm2d(channels), nn.ReLU())
        self.excite = SqueezeExcite(channels)
        self.pool = nn.MaxPool2d(2)
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, classes))

    def forward(self, x):
        return self.head(self.pool(self.excite(self.depthwise(self.stem(x)))))


def with_trained_batchnorm(model: nn.Module) -> nn.Module:
    """Non-trivial BN statistics and affine parameters, so that folding BN into the conv is really tested."""
    for bn in (m for m in model.modules() if isinstance(m, nn.BatchNorm2d)):
        bn.running_mean.uniform_(-0.5, 0.5)
        bn.running_var.uniform_(0.5, 2.0)
        nn.init.uniform_(bn.weight, 0.5, 1.5)
        nn.init.uniform_(bn.bias, -0.2, 0.2)
    return model.eval()


# ---- 8, 9: scripted control flow and default arguments

class LoopBranch(nn.Module):
    """Applies a Linear `n` times; each step takes one of two branches on the sign of its result's sum."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.linear = nn.Linear(dim, dim)

    def forward(self, x: Tensor, n: int) -> Tensor:
        steps: List[Tensor] = [x]
        y = x
        for _ in range(n):
            y = self.linear(y) + x  # the residual keeps the sign of a strongly signed x, so tests choose the branch
            if bool(y.sum() > 0):
                y = torch.tanh(y) * 2.0
            else:
                y = torch.sigmoid(y) - y.abs()
            steps.append(y)
        return torch.stack(steps)


def signed(sign: float) -> Tensor:
    """A strongly signed input, which steers `LoopBranch` into the branch of that sign (checked for the test seed)."""
    return sign * (4.0 * torch.rand(4, 16) + 1.0)


def loop_branch_calls() -> list[Inputs]:
    return [(torch.randn(4, 16), 0), (signed(1), 1), (signed(-1), 1), (signed(1), 3), (signed(-1), 4),
            (torch.randn(4, 16), 5)]


@torch.jit.script
def scaled_softplus(x: Tensor, scale: float = 2.0) -> Tensor:
    return nn.functional.softplus(x * scale) / scale


# ---- 10: structured outputs

def tuple_outputs(x, y):
    s = x + y
    return s, (x * y, torch.relu(s - 1.0))


def dict_outputs(x, y):
    return {"sum": x + y, "max": torch.maximum(x, y), "sin_x": torch.sin(x)}


def list_outputs(x, y):
    return [x - y, torch.cos(y)]


# ---- 11: in-place ops

def inplace_ops(x, y):
    a = x.clone()
    a.add_(y)
    a.mul_(0.5)
    a[0].mul_(-2.0)  # in place through a view: the write must reach `a`
    b = torch.sin(a)
    b.clamp_(-0.5, 0.5)
    b.add_(1.0)
    c = b * y
    c.mul_(c)
    return a, c


# ---- 12: integer and boolean inputs and outputs

class LookupTopK(nn.Module):
    def __init__(self, vocab: int = 50, dim: int = 16) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)

    def forward(self, ids, index, mask):
        e = self.embedding(ids)
        picked = torch.gather(e, 2, index)
        scores = e.sum(-1).masked_fill(mask, -1e4)
        values, indices = scores.topk(3, dim=-1)
        return values, indices, picked, ids > 25


def lookup_inputs() -> Inputs:
    ids = torch.randint(0, 50, (2, 10))
    index = torch.randint(0, 16, (2, 10, 4))
    mask = torch.rand(2, 10) < 0.4
    mask[:, :3] = False  # at least three unmasked scores per row, so top-3 has no ties among the fill value
    return ids, index, mask


# ---- 13: a recurrent model

class TwoLayerLSTM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True)

    def forward(self, x):
        out, (h, c) = self.lstm(x)
        return out, (h, c)


# ---- 14: joining tensors

def cat_stack_pointwise(x, y, z):
    """cat (of a pointwise result and a transposed input) and stack, feeding pointwise math: one kernel."""
    joined = torch.cat([torch.tanh(x), y.t()], dim=-1)
    return torch.relu(torch.stack([joined, z], dim=-1)) * 2.0 - torch.sigmoid(z).unsqueeze(-1)


# ---- 15: a recurrent decoder: a loop whose body is long straight-line GPU work (a CUDA graph region on the GPU)

class RecurrentDecoder(nn.Module):
    """Two stacked recurrent cells and an output projection per step."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.cell1, self.cell2 = nn.Linear(2 * dim, dim), nn.Linear(2 * dim, dim)
        self.norm1, self.norm2, self.out = nn.LayerNorm(dim), nn.LayerNorm(dim), nn.Linear(dim, dim)

    def forward(self, x: Tensor, steps: int) -> Tensor:
        h = torch.zeros_like(x[:, 0])
        g = torch.zeros_like(h)
        outs: List[Tensor] = []
        for t in range(steps):
            inp = x[:, t % x.size(1)]  # the loop counter picks a view: it stays outside the graph
            h = self.norm1(torch.tanh(self.cell1(torch.cat([inp, h], 1))) + inp)
            g = self.norm2(torch.tanh(self.cell2(torch.cat([h, g], 1))) + h)
            outs.append(torch.relu(self.out(g)) * 0.5 + g)
        return torch.stack(outs, 1)


def decoder_calls() -> list[Inputs]:
    return [(torch.randn(3, 5, 16), 2), (torch.randn(3, 5, 16), 7), (torch.randn(3, 5, 16), 7),
            (torch.randn(3, 5, 16), 1)]


# ---- builders

class AttentionThenPointwise(nn.Module):
    """Softmax attention whose transposed output feeds pointwise math directly (as BERT's does): the fused
    attention's output has its own strides, which the kernel reading it must respect."""

    def __init__(self, dim: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.qkv = heads, nn.Linear(dim, 3 * dim)

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(b, n, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        weights = torch.softmax(q @ k.transpose(2, 3) * 0.25, dim=-1)
        out = (weights @ v).transpose(1, 2).contiguous().reshape(b, n, d)
        return torch.tanh(out) * 2 + x


def channels_last_cnn() -> nn.Module:
    """Convolutions in channels-last memory format: weights and activations with permuted strides."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, groups=2), nn.GELU())
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.5, 0.5)
        model[1].running_var.uniform_(0.5, 1.5)
    return model.eval().to(memory_format=torch.channels_last)


def traced(make_model: Callable[[], Any], make_inputs: Callable[[], Inputs],
           strict: bool = True) -> Callable[[], tuple[Any, Inputs]]:
    """Build the model and its example inputs when the test runs, under the test's seed."""
    def build():
        model, example = make_model(), make_inputs()
        if isinstance(model, nn.Module):
            model = model.eval()
        return torch.jit.trace(model, example, strict=strict), example
    return build


def scripted(make_model: Callable[[], Any], make_inputs: Callable[[], Inputs]) -> Callable[[], tuple[Any, Inputs]]:
    def build():
        model = make_model()
        if isinstance(model, nn.Module):
            model = torch.jit.script(model.eval())
        return model, make_inputs()
    return build


def args(*make: Callable[[], Any]) -> Callable[[], Inputs]:
    """The inputs of one call: one maker per argument."""
    return lambda: tuple(m() for m in make)


def one_call(make_inputs: Callable[[], Inputs]) -> Callable[[], list[Inputs]]:
    return lambda: [make_inputs()]


X_0D = args(randn())
X_100K = args(randn(100_000))
A_B = args(randn(64, 40), randn(64, 40))
TOKENS = args(randn(2, 8, 32))
IMAGES = args(randn(2, 3, 16, 16))
TOKENS_KEEP = args(randn(2, 8, 32), padding_mask)
PAIR = args(randn(3, 5), randn(3, 5))
PAIR_4X6 = args(randn(4, 6), randn(4, 6))
SEQUENCE = args(randn(2, 7, 16))
JOIN = args(randn(4, 6), randn(5, 4), randn(4, 11))

MODELS: list[ModelSpec] = [
    ModelSpec("sin_plus_cos_0d", traced(lambda: sin_plus_cos, X_0D), one_call(X_0D)),
    ModelSpec("pythagorean_identity_100k", traced(lambda: pythagorean_identity, X_100K), one_call(X_100K)),
    ModelSpec("numpy_fn", traced(lambda: numpy_fn, A_B), one_call(A_B), rtol=1e-5, atol=1e-5),
    ModelSpec("attention_then_pointwise", traced(AttentionThenPointwise, TOKENS), one_call(TOKENS), rtol=1e-5,
              atol=1e-5),
    ModelSpec("channels_last_cnn", traced(channels_last_cnn, IMAGES), one_call(IMAGES), rtol=1e-5, atol=1e-5),
    ModelSpec("residual_mlp_layernorm", traced(ResidualMLP, TOKENS), one_call(TOKENS)),
    ModelSpec("softmax_attention", traced(SelfAttention, TOKENS), one_call(TOKENS), generates_kernels=False),
    # freezing folds BN into the conv weights, which reassociates the arithmetic: a looser tolerance
    ModelSpec("small_cnn_bn_se", traced(lambda: with_trained_batchnorm(SmallCNN()), IMAGES), one_call(IMAGES),
              rtol=1e-5, atol=1e-5),
    ModelSpec("bert_encoder_layer", traced(EncoderLayer, TOKENS_KEEP), one_call(TOKENS_KEEP), rtol=1e-5, atol=1e-5),
    ModelSpec("scripted_loop_branch", scripted(LoopBranch, args(randn(4, 16), lambda: 2)), loop_branch_calls),
    ModelSpec("scripted_function_default_arg", scripted(lambda: scaled_softplus, args(randn(5, 7))),
              lambda: [(torch.randn(5, 7),), (torch.randn(5, 7), 3.0)]),
    ModelSpec("tuple_outputs", traced(lambda: tuple_outputs, PAIR), one_call(PAIR)),
    ModelSpec("dict_outputs", traced(lambda: dict_outputs, PAIR, strict=False), one_call(PAIR)),
    ModelSpec("list_outputs", traced(lambda: list_outputs, PAIR, strict=False), one_call(PAIR)),
    ModelSpec("inplace_ops", traced(lambda: inplace_ops, PAIR_4X6), one_call(PAIR_4X6)),
    ModelSpec("int_bool_inputs_embedding_gather_topk", traced(LookupTopK, lookup_inputs), one_call(lookup_inputs)),
    # the LSTM itself runs through ATen; its zero initial states are generated fills
    ModelSpec("lstm_two_layers", traced(TwoLayerLSTM, SEQUENCE), one_call(SEQUENCE), rtol=1e-5, atol=1e-5),
    ModelSpec("cat_stack_pointwise", scripted(lambda: torch.jit.script(cat_stack_pointwise), JOIN), one_call(JOIN)),
    ModelSpec("scripted_recurrent_decoder", scripted(RecurrentDecoder, args(randn(3, 5, 16), lambda: 3)),
              decoder_calls, rtol=1e-5, atol=1e-5),
    ModelSpec("saved_module_file", traced(ResidualMLP, TOKENS), one_call(TOKENS), from_file=True),
    # torch.jit.save keeps no default arguments of a ScriptFunction (torch.jit.load's forward needs `scale`)
    ModelSpec("saved_script_function_file", scripted(lambda: scaled_softplus, args(randn(5, 7), lambda: 2.0)),
              lambda: [(torch.randn(5, 7), 2.0), (torch.randn(5, 7), 0.5)], from_file=True),
]
