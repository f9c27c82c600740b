"""Timing a choice while converting (oneDNN or ATen, channels-last or not): the fastest of a few runs."""
from __future__ import annotations

import time
from typing import Callable, Optional


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
