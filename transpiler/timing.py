"""Choices made by timing while converting (oneDNN or ATen for a GEMM, channels-last or not, a GEMM's form on CUDA,
one CUDA graph or step by step), made one way so that a busy machine does not flip them, and recorded.

- The candidates take turns, call by call, for several rounds (the order rotating, so none always runs after
  another): a burst of load on the machine hits each alike, where timing one and then the other let it fall on one.
- Each candidate's median is compared, not its best: one lucky call decides nothing.
- A timing counts only when it is steady: each candidate's median call within STEADY_SPREAD of its fastest, and,
  timing the CPU, the process on a core for most of a median call (calls can all wait alike). On a busy machine
  the rounds go on until it is (the load may pass), and where it never is, the choice takes the answer its pass
  fixes for it and the report says so ("machine busy: spread X%, fixed choice taken"). On the project's
  2-core machine with a busy process per core, a 2x256 -> 256 linear's median call took 24 ms against a fastest
  of 32 us (two threads, each waiting for a core for the other), for ATen and oneDNN alike: their medians told
  nothing, and one of them was chosen by chance. So a time in the report is one measured steadily, and a busy
  machine changes no choice beyond its margin: it either times as a quiet one does or takes the fixed answer. One
  exception, which load cannot fake: a candidate whose median call beat the model's own form's fastest call by the
  margin wins on a quiet machine too, and is taken (`beyond_noise`; the report says the machine was busy).
- Another candidate wins only where its median is at most `margin` of the model's own form's (each choice names its
  margin); a tie keeps what the model wrote.
- With `choices="fixed"` (`recording("fixed")`) nothing is timed: each choice takes the answer its pass fixes for
  it, the same on every machine, for reproducible builds.

Every choice made while `recording` lands in the list it yields: what was chosen between, each candidate's time,
the model's own, the margin and the outcome; the conversion puts it in the report (`summary()["timed_choices"]`).
"""
from __future__ import annotations

import functools
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
# Steady: every candidate's median call took at most this share more than its fastest. Quiet, on the project's
# 2-core machine (other work running), the medians of microsecond GEMMs were 10-30% above their fastest calls, and
# a 2x64x32x32 3x3 convolution's 10-16%; with a busy process per core, 100x and more.
STEADY_SPREAD = 0.5
# ... and, timing the CPU, the process ran (on any of its threads) for at least this share of a median call's time.
# Calls can all wait alike: on the loaded project machine a 2x288 -> 256 linear's 20 calls took 16.0 ms each (a
# spread of 0.03) against 21 us at leisure, its process on a core for 0.14-0.43 of each call, where a call that
# ran as it does alone was on a core for all of it (1.0-1.05).
MIN_CPU_SHARE = 0.7
STEADY_ROUNDS = 10  # a timing is judged steady from this many rounds on: a handful of calls may all have waited
UNSTEADY_BUDGETS = 4  # a timing goes on until steady for up to this many times its budget...
UNSTEADY_ROUNDS = 4 * ROUNDS  # ... and this many rounds, in all


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
    spread: Optional[float] = None  # the timing's worst median over fastest, less 1 (timing.Timing)
    cpu_share: Optional[float] = None  # timing the CPU: the share of a median call the process was on a core
    busy: bool = False  # the timing never became steady: the fixed answer was taken, and no time is kept
    through_noise: bool = False  # never steady, but a candidate's median beat the model's own fastest call

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


def take_busy(what: str, answer: str, own: str, timed: "Timing") -> Choice:
    """The fixed answer to a choice whose timing never became steady, recorded with what showed it."""
    return record(Choice(what, own, answer, fixed=True, busy=True, **timed.steadiness()))


def beyond_noise(timed: "Timing", own: str, margin: float) -> Optional[str]:
    """On a timing that never became steady, the candidate whose median call took at most `margin` of the model's
    own form's fastest call, or None. Load only slows calls: a median is at least a candidate's quiet time, and
    the fastest of many calls near the own form's, so such a candidate wins on a quiet machine too. (The edge
    conv net's layout choice, own layout 2,102 us and channels-last 1,212 at a spread of 63% on this project's
    2-core machine, took the fixed answer, the own layout: 1.3x slower.) Not where every call waited alike (the
    process off a core for much of a call): then the fastest calls waited too."""
    if timed.cpu_share is not None and timed.cpu_share < MIN_CPU_SHARE or own not in timed.fastest:
        return None
    beating = [label for label in timed.seconds if label != own and timed.seconds[label] <= margin * timed.fastest[own]]
    return min(beating, key=timed.seconds.get) if beating else None


def settle(what: str, seconds: dict[str, float], own: str, margin: float,
           timed: Optional["Timing"] = None) -> Choice:
    """The fastest of the candidates whose median is at most `margin` of `own`'s, else `own` (also when `own`
    could not be timed); recorded (with how steady the timing was, given it)."""
    beating = [label for label in seconds if label != own and own in seconds
               and seconds[label] <= margin * seconds[own]]
    chosen = min(beating, key=seconds.get) if beating else own
    return record(Choice(what, own, chosen, margin, {k: round(v * 1e6, 2) for k, v in seconds.items()},
                         **(timed.steadiness() if timed is not None else {})))


def settle_timed(what: str, candidates: dict[str, Callable[[], object]], own: str, margin: float, fixed: str,
                 timings: int = 2, budget_s: float = 0.2) -> Choice:
    """`settle` on a steady `measure` of the candidates, or `fixed` (the answer choices="fixed" takes) where the
    timing is not steady. With `timings=2`, `own` wins only if two steady timings in a row find no other within
    `margin` of it; the last timing is the one recorded. For choices whose other candidate is the one expected to
    win, so that a burst of load on the machine does not keep `own` by chance: one 5-round timing on the loaded
    project machine put transformers' ResNetModel's 2x64x32x32 * 256x64 1x1 convolution + add + relu at 5.3 ms
    fused against 1.7 ATen (alone, at leisure: 0.75 against 0.86), and kept ATen's for three."""
    for _ in range(timings):
        timed = measure(candidates, budget_s=budget_s)
        if not timed.steady:
            won = beyond_noise(timed, own, margin)
            if won is None:
                return take_busy(what, fixed, own, timed)
            return record(Choice(what, own, won, margin, {k: round(v * 1e6, 2) for k, v in timed.seconds.items()},
                                 through_noise=True, **timed.steadiness()))
        if any(label != own and timed.seconds[label] <= margin * timed.seconds[own] for label in timed.seconds):
            break
    return settle(what, timed.seconds, own, margin, timed)


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


@dataclass
class Timing:
    """Each candidate's median seconds per call; the spread, the largest of (median / fastest call - 1) over the
    candidates; and, timing the CPU, the median over calls of the share of its time the process was on a core.
    Steady where the spread is at most STEADY_SPREAD and the share at least MIN_CPU_SHARE."""
    seconds: dict[str, float]
    spread: float
    cpu_share: Optional[float]
    rounds: int
    fastest: dict[str, float] = field(default_factory=dict)  # each candidate's fastest call

    @property
    def steady(self) -> bool:
        return self.spread <= STEADY_SPREAD and (self.cpu_share is None or self.cpu_share >= MIN_CPU_SHARE)

    def steadiness(self) -> dict:
        """What the record keeps of it."""
        return {"spread": round(self.spread, 3),
                "cpu_share": None if self.cpu_share is None else round(self.cpu_share, 3)}


def measure(candidates: dict[str, Callable[[], object]], rounds: int = ROUNDS, budget_s: float = 0.05,
            sync: Optional[Callable[[], None]] = None) -> Timing:
    """The candidates timed taking turns: one warm call each (first-call allocations and setup), then up to `rounds`
    rounds of one call each, stopping after MIN_ROUNDS once they took `budget_s`; where the timing is not steady
    then (or has fewer than STEADY_ROUNDS rounds to tell), rounds go on until it is, up to UNSTEADY_ROUNDS rounds
    and UNSTEADY_BUDGETS times `budget_s`. `sync` (a device's synchronize) brackets each timed call, so queued
    device work counts; the process's share of a core is judged only without it (a host waiting for its GPU is
    not a busy one)."""
    on_cpu = None if sync else time.process_time  # all the process's threads: workers of a parallel op count
    sync = sync or (lambda: None)
    for run in candidates.values():
        run()
    sync()
    labels = list(candidates)
    times: dict[str, list[float]] = {label: [] for label in labels}
    shares: list[float] = []
    spent, r = 0.0, 0
    while True:
        for label in labels[r % len(labels):] + labels[:r % len(labels)]:
            sync()
            cpu_start = on_cpu() if on_cpu else 0.0
            start = time.perf_counter()
            candidates[label]()
            sync()
            took = time.perf_counter() - start
            if on_cpu:
                shares.append((on_cpu() - cpu_start) / max(took, 1e-9))
            times[label].append(took)
            spent += took
        r += 1
        if r >= rounds or (r >= MIN_ROUNDS and spent > budget_s):
            timed = _timing(times, shares, r)
            if (timed.steady and r >= min(rounds, STEADY_ROUNDS)) or r >= UNSTEADY_ROUNDS \
                    or spent > UNSTEADY_BUDGETS * budget_s:
                return timed


def _timing(times: dict[str, list[float]], shares: list[float], rounds: int) -> Timing:
    medians = {label: statistics.median(t) for label, t in times.items()}
    spread = max((medians[label] / max(min(t), 1e-9) - 1 for label, t in times.items()), default=0.0)
    return Timing(medians, spread, statistics.median(shares) if shares else None, rounds,
                  {label: min(t) for label, t in times.items()})


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


COLD_BYTES = 2 * 50 * 2 ** 20  # operand bytes timed per candidate: past an H100's 50 MiB L2, twice over
MAX_COPIES = 24


def cold_copies(bytes_per_copy: int) -> int:
    """How many copies of its operands a candidate's CUDA graph reads in turn, so that each call finds them cold in
    L2 as a model whose weights do not fit there does."""
    return max(2, min(MAX_COPIES, COLD_BYTES // max(1, bytes_per_copy)))


def fastest_checked(configs: dict[str, dict], launcher: Callable[[dict], Callable], operands: list[tuple],
                    expected: torch.Tensor, tolerance: float, beside: Optional[dict[str, list]] = None
                    ) -> tuple[dict[str, float], dict[str, dict]]:
    """A template's launch configurations timed (`graphs_gpu_us`, one call per copy of `operands`, beside the calls
    of `beside`): (GPU us of each timed, the configurations that were). A configuration is timed where its launch
    (`launcher(config)(*operands[0])`) compiles here and leaves `expected` in the operands' last tensor, the output:
    one that computes something else is never chosen. Nothing timed where none is."""
    calls, kept = dict(beside or {}), {}
    for label, config in configs.items():
        try:
            launch = launcher(config)
            launch(*operands[0])
            if not torch.allclose(operands[0][-1].float(), expected.float(), rtol=tolerance, atol=tolerance,
                                  equal_nan=True):
                continue
        except Exception:  # noqa: BLE001 - a configuration this Triton cannot compile here
            continue
        calls[label] = [functools.partial(launch, *ops) for ops in operands]
        kept[label] = config
    return (graphs_gpu_us(calls) if kept else {}), kept


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
