"""A model a user ran before converting, with TorchScript's optimisations off (`torch.jit.optimized_execution(False)`,
as a benchmark's plain run does), converts: its script functions' cached graphs are then not inlined themselves, and
one round of TorchScript's inliner left calls nested three deep in the graph (scripted Faster R-CNN kept 5; the plan
then called `prim::CallFunction`, which no runtime runs, and conversion failed with "op 'prim::CallFunction' does not
exist"). loaders/torchscript.py's inline_calls inlines round after round until none is left."""
from __future__ import annotations

import pytest
import torch

import jit2triton
from jit2triton.loaders import load_script

from helpers import FRESH_SEED


@torch.jit.script
def _innermost(x: torch.Tensor) -> torch.Tensor:
    return x + 1.0


@torch.jit.script
def _middle(x: torch.Tensor) -> torch.Tensor:
    return _innermost(x) * 2.0


@torch.jit.script
def _outer(x: torch.Tensor) -> torch.Tensor:
    return _middle(x) - torch.relu(x)


class Nested(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _outer(x).sin()


def _run_plainly_first() -> torch.jit.ScriptModule:
    model = torch.jit.script(Nested())
    with torch.inference_mode(), torch.jit.optimized_execution(False):
        for _ in range(3):
            model(torch.randn(8))
    return model


def test_one_round_of_torchscript_s_inliner_leaves_a_call():
    """What the fix is for: if torch's inliner ever inlines these in one round, this fails, and inline_calls' extra
    rounds are no longer needed."""
    graph = _run_plainly_first().graph.copy()
    torch._C._jit_pass_inline(graph)
    assert graph.findAllNodes("prim::CallFunction", True)


def test_every_call_is_inlined():
    script = load_script(_run_plainly_first())
    assert not script.graph.findAllNodes("prim::CallFunction", True), script.graph


@pytest.mark.parametrize("backend", ["cpp", "aten"])
def test_the_model_converts_and_matches(backend: str):
    model = _run_plainly_first()
    converted = jit2triton.convert(model, (torch.randn(8),), backend=backend)
    x = torch.randn(8, generator=torch.Generator().manual_seed(FRESH_SEED))
    with torch.jit.optimized_execution(False):
        expected = model(x)
    torch.testing.assert_close(converted(x), expected, rtol=1e-6, atol=1e-6)


def test_a_call_the_inliner_leaves_is_refused_by_name(monkeypatch):
    """Where a call is left (its callee has no graph), conversion says so, with the model's line, and no plan calls
    it (it failed with the runtime's "op 'prim::CallFunction' does not exist")."""
    from jit2triton.errors import ConversionError
    from jit2triton.loaders import torchscript
    monkeypatch.setattr(torchscript, "inline_calls", lambda graph: None)  # (no round: the calls are left)
    with pytest.raises(ConversionError, match=r"calls prim::CallFunction .*could not inline"):
        jit2triton.convert(_run_plainly_first(), (torch.randn(8),), backend="cpp")
