"""Choices timed while converting are made so that a busy machine does not flip them (the candidates take turns,
medians are compared, another form must win by a margin, a tie keeps the model's own), are listed in the report
with their times, and are not timed at all with choices="fixed"."""
import pytest
import torch
from click.testing import CliRunner

import jit2triton
from jit2triton.cli import main
from jit2triton.transpiler import channels_last, onednn_linear, timing


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


def test_candidates_take_turns_and_their_medians_are_compared(monkeypatch):
    """A burst of load hits each candidate alike, and one lucky call decides nothing: `fast_once` ran once in 0.1 s
    (its best is the best) and 5 s otherwise, `steady` always 3 s."""
    clock, order = [0.0], []
    durations = {"fast_once": iter([1.0, 0.1, 5, 5, 5, 5, 5]), "steady": iter([1.0] + [3.0] * 6)}

    def candidate(label):
        def run():
            order.append(label)
            clock[0] += next(durations[label])
        return run
    monkeypatch.setattr(timing.time, "perf_counter", lambda: clock[0])
    seconds = timing.interleaved({"fast_once": candidate("fast_once"), "steady": candidate("steady")}, rounds=6,
                                 budget_s=0)
    assert seconds == {"fast_once": 5.0, "steady": 3.0}
    timed = order[2:]  # after one warm call each
    assert len(timed) == 2 * timing.MIN_ROUNDS  # the budget spent: stopped after MIN_ROUNDS rounds
    assert {timed[i] for i in range(0, len(timed), 2)} == {"fast_once", "steady"}  # neither always goes first
    assert all(timed[i] != timed[i + 1] for i in range(0, len(timed), 2))  # each round holds both


def test_every_timed_choice_is_in_the_report_with_its_times_and_margin():
    traced, x = _model()
    converted = jit2triton.convert(traced, (x,))
    choices = converted.summary()["timed_choices"]
    linear = [c for c in choices if c["what"].startswith("oneDNN or ATen linear")]
    assert {c["what"] for c in linear} == {"oneDNN or ATen linear, 2x288 -> 256 float32, bias",
                                           "oneDNN or ATen linear, 2x256 -> 256 float32, bias"}
    assert all(set(c["times_us"]) == {"aten", "onednn"} and c["margin"] == onednn_linear.MARGIN and not c["fixed"]
               for c in linear)
    layout = next(c for c in choices if c["what"].startswith("channels-last"))
    assert set(layout["times_us"]) == {"own layout", "channels-last"} and layout["own"] == "own layout"
    report = converted.report()
    assert "timed choices" in report and f"-> {layout['chosen']} (margin 0.95)" in report
    again = jit2triton.convert(traced, (x,))  # the GEMMs' times are kept per process: still listed
    assert [c for c in again.summary()["timed_choices"] if c["what"].startswith("oneDNN")] == linear


def test_fixed_choices_time_nothing_and_give_the_same_package(monkeypatch):
    def no_timing(*args, **kwargs):
        raise AssertionError("timed with choices='fixed'")
    monkeypatch.setattr(timing, "interleaved", no_timing)
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
    monkeypatch.setattr(timing, "interleaved", lambda *a, **k: pytest.fail("timed with --choices fixed"))
    traced, x = _model()
    model = tmp_path / "model.pt"
    torch.jit.save(traced, model)
    result = CliRunner().invoke(main, ["convert", str(model), "--input", "2x3x6x6", "--choices", "fixed"])
    assert result.exit_code == 0, result.output
    assert "choices fixed" in result.output
    with pytest.raises(jit2triton.ConversionError, match="choices='sometimes' is not known"):
        jit2triton.convert(traced, (x,), choices="sometimes")


@pytest.mark.parametrize("others, chosen", [([5.0, 1.0], "fused"), ([5.0, 5.0], "own"), ([1.0], "fused")])
def test_settle_confirmed_keeps_the_model_s_own_only_where_two_timings_agree(monkeypatch, others, chosen):
    """One timing on a loaded machine can put the expected winner past the margin by chance: the model's own form
    is kept only where two timings in a row say so, no more are taken, and only the last is reported."""
    times = iter(others)
    monkeypatch.setattr(timing, "interleaved", lambda candidates, **_: {"own": 1.0, "fused": next(times)})
    with timing.recording() as made:
        assert timing.settle_confirmed("a choice", {}, "own", 2.0).chosen == chosen
    assert len(made) == 1 and made[0].times_us["fused"] == others[-1] * 1e6
    assert next(times, None) is None
