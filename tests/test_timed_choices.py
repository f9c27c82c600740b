"""Choices timed while converting are made so that a busy machine does not flip them (the candidates take turns,
medians are compared, another form must win by a margin, a tie keeps the model's own; a timing counts only once it
is steady, and where it never is the fixed answer is taken and the report says so), are listed in the report with
their times, and are not timed at all with choices="fixed". Load is simulated with a fake clock (`Load`), and once
with real busy processes."""
import multiprocessing
import os
import random
import statistics
import time
from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

import jit2triton
from jit2triton.cli import main
from jit2triton.transpiler import channels_last, onednn_linear, report, timing
from jit2triton.transpiler.ir import Type


class ConvThenLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.head = torch.nn.Linear(8 * 6 * 6, 256)
        self.out = torch.nn.Linear(256, 256)

    def forward(self, x):
        return self.out(torch.relu(self.head(torch.relu(self.conv(x)).flatten(1))))


def _model():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6)
    return torch.jit.trace(ConvThenLinear().eval(), x), x


def _steps(converted) -> list:
    """What runs, in order (node ids differ from one conversion to the next), and the weights' layouts."""
    layouts = {name: (tuple(w.shape), w.stride()) for name, w in converted._contents.weights.items()}
    return [(e["op"], e.get("kernel")) for e in converted.manifest["nodes"]] + sorted(layouts.items())


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setattr(onednn_linear, "_chosen", {})  # timed once per shape and process: time them here


@pytest.mark.parametrize("seconds, margin, chosen", [
    ({"own": 1.0, "other": 0.5}, 0.9, "other"),  # clearly faster
    ({"own": 1.0, "other": 0.95}, 0.9, "own"),  # faster, not by the margin: a tie keeps the model's own
    ({"own": 1.0, "other": 1.0}, 1.0, "other"),  # margin 1: a tie is enough
    ({"own": 1.0, "a": 0.8, "b": 0.6}, 0.9, "b"),  # the fastest of those that beat it
    ({"other": 0.1}, 0.9, "own"),  # the model's own could not be timed: it stays
    ({}, 0.9, "own"),
])
def test_another_candidate_must_beat_the_model_s_own_by_the_margin(seconds, margin, chosen):
    with timing.recording() as made:
        assert timing.settle("a GEMM", seconds, "own", margin).chosen == chosen
    assert made == [timing.Choice("a GEMM", "own", chosen, margin, {k: v * 1e6 for k, v in seconds.items()})]


class Load:
    """A fake clock for timing.py: a candidate's call takes its `work` seconds on a core, and, with probability
    `stalled`, waits `wait(work, rng)` more seconds for a core first (the process's CPU time does not move then)."""

    def __init__(self, work: dict[str, float], stalled: float = 0.0, seed: int = 0,
                 wait=lambda work, rng: work * rng.uniform(100, 1000)) -> None:
        self.work, self.stalled, self.wait = work, stalled, wait
        self.rng, self.wall, self.cpu, self.calls = random.Random(seed), 0.0, 0.0, []

    def install(self, monkeypatch) -> dict:
        monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: self.wall,
                                                            process_time=lambda: self.cpu))
        return {label: self._call(label) for label in self.work}

    def _call(self, label):
        def run():
            self.calls.append(label)
            if self.rng.random() < self.stalled:
                self.wall += self.wait(self.work[label], self.rng)
            self.wall += self.work[label]
            self.cpu += self.work[label]
        return run


def test_candidates_take_turns_and_their_medians_are_compared(monkeypatch):
    """A burst of load hits each candidate alike, and one lucky call decides nothing: `fast_once` ran once in 2.9 s
    (its best is the best) and 3.5 s otherwise, `steady` always 3.2 s."""
    load = Load({"fast_once": 3.5, "steady": 3.2})
    candidates = load.install(monkeypatch)
    timed_once = candidates["fast_once"]

    def fast_once():  # its first timed call (after the two warm ones) takes 2.9 s
        load.work["fast_once"] = 2.9 if len(load.calls) == 2 else 3.5
        timed_once()
    candidates["fast_once"] = fast_once
    timed = timing.measure(candidates, rounds=15, budget_s=20)  # spent after 3 rounds, 4 budgets after 11
    assert timed.seconds == pytest.approx({"fast_once": 3.5, "steady": 3.2}) and timed.steady
    timed_calls = load.calls[2:]  # after one warm call each
    assert len(timed_calls) == 2 * timing.STEADY_ROUNDS  # the budget spent, and steady: stopped at STEADY_ROUNDS
    assert {timed_calls[i] for i in range(0, len(timed_calls), 2)} == {"fast_once", "steady"}  # neither always first
    assert all(timed_calls[i] != timed_calls[i + 1] for i in range(0, len(timed_calls), 2))  # each round holds both


def test_a_timing_goes_on_until_it_is_steady(monkeypatch):
    """Load that passes: the first 8 rounds wait for a core, then none do. The rounds go on until the medians are
    the quiet ones, and the timing kept is steady."""
    load = Load({"own": 1e-4, "other": 2e-4})
    candidates = load.install(monkeypatch)
    stalled_calls = iter(range(2 + 16))  # the warm calls and 8 rounds
    load.rng = SimpleNamespace(random=lambda: 0.0 if next(stalled_calls, None) is not None else 1.0,
                               uniform=lambda a, b: 20)
    load.stalled = 0.5
    timed = timing.measure(candidates, budget_s=0.2)
    assert timed.steady and timed.rounds > 16 and timed.seconds == pytest.approx({"own": 1e-4, "other": 2e-4}), timed


@pytest.mark.parametrize("how", ["most calls wait", "every call waits alike"])
def test_a_busy_machine_takes_the_fixed_answer_and_the_report_says_so(monkeypatch, how):
    """Where the timing never becomes steady, the fixed answer is taken and no time is kept: most calls waiting
    shows in the spread; every call waiting alike (16 ms each, as on the loaded project machine) shows in the share
    of a call the process spent on a core."""
    stalled, wait = (0.7, lambda work, rng: work * rng.uniform(100, 1000)) if how == "most calls wait" else \
        (1.0, lambda work, rng: 0.016)
    load = Load({"aten": 2e-5, "onednn": 3e-5}, stalled, wait=wait)
    candidates = load.install(monkeypatch)
    with timing.recording() as made:
        choice = timing.settle_timed("a linear", candidates, "aten", 1.0, fixed="onednn")
    assert choice.busy and choice.fixed and choice.chosen == "onednn" and not choice.times_us and made == [choice]
    assert load.wall < 4 * timing.UNSTEADY_BUDGETS * 0.2  # it gave up within its bound
    if how == "most calls wait":
        assert choice.spread > timing.STEADY_SPREAD
    else:
        assert choice.spread < 0.01 and choice.cpu_share < timing.MIN_CPU_SHARE
    line = report._format_choices([choice.as_report()])
    assert line[0].startswith("timed choices") and "a linear: onednn (machine busy: spread" in line[1], line
    assert "fixed choice taken" in line[1] and " us" not in line[1]


@pytest.mark.parametrize("other_s, quiet_answer", [(0.7e-4, "other"), (0.95e-4, "own")])
@pytest.mark.parametrize("seed", range(4))
def test_load_changes_no_choice_beyond_the_margin(monkeypatch, other_s, quiet_answer, seed):
    """However much of the load falls on the timing (none, a burst on some calls, most calls, every call), the choice
    is the one a quiet machine makes (`other` clearly faster; or within the margin, so `own`) or the fixed answer,
    said to be taken for a busy machine; light load (a call in ten waiting) still times as a quiet machine does."""
    for stalled in (0.0, 0.1, 0.3, 0.6, 0.9, 1.0):
        load = Load({"own": 1e-4, "other": other_s}, stalled, seed=seed)
        candidates = load.install(monkeypatch)
        with timing.recording():
            choice = timing.settle_timed("a choice", candidates, "own", 0.9, fixed="fixed answer")
        assert choice.chosen == quiet_answer or (choice.busy and choice.chosen == "fixed answer"), (stalled, choice)
        if stalled <= 0.1:
            assert not choice.busy and choice.chosen == quiet_answer, (stalled, choice)
        if stalled >= 0.9:
            assert choice.busy, (stalled, choice)


def _busy(stop) -> None:
    while not stop.is_set():
        pass


def test_real_load_changes_no_choice_beyond_the_margin():
    """With a busy process on every core this process may use, oneDNN-or-ATen for a small linear is the answer a
    quieter timing gave where that was clear (beyond the margin both ways), or the fixed one, said to be for a busy
    machine; a time kept is a steady one. (Before, the loaded project machine timed both at 8 ms a call, for a
    linear of 6 us, and chose one by chance.)"""
    def choose() -> timing.Choice:
        onednn_linear._chosen.clear()
        with timing.recording() as made:
            onednn_linear.choose(Type("Tensor", "float32", (2, 288), "cpu"), 256, True, {})
        return made[0]
    quiet = choose()
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    busy = [context.Process(target=_busy, args=(stop,), daemon=True) for _ in range(len(os.sched_getaffinity(0)))]
    for p in busy:
        p.start()
    try:
        time.sleep(0.2)
        loaded = choose()
    finally:
        stop.set()
        for p in busy:
            p.join(5)
    for choice in (quiet, loaded):
        if choice.busy:
            assert choice.chosen == "aten" and not choice.times_us, choice  # 0.15M multiply-adds: ATen, fixed
        else:
            assert choice.spread <= timing.STEADY_SPREAD and choice.cpu_share >= timing.MIN_CPU_SHARE, choice
    if not quiet.busy and not loaded.busy:
        ratio = quiet.times_us["onednn"] / quiet.times_us["aten"]
        if not 1 / 1.5 < ratio < 1.5:  # clear on the quieter timing
            assert loaded.chosen == quiet.chosen, (quiet, loaded)


def test_every_timed_choice_is_in_the_report_with_its_times_and_margin():
    """Each choice with its steady times and margin, or, where this machine was too busy to time it steadily, with
    the fixed answer and the reason (the project's machine is shared: either can happen here)."""
    traced, x = _model()
    converted = jit2triton.convert(traced, (x,))
    choices = converted.summary()["timed_choices"]
    linear = [c for c in choices if c["what"].startswith("oneDNN or ATen linear")]
    assert {c["what"] for c in linear} == {"oneDNN or ATen linear, 2x288 -> 256 float32, bias",
                                           "oneDNN or ATen linear, 2x256 -> 256 float32, bias"}
    layout = next(c for c in choices if c["what"].startswith("channels-last"))
    report_text = converted.report()
    assert "timed choices" in report_text or "machine busy" in report_text
    for choice, labels in [(c, {"aten", "onednn"}) for c in linear] + [(layout, {"own layout", "channels-last"})]:
        if choice["busy"]:
            assert choice["fixed"] and not choice["times_us"] and choice["chosen"] in ("aten", channels_last.FIXED)
            assert f"{choice['what']}: {choice['chosen']} (machine busy: spread" in report_text
        else:
            assert set(choice["times_us"]) == labels and not choice["fixed"], choice
            assert choice["spread"] <= timing.STEADY_SPREAD and choice["cpu_share"] >= timing.MIN_CPU_SHARE
            assert f"-> {choice['chosen']} (margin {choice['margin']:.2f})" in report_text
    assert linear[0]["margin"] == onednn_linear.MARGIN or linear[0]["busy"]
    assert layout["own"] == "own layout"
    again = jit2triton.convert(traced, (x,))  # the GEMMs' steady times are kept per process: still listed
    kept = [c for c in linear if not c["busy"]]
    assert [c for c in again.summary()["timed_choices"] if c["what"].startswith("oneDNN") and not c["busy"]
            and c["what"] in {k["what"] for k in kept}] == kept


def test_fixed_choices_time_nothing_and_give_the_same_package(monkeypatch):
    def no_timing(*args, **kwargs):
        raise AssertionError("timed with choices='fixed'")
    monkeypatch.setattr(timing, "measure", no_timing)
    traced, x = _model()
    first, second = (jit2triton.convert(traced, (x,), choices="fixed") for _ in range(2))
    assert _steps(first) == _steps(second)
    choices = first.summary()["timed_choices"]
    assert choices and all(c["fixed"] and not c["times_us"] for c in choices)
    assert {c["chosen"] for c in choices if c["what"].startswith("oneDNN")} == {"aten"}  # 0.15M multiply-adds
    assert next(c for c in choices if c["what"].startswith("channels-last"))["chosen"] == channels_last.FIXED
    assert "choices fixed (choices='fixed': nothing timed)" in first.report()
    torch.testing.assert_close(first(x), traced(x))


def test_the_cli_takes_choices_and_refuses_others(tmp_path, monkeypatch):
    monkeypatch.setattr(timing, "measure", lambda *a, **k: pytest.fail("timed with --choices fixed"))
    traced, x = _model()
    model = tmp_path / "model.pt"
    torch.jit.save(traced, model)
    result = CliRunner().invoke(main, ["convert", str(model), "--input", "2x3x6x6", "--choices", "fixed"])
    assert result.exit_code == 0, result.output
    assert "choices fixed" in result.output
    with pytest.raises(jit2triton.ConversionError, match="choices='sometimes' is not known"):
        jit2triton.convert(traced, (x,), choices="sometimes")


@pytest.mark.parametrize("others, chosen", [([5.0, 1.0], "fused"), ([5.0, 5.0], "own"), ([1.0], "fused")])
def test_the_model_s_own_is_kept_only_where_two_steady_timings_agree(monkeypatch, others, chosen):
    """One timing on a loaded machine can put the expected winner past the margin by chance: the model's own form
    is kept only where two timings in a row say so, no more are taken, and only the last is reported."""
    times = iter(others)
    monkeypatch.setattr(timing, "measure", lambda candidates, **_: timing.Timing(
        {"own": 1.0, "fused": next(times)}, 0.1, 1.0, 15))
    with timing.recording() as made:
        assert timing.settle_timed("a choice", {}, "own", 2.0, fixed="own").chosen == chosen
    assert len(made) == 1 and made[0].times_us["fused"] == others[-1] * 1e6
    assert next(times, None) is None


class SlowedOnACore(Load):
    """Calls slowed while the process is on a core (another process thrashing the shared caches): the spread is wide
    and the process never waits off a core."""

    def _call(self, label):
        def run():
            self.calls.append(label)
            took = self.work[label] * (self.rng.uniform(2.0, 3.5) if self.rng.random() < self.stalled else 1.0)
            self.wall += took
            self.cpu += took
        return run


@pytest.mark.parametrize("seed", range(4))
def test_a_candidate_whose_median_beats_the_own_fastest_call_wins_on_a_busy_machine(monkeypatch, seed):
    """The edge conv net's layout choice, own layout 2,102 us and channels-last 1,212 at a spread of 63%, took the
    fixed answer (the own layout, 1.3x slower). A median is at least a candidate's quiet time and the fastest of many
    calls near it: a candidate whose median beats the own form's fastest call by the margin wins on a quiet machine
    too, and is taken; one within the margin is not."""
    for other_s, expected in ((1e-3, "other"), (3.9e-3, "fixed answer")):
        load = SlowedOnACore({"own": 4e-3, "other": other_s}, stalled=0.8, seed=seed)
        candidates = load.install(monkeypatch)
        with timing.recording():
            choice = timing.settle_timed("a layout", candidates, "own", 0.95, fixed="fixed answer")
        assert choice.spread > timing.STEADY_SPREAD and choice.cpu_share >= timing.MIN_CPU_SHARE, choice
        assert choice.chosen == expected, choice
        assert choice.through_noise == (expected == "other") and choice.busy == (expected != "other")
    line = report._format_choices([timing.settle_timed("a layout", SlowedOnACore(
        {"own": 4e-3, "other": 1e-3}, stalled=0.8, seed=seed).install(monkeypatch), "own", 0.95,
        fixed="fixed answer").as_report()])
    assert "-> other (margin 0.95; machine busy: spread" in line[1], line
