"""The fallback ladder (transpiler/fallbacks.py) on scripted failures: each failure steps down to the rung its
kind names, in the order optional rewrites off -> kernels out one by one -> every kernel out -> optional rewrites
off -> TorchScript's graph through ATen -> refused, and prepares the graph again only where the graph itself
changes."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from jit2triton.errors import ConversionError
from jit2triton.transpiler import fallbacks
from jit2triton.transpiler.fallbacks import Attempt, Verdict
from jit2triton.transpiler.fuse import FusionFailed
from jit2triton.transpiler.ir import Attr
from jit2triton.transpiler.pipeline import PassFailed


def _node(uid: int, op: str = "aten::relu"):
    return SimpleNamespace(uid=uid, op=op, attrs={})


def _kernel(name: str, *fused):
    return SimpleNamespace(uid=100, op="j2t::kernel", attrs={Attr.KERNEL: SimpleNamespace(name=name),
                                                               Attr.FUSED: list(fused)})


class Scripted:
    """Stages that fail as scripted: each call takes the next outcome of its list (an exception to raise, or a
    Verdict), and records the attempt it saw."""

    def __init__(self, prepare=(), build=(), check=()):
        self.outcomes = {"prepare": list(prepare), "build": list(build), "check": list(check)}
        self.calls: list[tuple[str, bool, bool, frozenset, frozenset]] = []

    def step(self, stage: str, attempt: Attempt):
        self.calls.append((stage, attempt.rewrites, attempt.kernels, frozenset(attempt.skipped),
                           frozenset(attempt.refused)))
        outcome = self.outcomes[stage].pop(0) if self.outcomes[stage] else None
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def prepare(self, attempt):
        self.step("prepare", attempt)
        return "graph"

    def build(self, prepared, attempt):
        self.step("build", attempt)
        self.attempt = attempt
        return "package"

    def check(self, built):
        return self.step("check", self.attempt) or Verdict(passed=True)


def _run(stages, **start):
    return fallbacks.build_with_fallbacks(stages, Attempt(**start), lambda message: None)[1]


def test_a_failing_optional_rewrite_is_skipped_and_the_kernels_stay():
    stages = Scripted(prepare=[PassFailed("gemm_forms", TypeError("bug"))])
    attempt = _run(stages)
    assert [c[0] for c in stages.calls] == ["prepare", "prepare", "build", "check"]
    assert attempt.skipped == {"gemm_forms"} and attempt.kernels and attempt.rewrites
    assert "pass gemm_forms failed (TypeError: bug): converted without it" in attempt.notes[0]


def test_an_example_the_rewrites_broke_costs_the_optional_rewrites_only():
    """The example ran when the graph was first typed and fails when typed again after the optional rewrites: one
    of them broke it, which one is not known: all of them go, the kernels stay."""
    stages = Scripted(prepare=[PassFailed("reobserve", ConversionError("index 5 is out of bounds"), after_rewrites=True)])
    attempt = _run(stages)
    assert stages.calls[1][:3] == ("prepare", True, True) and attempt.skipped == fallbacks.OPTIONAL_REWRITES
    assert "after the optional rewrites: converted without them" in attempt.notes[0]


def test_a_failing_required_pass_costs_the_rewrites_and_the_kernels():
    stages = Scripted(prepare=[PassFailed("check_indices", TypeError("bug"))])
    attempt = _run(stages)
    assert stages.calls[1][:3] == ("prepare", False, False)
    assert "every op runs through ATen" in attempt.notes[0]


def test_a_pass_that_fails_on_torchscript_s_own_graph_is_refused():
    stages = Scripted(prepare=[PassFailed("observe", KeyError(7))])
    with pytest.raises(ConversionError, match=r"pass observe failed \(KeyError: 7\).*a bug in jit2triton"):
        _run(stages, kernels=False, rewrites=False)


def test_kernels_come_out_one_by_one_then_all_then_the_rewrites():
    """A kernel that fails to build, then one verification blames: each costs its own nodes, and the graph is not
    prepared again; then no kernel to blame costs every kernel; then the rewritten graph through ATen disagreeing
    costs the rewrites (prepared again); then TorchScript's own graph disagreeing is refused."""
    a, b = _node(1), _node(2, "aten::softmax.int")
    stages = Scripted(build=[FusionFailed([a], "building its kernel failed")],
                      check=[Verdict(False, kernel=_kernel("k1_softmax", b), error=0.5, has_kernels=True),
                             Verdict(False, worst=0.3, mismatches="output: max error 0.3", has_kernels=True),
                             Verdict(False, worst=0.3, mismatches="output: max error 0.3"),
                             Verdict(False, worst=0.3, mismatches="output: max error 0.3", has_kernels=True),
                             Verdict(False, worst=0.3, mismatches="output: max error 0.3"),
                             Verdict(False, worst=0.3, mismatches="output: max error 0.3")])
    with pytest.raises(ConversionError, match="converted model does not match TorchScript"):
        _run(stages)
    stage_calls = [(stage, rewrites, kernels, refused) for stage, rewrites, kernels, _, refused in stages.calls]
    assert stage_calls == [
        ("prepare", True, True, frozenset()),
        ("build", True, True, frozenset()),  # FusionFailed: node 1 out
        ("build", True, True, {1}),
        ("check", True, True, {1}),  # the kernel of node 2 disagrees: out
        ("build", True, True, {1, 2}),
        ("check", True, True, {1, 2}),  # no kernel to blame: every kernel out
        ("build", True, False, {1, 2}),
        ("check", True, False, {1, 2}),  # the rewritten graph disagrees through ATen: optional rewrites off
        ("prepare", True, True, {1, 2}),
        ("build", True, True, {1, 2}),
        ("check", True, True, {1, 2}),  # no kernel to blame again: every kernel out
        ("build", True, False, {1, 2}),
        ("check", True, False, {1, 2}),  # and still disagreeing: TorchScript's graph
        ("prepare", False, False, {1, 2}),
        ("build", False, False, {1, 2}),
        ("check", False, False, {1, 2}),  # and that disagrees too: refused
    ]


def test_the_report_keeps_the_kernels_taken_out_and_why():
    b = _node(2, "aten::softmax.int")
    stages = Scripted(check=[Verdict(False, kernel=_kernel("k1_softmax", b), error=0.5, has_kernels=True)])
    attempt = _run(stages)
    assert attempt.removed == [{"kernel": "k1_softmax", "error": 0.5, "ops": ["aten::softmax.int"]}]
    assert "verification: max rel. error 0.5 against ATen (kernel k1_softmax)" == attempt.refused[2]


def test_a_kernel_taken_out_takes_the_kernels_fusing_the_same_ops_with_it():
    """Kernels of the same ops compute the same function at other places (a detector's BatchNorm+ReLU kernels, each
    flipping a box by rounding): one round takes them all out, not one round each; other kernels stay."""
    norms = [_kernel(f"k{i}_batch_norm_relu", _node(10 + 2 * i, "aten::batch_norm"), _node(11 + 2 * i))
             for i in range(3)]
    other = _kernel("k9_batch_norm", _node(40, "aten::batch_norm"))
    blamed = Verdict(False, kernel=norms[1], error=0.5, has_kernels=True, kernels=[*norms, other])
    attempt = _run(Scripted(check=[blamed]))
    assert set(attempt.refused) == {10, 11, 12, 13, 14, 15}
    assert [r["kernel"] for r in attempt.removed] == ["k1_batch_norm_relu", "k0_batch_norm_relu", "k2_batch_norm_relu"]
    assert attempt.refused[10].endswith("fuses the same ops as kernel k1_batch_norm_relu, which differed from ATen")


def test_a_rewrite_that_is_wrong_leaves_torchscript_s_graph_with_the_reason():
    stages = Scripted(check=[Verdict(False, worst=0.3, mismatches="output: max error 0.3", has_kernels=True),
                             Verdict(False, worst=0.3, mismatches="output: max error 0.3")] * 2)
    attempt = _run(stages)
    assert not attempt.rewrites and not attempt.kernels and attempt.removed == []
    assert any("the rewritten model does not match TorchScript" in note for note in attempt.notes)


def test_fusion_that_keeps_failing_on_the_same_nodes_costs_every_kernel():
    a = _node(1)
    stages = Scripted(build=[FusionFailed([a], "x"), FusionFailed([a], "x")])
    attempt = _run(stages)
    assert not attempt.kernels and attempt.rewrites
    assert "generating kernels failed (x)" in attempt.notes[0]


# --- a model whose outputs depend discretely on its values (a threshold, NMS) ---------------------------------------

def _discrete_failure(*kernels, device_type="cpu"):
    return Verdict(passed=False, worst=0.9, mismatches="boxes differ", has_kernels=True, kernels=list(kernels),
                   device_type=device_type, discontinuous=True)


def test_where_rounding_may_decide_the_ops_that_round_their_own_way_go_first_and_the_kernels_stay():
    softmax, relu = _node(1, "aten::softmax.int"), _node(2, "aten::relu")
    stages = Scripted(check=[_discrete_failure(_kernel("k0", softmax, relu))])
    attempt = _run(stages)
    assert [c[0] for c in stages.calls] == ["prepare", "build", "check", "build", "check"]  # (not prepared again)
    assert set(attempt.refused) == {1} and attempt.kernels and not attempt.skipped
    assert attempt.removed == [{"kernel": "rounds its own way", "error": 0.9, "ops": ["aten::softmax.int"]}]


def test_an_op_rounds_its_own_way_only_where_the_op_table_says_so():
    exp = _node(1, "aten::exp")  # (SLEEF's on the CPU; libdevice's, as ATen's, on CUDA)
    stages = Scripted(check=[_discrete_failure(_kernel("k0", exp), device_type="cuda")])
    attempt = _run(stages)
    assert 1 not in attempt.refused and attempt.skipped  # the next rung instead: the rewrites
    stages = Scripted(check=[_discrete_failure(_kernel("k0", exp), device_type="cpu")])
    assert set(_run(stages).refused) == {1}


def test_then_the_rewrites_go_with_the_kernels_kept_before_any_bisection():
    relu = _node(2, "aten::relu")
    stages = Scripted(check=[_discrete_failure(_kernel("k0", relu))])
    attempt = _run(stages)
    assert [c[0] for c in stages.calls] == ["prepare", "build", "check", "prepare", "build", "check"]
    assert attempt.skipped == fallbacks.ROUNDING_REWRITES and attempt.kernels and attempt.bisection is None
    assert {"bind_sizes", "fold_shapes"}.isdisjoint(attempt.skipped)  # (they round nothing: kernels keep their sizes)
    assert "round convolutions and GEMMs their own way" in attempt.notes[0]


def test_without_a_discontinuous_op_a_difference_is_a_wrong_kernel_and_is_bisected():
    softmax = _node(1, "aten::softmax.int")
    failure = _discrete_failure(_kernel("k0", softmax))
    failure.discontinuous = False
    stages = Scripted(check=[failure])
    attempt = _run(stages)
    assert not attempt.skipped and not any(r["kernel"] == "rounds its own way" for r in attempt.removed)
    assert attempt.bisect_rounds >= 1


def test_ops_that_bought_no_answer_go_back_into_kernels():
    """Out, they left the outputs parted where rounding decided (a vendor GEMM's rounding, say): the build passed
    "up to rounding" as the first would have, so they are put back, and the package keeps their kernels."""
    softmax, relu = _node(1, "aten::softmax.int"), _node(2, "aten::relu")
    stages = Scripted(check=[_discrete_failure(_kernel("k0", softmax, relu)), Verdict(passed=True, rounding=True),
                             Verdict(passed=True, rounding=True)])
    attempt = _run(stages)
    assert [c[0] for c in stages.calls] == ["prepare", "build", "check", "build", "check", "build", "check"]
    assert stages.calls[3][4] == frozenset({1}) and stages.calls[5][4] == frozenset()  # out, then back in
    assert attempt.own_way_back and not attempt.refused and attempt.removed == []


def test_a_rewrite_that_leaves_a_read_of_nothing_costs_that_rewrite(monkeypatch):
    """An optional rewrite that runs after the graph was last typed and leaves a node reading a value nothing
    defines fails no run of the example; prepare's check catches it, so the conversion goes on without that rewrite
    (it was a KeyError when the plan was built)."""
    import dataclasses

    import torch

    import jit2triton
    from jit2triton.transpiler import pipeline
    from jit2triton.transpiler.ir import Node, Value

    def dangling(graph, ctx):
        ghost = Value("ghost", graph.outputs[0].type)
        graph.body.nodes.append(Node("aten::relu", [ghost], [Value("unused", ghost.type)]))

    monkeypatch.setattr(pipeline, "PASSES", [dataclasses.replace(p, run=dangling) if p.name == "bind_sizes" else p
                                             for p in pipeline.PASSES])
    model = torch.jit.script(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU()).eval())
    x = torch.randn(2, 4)
    converted = jit2triton.convert(model, (x,), backend="cpp")
    notes = converted.summary()["verification"]["notes"]
    assert any("pass bind_sizes failed" in n and "%ghost" in n and "converted without it" in n for n in notes), notes
    torch.testing.assert_close(converted(x), model(x))
