"""What a forward() does besides computing its outputs: grad-mode blocks, which an inference package drops; and the
effects a package cannot keep, which are refused with the op and its source line.

`with torch.no_grad():` (or `enable_grad`, `set_grad_enabled`) is a `prim::Enter` / `prim::Exit` pair around an
object of torch's grad-mode classes: a package runs inference only, so the block is its body. `warnings.warn` and
`print` run in both runtimes (deploy/host_ops.py, plan.cpp). Seeding the random generator or reading a file on
every call would run once, at conversion, in a package: refused.
"""
from __future__ import annotations

import torch

from jit2triton.errors import ConversionError

GRAD_MODES = "__torch__.torch.autograd.grad_mode."
REFUSED = {
    "aten::manual_seed": "seeds torch's random generator on every call, which a package cannot do: seed it before "
                         "calling the model",
    "aten::seed": "seeds torch's random generator on every call, which a package cannot do: seed it before calling "
                  "the model",
    "aten::from_file": "reads a file on every call, which a package would read once, at conversion: pass the data "
                       "in as an input",
}


def drop_grad_modes(graph: torch._C.Graph) -> None:
    """Remove `with torch.no_grad():` and its kind; refuse any other context manager, naming its line."""
    for kind in ("prim::Exit", "prim::Enter"):
        for node in list(graph.findAllNodes(kind, True)):
            manager = node.input()
            if not str(manager.type()).startswith(GRAD_MODES):
                raise ConversionError(f"the model enters a `with` block of {manager.type()} "
                                      f"({_where(manager.node())}), whose __enter__/__exit__ jit2triton cannot run; "
                                      "only torch.no_grad() and its kind are supported")
            node.destroy()
    for node in list(graph.findAllNodes("prim::CreateObject", True)):
        made = node.output()
        if str(made.type()).startswith(GRAD_MODES) and all(u.user.kind() == "prim::SetAttr" for u in made.uses()):
            for use in list(made.uses()):
                use.user.destroy()
            node.destroy()


def refuse_effects(graph: torch._C.Graph) -> None:
    for node in _nodes(graph.block()):
        why = REFUSED.get(node.kind())
        if why is not None:
            raise ConversionError(f"the model calls {node.kind()} ({_where(node)}): it {why}")


def _nodes(block):
    for node in block.nodes():
        yield node
        for inner in node.blocks():
            yield from _nodes(inner)


def _where(node) -> str:
    """The model's file and line of a node, as TorchScript's source range names them."""
    lines = [line.strip() for line in node.sourceRange().splitlines() if line.strip()]
    return next((line for line in lines if line.startswith("File")), lines[0] if lines else node.kind())
