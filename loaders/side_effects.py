"""What a forward() does besides computing its outputs: grad-mode blocks, which an inference package drops; and the
effects a package cannot keep, which are refused with the op and its source line.

`with torch.no_grad():` (or `enable_grad`, `set_grad_enabled`) is a `prim::Enter` / `prim::Exit` pair around an
object of torch's grad-mode classes: a package runs inference only, so the block is its body. `warnings.warn` and
`print` run in both runtimes (deploy/host_ops.py, plan.cpp). Seeding the random generator or reading a file on
every call would run once, at conversion, in a package: refused.
"""
from __future__ import annotations

from typing import Sequence

import torch

from jit2triton.errors import ConversionError

from .graph_nodes import all_nodes

GRAD_MODES = "__torch__.torch.autograd.grad_mode."
REFUSED = {
    "aten::manual_seed": "seeds torch's random generator on every call, which a package cannot do: seed it before "
                         "calling the model",
    "aten::seed": "seeds torch's random generator on every call, which a package cannot do: seed it before calling "
                  "the model",
    "aten::from_file": "reads a file, and a package never reads files: with a path that is a constant or a module "
                       "attribute it would hold the bytes read at conversion and miss every later change of the file, "
                       "and a plan that reads a file the user names is refused by both runtimes; read the file "
                       "yourself and pass the data in as an input",
}
# Ops that remain after loading which neither runtime runs (they exist in this torch: no version would help)
UNSUPPORTED = {
    "prim::fork": "forks a call whose future jit2triton cannot follow to its wait (fork/wait run in order, inlined, "
                  "where each future reaches torch.jit.wait directly or through a list)",
    "aten::wait": "waits on a future that no torch.jit.fork in the model made",
    "prim::isinstance": "tests the type of a value whose type is still open (Any, or a Union of several types): only "
                        "an isinstance that the types decide, or that tests an Optional for None, runs; annotate the "
                        "value with a concrete type or an Optional",
    "prim::rpc_async": "makes a remote call (torch.distributed.rpc), which a package cannot make",
    "prim::rpc_sync": "makes a remote call (torch.distributed.rpc), which a package cannot make",
    "prim::rpc_remote": "makes a remote call (torch.distributed.rpc), which a package cannot make",
    "prim::awaitable": "makes an await (torch.jit._awaitable), which neither runtime runs",
    "prim::awaitable_wait": "waits on an await (torch.jit._awaitable), which neither runtime runs",
    "prim::awaitable_nowait": "makes an await (torch.jit._awaitable), which neither runtime runs",
    "prim::PythonOp": "runs Python code (a function or method marked @torch.jit.ignore, which TorchScript calls back "
                      "into Python for), which a package cannot carry: compile it with TorchScript (drop "
                      "@torch.jit.ignore) or keep it outside the model",
    # (what TorchScript's inliner left: a callee with no graph to inline, loaders/torchscript.py's inline_calls)
    "prim::CallFunction": "calls a function TorchScript could not inline (it has no TorchScript graph)",
    "prim::CallMethod": "calls a method TorchScript could not inline (it has no TorchScript graph)",
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
    """Refuse REFUSED ops. Run on the graph before freezing, which would run a file read whose path is a constant or
    an attribute once and keep its result as a constant."""
    for node in all_nodes(graph.block()):
        why = REFUSED.get(node.kind())
        if why is not None:
            raise ConversionError(f"the model calls {node.kind()} ({_where(node)}): it {why}")


def refuse_unsupported(graph: torch._C.Graph, only: tuple[str, ...] = ()) -> None:
    """Refuse, on the normalised graph, an op that neither runtime runs (of `only`, where given), naming it and its
    source line."""
    for node in all_nodes(graph.block()):
        why = UNSUPPORTED.get(node.kind()) if not only or node.kind() in only else None
        if why is not None:
            detail = (f" on a {node.input().type().annotation_str}" if node.kind() == "prim::isinstance" else
                      f" ({node.pyname()})" if node.kind() == "prim::PythonOp" else "")
            raise ConversionError(f"the model calls {node.kind()}{detail} ({_where(node)}), which jit2triton does not "
                                  f"support (the op exists in this torch, but neither runtime runs it): it {why}")


def refuse_unstored_layouts(graph: torch._C.Graph, state: Sequence = ()) -> None:
    """Refuse a weight or module attribute a package cannot store: a sparse (or other non-strided) tensor, naming it.
    Conversion failed on one with ATen's "Could not run 'aten::equal' with arguments from the 'SparseCPU' backend"
    or "copy_() between dense and sparse Tensors is not implemented". `state`: the module state's slots."""
    held = [(slot.name, slot.initial) for slot in state]
    held += [(node.output().debugName(), node.output().toIValue()) for node in all_nodes(graph.block())
             if node.kind() == "prim::Constant" and isinstance(node.output().type(), torch.TensorType)]
    for name, value in held:
        if isinstance(value, torch.Tensor) and value.layout != torch.strided:
            raise ConversionError(
                f"the model holds a {value.layout} tensor ({name}), and a package stores dense (strided) tensors "
                "only: make it dense in the model (`.to_dense()`, its sparse math as dense), or keep that part "
                "outside the model")


def _where(node) -> str:
    """The model's file and line of a node, as TorchScript's source range names them; of the first node that reads
    it where it has none (TorchScript records none for an `isinstance`: its `if` has one)."""
    for candidate in [node, *(use.user for value in node.outputs() for use in value.uses())]:
        lines = [line.strip() for line in candidate.sourceRange().splitlines() if line.strip()]
        if lines:
            return next((line for line in lines if line.startswith("File")), lines[0])
    return node.kind()
