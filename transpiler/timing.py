"""Choices made by timing while converting (oneDNN or ATen for a GEMM, channels-last or not, a GEMM's form on CUDA,
one CUDA graph or step by step), made one way so that a busy machine does not flip them, and recorded.

- The candidates take turns, call by call, for several rounds (the order rotating, so none always runs after
  another): a burst of load on the machine hits each alike, where timing one and then the other let it fall on one.
- Each candidate's median is compared, not its best: one lucky call decides nothing.
- Another candidate wins only where its median is at most `margin` of the model's own form's (each choice names its
  margin); a tie keeps what the model wrote.
- With `choices="fixed"` (`recording("fixed")`) nothing is timed: each choice takes the answer its pass fixes for
  it, the same on every machine, for reproducible builds.

Every choice made while `recording` lands in the list it yields: what was chosen between, each candidate's time,
the model's own, the margin and the outcome; the conversion puts it in the report (`summary()["timed_choices"]`).
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Optional

import torch

from jit2triton.errors import ConversionError

MODES = ("timed", "fixed")
ROUNDS = 15  # rounds of calls, each candidate once a round...
MIN_ROUNDS = 5  # ... or, once `budget_s` is spent, at least this many


@dataclass
class Choice:
    """One choice: `what` it was between (its shape), the candidates' median times in microseconds (none when
    fixed), the model's own candidate, the share of its time another had to beat, and the one chosen."""
    what: str
    own: str
    chosen: str
    margin: Optional[float] = None
    times_us: dict[str, float] = field(default_factory=dict)
    fixed: bool = False

    def as_report(self) -> dict:
        return asdict(self)


_made: ContextVar[Optional[list[Choice]]] = ContextVar("jit2triton_timed_choices", default=None)
_fixed: ContextVar[bool] = ContextVar("jit2triton_fixed_choices", default=False)


@contextmanager
def recording(mode: str = "timed") -> Iterator[list[Choice]]:
    """Choices made inside are timed (or, with "fixed", take their fixed answers) and appended to the list."""
    if mode not in MODES:
        raise ConversionError(f"choices={mode!r} is not known: 'timed' (the fastest here, by timing) or 'fixed' "
                              "(the same on every machine)")
    made: list[Choice] = []
    tokens = _made.set(made), _fixed.set(mode == "fixed")
    try:
        yield made
    finally:
        _made.reset(tokens[0])
        _fixed.reset(tokens[1])


def fixed() -> bool:
    """Whether this conversion's choices are fixed: no timing at all."""
    return _fixed.get()


def record(choice: Choice) -> Choice:
    made = _made.get()
    if made is not None:
        made.append(choice)
    return choice


def take_fixed(what: str, answer: str, own: str) -> Choice:
    """The fixed answer to a choice, recorded as such."""
    return record(Choice(what, own, answer, fixed=True))


def settle(what: str, seconds: dict[str, float], own: str, margin: float) -> Choice:
    """The fastest of the candidates whose median is at most `margin` of `own`'s, else `own` (also when `own`
    could not be timed); recorded."""
    beating = [label for label in seconds if label != own and own in seconds
               and seconds[label] <= margin * seconds[own]]
    chosen = min(beating, key=seconds.get) if beating else own
    return record(Choice(what, own, chosen, margin, {k: round(v * 1e6, 2) for k, v in seconds.items()}))


def settle_confirmed(what: str, candidates: dict[str, Callable[[], object]], own: str, margin: float,
                     timings: int = 2, budget_s: float = 0.2) -> Choice:
    """`settle` on `interleaved` timings of the candidates, where `own` wins only if `timings` timings in a row
    find no other within `margin` of it; the last timing is the one recorded. For choices whose other candidate
    is the one expected to win, so that a burst of load on the machine does not keep `own` by chance: one 5-round
    timing on the loaded project machine put transformers' ResNetModel's 2x64x32x32 * 256x64 1x1 convolution +
    add + relu at 5.3 ms fused against 1.7 ATen (alone, at leisure: 0.75 against 0.86), and kept ATen's for three."""
    for _ in range(timings):
        seconds = interleaved(candidates, budget_s=budget_s)
        if any(label != own and seconds[label] <= margin * seconds[own] for label in seconds):
            break
    return settle(what, seconds, own, margin)


def range_points(dims: Optional[dict[str, tuple]]) -> list[dict[str, int]]:
    """Where a choice over dynamic dims is timed: the example's sizes, then every dim at its smallest, then every
    dim at its largest (its example where the range is open), without repeats. `dims`: name -> (min, max or
    None, example). A choice fitted to the example alone (a GEMM form fast at 1024 rows) can lose 2x at the
    range's other end (16 rows), and a dynamic package serves the whole range."""
    if not dims:
        return [{}]
    example = {name: d[2] for name, d in dims.items()}
    points = [example, {name: d[0] for name, d in dims.items()},
              {name: d[1] if d[1] is not None else d[2] for name, d in dims.items()}]
    return [p for i, p in enumerate(points) if p not in points[:i]]


def settle_over(what: str, seconds_at: list[dict[str, float]], own: str, margin: float) -> Choice:
    """`settle` over several points of a dynamic range (`range_points`, the example first): each candidate is judged
    by its worst share of the fastest candidate's time at any point, so the winner is the one never far behind,
    not the one fastest at the example. The record keeps every point's times."""
    seconds_at = [s for s in seconds_at if s] or [{}]  # a point that could not be timed (memory) says nothing
    if len(seconds_at) == 1:
        return settle(what, seconds_at[0], own, margin)
    labels = [label for label in seconds_at[0] if all(label in s for s in seconds_at)]
    worst = {label: max(s[label] / min(s[other] for other in labels) for s in seconds_at) for label in labels}
    beating = [label for label in worst if label != own and own in worst and worst[label] <= margin * worst[own]]
    chosen = min(beating, key=worst.get) if beating else own
    times = {f"{label} @{k}": round(s[label] * 1e6, 2) for k, s in enumerate(seconds_at) for label in labels}
    return record(Choice(what, own, chosen, margin, times))


def interleaved(candidates: dict[str, Callable[[], object]], rounds: int = ROUNDS, budget_s: float = 0.05,
                sync: Optional[Callable[[], None]] = None) -> dict[str, float]:
    """Median seconds per call of each candidate, taking turns: one warm call each (first-call allocations and
    setup), then up to `rounds` rounds of one call each, stopping after MIN_ROUNDS once they took `budget_s`.
    `sync` (a device's synchronize) brackets each timed call, so queued device work counts."""
    sync = sync or (lambda: None)
    for run in candidates.values():
        run()
    sync()
    labels = list(candidates)
    times: dict[str, list[float]] = {label: [] for label in labels}
    spent = 0.0
    for r in range(rounds):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            sync()
            start = time.perf_counter()
            candidates[label]()
            sync()
            took = time.perf_counter() - start
            times[label].append(took)
            spent += took
        if r + 1 >= MIN_ROUNDS and spent > budget_s:
            break
    return {label: statistics.median(t) for label, t in times.items()}


def best_time(run: Callable[[], object], runs: int = 20, budget_s: float = 0.02,
              sync: Optional[Callable[[], None]] = None) -> float:
    """Seconds of the fastest of up to `runs` calls of `run` after a warm one, stopping once they took about
    `budget_s`: for what a single candidate can do at best (the host's share of a CUDA plan), not for choosing."""
    sync = sync or (lambda: None)
    run()
    sync()
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


def graphs_gpu_us(calls: dict[str, list[Callable[[], object]]], replays: int = 7) -> dict[str, float]:
    """Median GPU time per call of each candidate's CUDA graph holding its `calls` (the host's launch cost is not
    what is compared), the graphs replayed in turns."""
    graphs = {label: _captured(fns) for label, fns in calls.items()}
    labels = list(graphs)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for r in range(replays):
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[label].replay()
            end.record()
            end.synchronize()
            times[label].append(start.elapsed_time(end) * 1e3 / len(calls[label]))
    return {label: statistics.median(t) for label, t in times.items()}


def _captured(calls: list[Callable[[], object]]) -> "torch.cuda.CUDAGraph":
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
    return graph
