"""Conversion runs TorchScript and the package as a deployment does, without autograd: with it, every reference run
of a model whose weights require grad (any nn.Module scripted as it was trained) records a graph, and the outputs
verification keeps hold each run's activations. A scripted FCOS outgrew 21 GB that way converting on a 24 GB
machine, and the kernel killed the conversion."""
from __future__ import annotations

import torch

import jit2triton
from jit2triton import verify


class Stateful(torch.nn.Module):
    """Weights that require grad, and module state (its reference is loaders' _StatefulReference)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(8, 8)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return torch.relu(self.linear(x)) * 2


def test_the_reference_runs_record_no_autograd_graph(monkeypatch) -> None:
    runs = []
    original = verify.Verifier.run_reference

    def watched(self, inputs):
        outputs = original(self, inputs)
        flat = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        runs.append((torch.is_grad_enabled(), [t.grad_fn for t in flat if isinstance(t, torch.Tensor)]))
        return outputs

    monkeypatch.setattr(verify.Verifier, "run_reference", watched)
    model = torch.jit.script(Stateful())
    assert model.linear.weight.requires_grad
    converted = jit2triton.convert(model, (torch.randn(4, 8),))
    assert runs, "verification ran no reference"
    assert all(not enabled and grad_fns and all(f is None for f in grad_fns) for enabled, grad_fns in runs), runs
    assert torch.is_grad_enabled()  # (the caller's mode is theirs again)
    x = torch.randn(4, 8)
    torch.testing.assert_close(converted(x), model(x).detach())
