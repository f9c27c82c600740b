"""Rung 3 of the fallback ladder (transpiler/fallbacks.py): where verification fails and the culprit search names no
kernel, the kernels are bisected and only the one the package cannot keep goes through ATen; every other kernel
stays (issue 46: scripted detectors had gone wholly to ATen for one kernel)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from jit2triton import conversion
from jit2triton.transpiler import fallbacks
from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.fallbacks import Attempt, Verdict
from jit2triton.transpiler.ir import Attr
from jit2triton.transpiler.lowering import load_lowerings
from jit2triton.transpiler.op_table import OP_TABLE, OpInfo

from helpers import assert_matches_torchscript, convert_for


# --- the ladder alone, on stages that fail as a model with some wrong kernels would ------------------------------

def _kernel(index: int):
    return SimpleNamespace(uid=1000 + index, op="j2t::kernel",
                           attrs={Attr.KERNEL: SimpleNamespace(name=f"k{index}"),
                                  Attr.FUSED: [SimpleNamespace(uid=index, op=f"aten::op{index}", attrs={})]})


class WrongKernels:
    """A build of `count` kernels (one per node uid 0..count-1) differs from TorchScript while it keeps a kernel of
    `wrong` (or always, where `rewrite_wrong`); the culprit search never names one."""

    def __init__(self, count: int, wrong: set[int], rewrite_wrong: bool = False, optional_wrong: bool = False,
                 blame_innocent: bool = False):
        self.count, self.wrong, self.rewrite_wrong, self.optional_wrong = count, wrong, rewrite_wrong, optional_wrong
        self.blame_innocent = blame_innocent  # the culprit search names the last kernel kept, never the wrong one
        self.checks = 0

    def prepare(self, attempt):
        return "graph"

    def build(self, prepared, attempt):
        self.optional_on = not fallbacks.OPTIONAL_REWRITES <= attempt.skipped
        if not attempt.kernels:
            return []
        return [_kernel(i) for i in range(self.count) if i not in attempt.refused]

    def check(self, kept):
        self.checks += 1
        differs = (self.rewrite_wrong or self.optional_wrong and self.optional_on
                   or any(k.attrs[Attr.FUSED][0].uid in self.wrong for k in kept))
        blamed = kept[-1] if differs and self.blame_innocent and kept[-1].attrs[Attr.FUSED][0].uid != 0 else None
        return Verdict(not differs, kernel=blamed, error=0.5, worst=0.5, mismatches="output: max error 0.5",
                       has_kernels=bool(kept), kernels=kept)


def _ladder(stages):
    return fallbacks.build_with_fallbacks(stages, Attempt(), lambda message: None)


@pytest.mark.parametrize("wrong", [{0}, {37}, {99}, {12, 80}])
def test_bisection_takes_out_only_the_wrong_kernels(wrong):
    stages = WrongKernels(100, wrong)
    kept, attempt = _ladder(stages)
    assert {k.attrs[Attr.FUSED][0].uid for k in kept} == set(range(100)) - wrong
    assert sorted(r["kernel"] for r in attempt.removed) == sorted(f"k{i}" for i in wrong)
    assert stages.checks <= 1 + len(wrong) * 9  # log2(100) rounds and a full check per culprit
    assert all("found by bisection" in attempt.refused[i] for i in wrong)


def test_a_search_past_its_bound_keeps_the_kernels_seen_to_match(monkeypatch):
    monkeypatch.setattr(fallbacks, "MAX_BISECT_ROUNDS", 3)
    kept, attempt = _ladder(WrongKernels(100, {90}))
    survivors = {k.attrs[Attr.FUSED][0].uid for k in kept}
    assert 90 not in survivors and set(range(75)) <= survivors  # three rounds: 50, 75 and 87 kept
    assert any("rounds of bisection did not settle" in note for note in attempt.notes)


def test_a_rewrite_that_is_wrong_still_leaves_torchscript_s_graph():
    """Every kernel out and still different: the search ends, and the rewritten graph goes (rung 4)."""
    stages = WrongKernels(8, set(), rewrite_wrong=True)
    with pytest.raises(conversion.ConversionError, match="converted model does not match TorchScript"):
        _ladder(stages)
    # the failed build, 3 halvings, every kernel out; the same without the optional rewrites; rung 4, refused
    assert stages.checks <= 2 * (1 + 3 + 1) + 1


def test_a_culprit_search_that_keeps_blaming_the_wrong_kernels_ends_in_every_kernel_out_not_a_refusal():
    stages = WrongKernels(100, {0}, blame_innocent=True)
    kept, attempt = _ladder(stages)
    assert kept == [] and len(attempt.removed) == fallbacks.MAX_VERIFY_ROUNDS - 1
    assert any("verification still failed after taking 15 kernels out; every op runs through ATen" in note
               for note in attempt.notes)


def test_a_wrong_optional_rewrite_costs_the_optional_rewrites_not_the_kernels():
    kept, attempt = _ladder(WrongKernels(8, set(), optional_wrong=True))
    assert len(kept) == 8 and attempt.rewrites and attempt.skipped == fallbacks.OPTIONAL_REWRITES
    assert attempt.removed == [] and any("converted without the optional rewrites" in n for n in attempt.notes)


# --- a model whose one wrong kernel the culprit search cannot name ------------------------------------------------

def three_regions(x, y):
    a = torch.relu(x) * y + 1
    b = torch.softmax(a @ y.t(), -1) * 3
    return torch.tanh(b @ y) - a


def _break_softmax(monkeypatch) -> None:
    load_lowerings()
    original = OP_TABLE["aten::softmax.int"]

    def wrong(ctx, *args):
        box = original.lowering(ctx, *args)
        correct = box.fn
        box.fn = lambda index: K.op("neg", correct(index))  # a sign flip: the kernel computes wrong values
        return box

    monkeypatch.setitem(OP_TABLE, "aten::softmax.int", OpInfo(original.name, original.category, wrong))


def test_a_wrong_kernel_nobody_names_costs_only_its_own_nodes(monkeypatch):
    _break_softmax(monkeypatch)
    monkeypatch.setattr(conversion, "find_culprit", lambda *args, **kwargs: None)  # the search cannot pin it
    model = torch.jit.script(three_regions)
    converted = convert_for(model, (torch.randn(4, 8), torch.randn(4, 8)), "cpp")
    summary = converted.summary()
    removed, = summary["verification"]["kernels_removed"]
    assert "aten::softmax.int" in removed["ops"] and removed["kernel"] != "*"
    assert summary["fallback_ops"].get("aten::softmax.int") == 1
    kept_ops = {op for kernel in summary["kernels"] for op in kernel["ops"]}
    assert {"aten::relu", "aten::tanh"} <= kept_ops and "aten::softmax.int" not in kept_ops
    assert "found by bisection" in converted.report()
    assert_matches_torchscript(converted, model, lambda: (torch.randn(4, 8), torch.randn(4, 8)))


def doubling_loop(x):
    for _ in range(3):
        x = torch.sin(x) * 2
    return x


def test_the_culprit_search_compares_a_loop_s_iterations_apart():
    """A value made in a loop is kept per iteration, and the first that differs is found even where the last
    iteration agrees (a top-k that rounding flipped in a detector's first feature level, not a kernel after the
    loop that the last iteration's values would have blamed)."""
    from jit2triton.deploy.packaging.culprit import first_divergence, observed_values
    from jit2triton.deploy.packaging.interpreter import placed_weights
    from jit2triton.loaders import load_script
    from jit2triton.transpiler import pipeline
    from jit2triton.transpiler.from_torchscript import from_torchscript

    script = load_script(torch.jit.script(doubling_loop))
    sched = pipeline.plan(from_torchscript(script.graph, script.input_names, script.name, False))
    cpu = torch.device("cpu")
    trace = observed_values(sched.plan, placed_weights(sched.weights, sched.plan, cpu), sched.node_table,
                            sched.nodes, [torch.randn(4)])
    sin = next(n for n in sched.nodes if n.op == "aten::sin")
    assert [k for k in trace if k[0] == sin.outputs[0].id] == [(sin.outputs[0].id, i) for i in range(3)]
    actual = dict(trace)
    first = (sin.outputs[0].id, 0)
    actual[first] = trace[first] + 1  # the first iteration differs; the last agrees
    found = first_divergence(trace, actual, sched.nodes, lambda a, e: float((a - e).abs().max()))
    assert found.node is sin
