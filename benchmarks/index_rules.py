"""What the kernel IR's index rules for sizes known only at run time save on the CPU (transpiler/kernel_ir.py:
distribute_stride, recombine_div_mod for any size, the dynamic multiples and the below-a-dynamic-size rules): two
blocks converted with them and without, with a static and with a dynamic image size, timed in turns with
TorchScript in one process (inference mode, warmed, median ms a call).

- conv 3x3 + GroupNorm + ReLU: a GroupNorm's statistics read each group as a view of [N, C, H, W], element r of
  group g at (4g + r // (h*w)) * (h*w) + ((r % (h*w)) // w % h) * w + r % (h*w) % w; the rules join that back into
  the dense 4g*(h*w) + r, which the C++ compiler vectorises.
- ShuffleNet's channel shuffle + ReLU: a view, a transpose and a reshape, each element's index split by w and h
  and joined again; the rules take (i*h*w + j*w + k) // w apart into i*h + j where k ranges over w.
Without them every element paid several divisions and modulos by numbers known only at run time.

    python benchmarks/index_rules.py [--threads 1] [--rounds 30] [--size 40]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

import torch

import jit2triton
from cpu_patterns import in_turns_ms
from jit2triton.transpiler import kernel_ir

RULES = ("distribute_stride", "div_dynamic_multiples", "div_below_dynamic_size", "mod_dynamic_multiples",
         "mod_below_dynamic_size")


class ChannelShuffle(torch.nn.Module):
    def forward(self, x):
        b, c, h, w = x.shape
        return torch.relu(x.view(b, 4, c // 4, h, w).transpose(1, 2).reshape(b, c, h, w)) * 2


class ConvGroupNorm(torch.nn.Module):
    def __init__(self, channels: int = 64, groups: int = 16) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = torch.nn.GroupNorm(groups, channels)

    def forward(self, x):
        return torch.relu(self.norm(self.conv(x)))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--size", type=int, default=40)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for model in (ConvGroupNorm(), ChannelShuffle()):
        _compare(model.eval(), args)


def _compare(model: torch.nn.Module, args) -> None:
    torch.manual_seed(0)
    example = torch.randn(1, 64, 32, 32)
    traced = torch.jit.trace(model, example)
    dims = ({2: jit2triton.Dim("H", min=8, max=128), 3: jit2triton.Dim("W", min=8, max=128)},)
    folder = tempfile.mkdtemp()
    paths = {}
    for shapes, label in ((None, "static"), (dims, "dynamic")):
        for rules in ("with", "without"):
            x = torch.randn(1, 64, args.size, args.size) if shapes is None else example
            if rules == "with":
                converted = jit2triton.convert(traced, (x,), device="cpu", dynamic_shapes=shapes)
            else:
                with kernel_ir.rules_disabled(*RULES):
                    converted = jit2triton.convert(traced, (x,), device="cpu", dynamic_shapes=shapes)
            paths[f"{label}, {rules} the rules"] = os.path.join(folder, f"{label}_{rules}.j2t")
            converted.save(paths[f"{label}, {rules} the rules"])
    contenders = {"TorchScript": traced, **{name: jit2triton.load(path) for name, path in paths.items()}}
    x = torch.randn(1, 64, args.size, args.size)
    with torch.inference_mode():
        want = traced(x)
        for name, f in contenders.items():
            error = (f(x) - want).abs().max().item()
            assert error < 1e-4, f"{name} differs from TorchScript by {error}"
    ms = in_turns_ms(contenders, (x,), args.rounds, warmup=5)
    print(f"{type(model).__name__}, 1x64x{args.size}x{args.size}, {args.threads} thread(s), torch {torch.__version__}, "
          f"median of {args.rounds} rounds in turns (ms a call):")
    for name, value in ms.items():
        print(f"  {name:32s} {value:8.3f}")

if __name__ == "__main__":
    sys.exit(main())
