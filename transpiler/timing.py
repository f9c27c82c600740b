"""Timing a choice while converting: the fastest of a few runs on the host (oneDNN or ATen, channels-last or not),
or GPU time inside a CUDA graph (an ATen GEMM form)."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch


def best_time(run: Callable[[], object], runs: int = 20, budget_s: float = 0.02,
              sync: Optional[Callable[[], None]] = None) -> float:
    """Seconds of the fastest of up to `runs` calls of `run` after a warm one (first-call allocations and setup),
    stopping once they took about `budget_s`; with `runs` 0, the warm call's. `sync` (a device's synchronize)
    brackets each timed call, so queued device work counts."""
    sync = sync or (lambda: None)
    start = time.perf_counter()
    run()
    sync()
    if not runs:
        return time.perf_counter() - start
    best, spent = float("inf"), 0.0
    for _ in range(runs):
        sync()
        start = time.perf_counter()
        run()
        sync()
        took = time.perf_counter() - start
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return best


def graph_gpu_us(calls: list[Callable[[], object]], replays: int = 7) -> float:
    """Median GPU time per call of a CUDA graph holding `calls` (the host's launch cost is not what is compared)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # cuBLAS's workspace and handles, before capture
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(calls))
    return statistics.median(times)
