"""On the GPU machine: torchaudio's Conformer, a speech encoder taking `lengths`, converts with dims on batch and time
and matches TorchScript on fresh inputs (issue 44: its verification draws segfaulted the converting process, the
lengths drawn past the padded time axis). Not collected by pytest.

    python tests/gpu_conformer.py [--device cpu]

The lengths are left for conversion to recognise (no input_ranges): the example's longest reaches the time axis.
Fresh inputs draw each length within 1..T with the longest at T (the padding mask is as long as the longest).
Prints the conversion's time, how each input was drawn, verification's notes, and the largest differences from
TorchScript at each size; exits 1 on a mismatch.
"""
from __future__ import annotations

import argparse
import sys
import time

import torch
from torchaudio.models import Conformer

import jit2triton
from jit2triton import Dim

FEATURES = 80
SIZES = ((4, 100), (1, 32), (3, 57), (8, 240), (16, 400))  # (batch, frames): the example, then fresh, ends included


def fresh(batch: int, frames: int, device: str, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(batch, frames, FEATURES, generator=generator)
    lengths = torch.randint(1, frames + 1, (batch,), generator=generator)
    lengths[torch.randint(0, batch, (1,), generator=generator)] = frames
    return x.to(device), lengths.to(device)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    device = parser.parse_args().device
    torch.manual_seed(0)
    model = Conformer(input_dim=FEATURES, num_heads=4, ffn_dim=256, num_layers=4, depthwise_conv_kernel_size=31)
    scripted = torch.jit.script(model.eval().to(device))
    generator = torch.Generator().manual_seed(0)
    example = fresh(*SIZES[0], device, generator)
    batch, frames = Dim("batch", min=1, max=16), Dim("T", min=32, max=400)
    started = time.perf_counter()
    converted = jit2triton.convert(scripted, example, device=device,
                                   dynamic_shapes={"input": {0: batch, 1: frames}, "lengths": {0: batch}})
    summary = converted.summary()
    verification = summary["verification"]
    print(f"converted in {time.perf_counter() - started:.1f} s: {len(converted.manifest['kernels'])} kernels; "
          f"verification {verification['status']} on {verification['input_sets']} input sets; draws "
          f"{verification.get('draws')}; notes {verification['notes']}")
    worst = 0.0
    for b, t in SIZES:
        x, lengths = fresh(b, t, device, generator)
        with torch.no_grad():
            expected = scripted(x, lengths)
        got = converted(x, lengths)
        error = (got[0] - expected[0]).abs().max().item()
        same_lengths = torch.equal(got[1], expected[1])
        worst = max(worst, error / (expected[0].abs().max().item() + 1e-12))
        print(f"batch {b}, frames {t}: max abs difference {error:.3g} (outputs up to "
              f"{expected[0].abs().max().item():.3g}), lengths {'equal' if same_lengths else 'DIFFER'}")
        if not same_lengths:
            return 1
    ok = worst <= 1e-4
    print(f"largest difference relative to the output's magnitude: {worst:.3g} "
          f"({'matches' if ok else 'MISMATCH'} TorchScript, held to 1e-4)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
