"""Small CPU kernels of common shapes against TorchScript: where a generated kernel is slower than ATen's.

Each pattern is traced, converted for the CPU (the C++ backend) statically and, where it names dims, with those
dims dynamic, checked against TorchScript, then timed in turns with it in one process (inference mode, warmed,
median ms a call); the last column is TorchScript's time over the package's (below 1: the package is slower).

    python benchmarks/cpu_patterns.py [--threads 1] [--rounds 15] [--only NAME ...]
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

import jit2triton


class Pattern(NamedTuple):
    name: str
    fn: Callable[[torch.Tensor], torch.Tensor]
    shape: tuple[int, ...]
    dynamic: Optional[dict[int, str]] = None  # axis -> dim name, for a second, dynamic package


def _merge_heads(x):
    b, h, s, d = x.shape
    return torch.tanh(x.transpose(1, 2).reshape(b, s, h * d)) * 2


def _layer_norm_2d(x):
    """ConvNeXt's channels-first LayerNorm over C of NCHW (its weight and bias left out)."""
    u = x.mean(1, keepdim=True)
    s = (x - u).pow(2).mean(1, keepdim=True)
    return (x - u) / torch.sqrt(s + 1e-6)


_CAUSAL = torch.ones(128, 128).triu(1).bool()  # (the attention rows' constant masks)
_CAUSAL_ADDED = torch.triu(torch.full((128, 128), -1e4), 1)


PATTERNS = [
    Pattern("merged attention heads + tanh", _merge_heads, (2, 12, 128, 64), {2: "S"}),
    Pattern("patch flatten (ViT)", lambda x: torch.relu(x.flatten(2).transpose(1, 2)) * 3, (2, 192, 28, 28),
            {2: "H", 3: "W"}),
    Pattern("pixel shuffle", lambda x: torch.relu(F.pixel_shuffle(x, 2)) + 1, (1, 64, 40, 40), {2: "H", 3: "W"}),
    Pattern("permute NHWC -> NCHW", lambda x: x.permute(0, 3, 1, 2) * 2, (8, 32, 32, 64)),
    Pattern("transpose, contiguous", lambda x: x.transpose(-1, -2).contiguous() + 1, (64, 128, 128)),
    Pattern("softmax over dim 1", lambda x: torch.softmax(x, 1), (32, 256, 64)),
    Pattern("log_softmax over the last dim", lambda x: torch.log_softmax(x, -1), (256, 1000)),
    Pattern("softmax over the last dim", lambda x: torch.softmax(x, -1), (2, 12, 128, 128)),
    Pattern("softmax, causal mask of -1e4 added", lambda x: torch.softmax(x / 8 + _CAUSAL_ADDED, -1),
            (2, 12, 128, 128)),
    Pattern("softmax, masked_fill(causal, -inf)", lambda x: torch.softmax(x.masked_fill(_CAUSAL, float("-inf")), -1),
            (2, 12, 128, 128)),
    Pattern("log_softmax, (x > 1).float() mask", lambda x: torch.log_softmax(x - 1e4 * (x > 1).float(), -1),
            (256, 1000)),
    Pattern("sigmoid", torch.sigmoid, (64, 3072)),
    Pattern("SiLU", F.silu, (64, 3072)),
    Pattern("GELU (erf)", F.gelu, (64, 3072)),
    Pattern("mean over H and W", lambda x: x.mean(dim=(2, 3)), (8, 64, 56, 56)),
    Pattern("channels-first LayerNorm (ConvNeXt)", _layer_norm_2d, (2, 96, 56, 56)),
    Pattern("LayerNorm over permuted channels (transformers' ConvNeXt)",
            lambda x: F.layer_norm(x.permute(0, 2, 3, 1), (96,)).permute(0, 3, 1, 2), (2, 96, 32, 32)),
    Pattern("layer_norm", lambda x: F.layer_norm(x, (768,)), (128, 768)),
    Pattern("strided slice", lambda x: x[:, ::2] * 2, (256, 1024)),
    Pattern("sum over dim 0", lambda x: x.sum(0), (1024, 512)),
]


def in_turns_ms(contenders: dict[str, Callable], inputs: tuple, rounds: int, warmup: int = 3) -> dict[str, float]:
    """Median ms a call of each contender under inference mode, after `warmup` calls each, the contenders taking
    turns call by call, their order reversed every other round."""
    times: dict[str, list[float]] = {name: [] for name in contenders}
    with torch.inference_mode():
        for f in contenders.values():
            for _ in range(warmup):
                f(*inputs)
        for r in range(rounds):
            order = list(contenders.items())
            for name, f in order if r % 2 else reversed(order):
                started = time.perf_counter()
                f(*inputs)
                times[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) * 1e3 for name, values in times.items()}


class _Wrapped(torch.nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", action="append")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"CPU, {args.threads} thread(s), torch {torch.__version__}; ms a call, median of {args.rounds} rounds in "
          "turns; vs TorchScript = TorchScript's time over the package's")
    print("| pattern | package | TorchScript | jit2triton | vs TorchScript |\n|---|---|---|---|---|")
    folder = tempfile.mkdtemp()
    for pattern in PATTERNS:
        if args.only and pattern.name not in args.only:
            continue
        x = torch.randn(*pattern.shape)
        traced = torch.jit.trace(_Wrapped(pattern.fn), (x,))
        kinds = [("static", None)]
        if pattern.dynamic:
            kinds.append(("dynamic " + ",".join(pattern.dynamic.values()),
                          ({axis: jit2triton.Dim(name, min=2, max=4 * pattern.shape[axis])
                            for axis, name in pattern.dynamic.items()},)))
        for kind, dims in kinds:
            path = os.path.join(folder, f"{len(os.listdir(folder))}.j2t")
            jit2triton.convert(traced, (x,), device="cpu", dynamic_shapes=dims).save(path)
            package = jit2triton.load(path)
            with torch.inference_mode():
                torch.testing.assert_close(package(x), traced(x), rtol=1e-4, atol=1e-4)  # (sums in another order)
            ms = in_turns_ms({"ts": traced, "j2t": package}, (x,), args.rounds)
            ts, ours = ms["ts"], ms["j2t"]
            print(f"| {pattern.name} {tuple(pattern.shape)} | {kind} | {ts:.3f} | {ours:.3f} | {ts / ours:.2f}x |")


if __name__ == "__main__":
    main()
