"""How near a flat pointwise kernel comes to the GPU's copy bandwidth (issue 48's bandwidth row: sin^2 + cos^2 over
16M float32), by launch configuration: elements per program, warps, and a streaming cache hint on the loads and
stores. Each configuration is timed in turns with a device-to-device copy of the same bytes (`torch.Tensor.copy_`),
CUDA events around 20 launches, median of 30 rounds; the table gives GPU µs a launch and the share of the copy's
bandwidth (read and write: the same bytes as the kernel moves).

    python benchmarks/pointwise_probe.py [--elements 16777216]
"""
from __future__ import annotations

import argparse
import statistics

import torch
import triton
import triton.language as tl


@triton.jit
def sin2_cos2(x_ptr, out_ptr, n, XBLOCK: tl.constexpr, STREAM: tl.constexpr):
    offsets = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    mask = offsets < n
    if STREAM:
        x = tl.load(x_ptr + offsets, mask=mask, eviction_policy="evict_first")
    else:
        x = tl.load(x_ptr + offsets, mask=mask)
    s, c = tl.sin(x), tl.cos(x)
    y = s * s + c * c
    if STREAM:
        tl.store(out_ptr + offsets, y, mask=mask, cache_modifier=".cs")
    else:
        tl.store(out_ptr + offsets, y, mask=mask)


def timed(fn, launches: int = 20) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(launches):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) * 1000 / launches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--elements", type=int, default=1 << 24)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    n = args.elements
    x = torch.randn(n, device="cuda")
    out, copy_out = torch.empty_like(x), torch.empty_like(x)
    expected = torch.sin(x) ** 2 + torch.cos(x) ** 2
    configs = [(xblock, warps, stream) for xblock in (512, 1024, 2048, 4096, 8192) for warps in (4, 8, 16)
               for stream in (False, True) if xblock // (32 * warps) >= 1]
    launchers = {}
    for xblock, warps, stream in configs:
        def launch(xblock=xblock, warps=warps, stream=stream):
            sin2_cos2[(triton.cdiv(n, xblock),)](x, out, n, XBLOCK=xblock, STREAM=stream, num_warps=warps)
        launch()
        torch.testing.assert_close(out, expected)
        launchers[(xblock, warps, stream)] = launch
    copy = lambda: copy_out.copy_(x)  # noqa: E731
    for fn in (copy, *launchers.values()):
        timed(fn, 5)
    times: dict = {key: [] for key in ["copy", *launchers]}
    for _ in range(args.rounds):
        for key, fn in [("copy", copy), *launchers.items()]:
            times[key].append(timed(fn))
    copy_us = statistics.median(times["copy"])
    print(f"{torch.cuda.get_device_name()}; {n} float32 elements; triton {triton.__version__}; copy {copy_us:.1f} us "
          f"({2 * 4 * n / copy_us / 1e3:.0f} GB/s)")
    print("| XBLOCK | warps | streaming hints | GPU us | share of copy bandwidth |\n|---|---|---|---|---|")
    for key in sorted(launchers, key=lambda k: statistics.median(times[k])):
        us = statistics.median(times[key])
        print(f"| {key[0]} | {key[1]} | {'yes' if key[2] else 'no'} | {us:.1f} | {copy_us / us:.0%} |")


if __name__ == "__main__":
    main()
