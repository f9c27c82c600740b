"""Module state: the attributes a scripted model reads and writes (`self._has_warned = True`, `self.calls += 1`,
`self.cache = x`) become explicit inputs and outputs of its graph.

`torch.jit.freeze` turns every attribute that forward() never assigns into a constant, but keeps the ones it assigns
as `prim::GetAttr` / `prim::SetAttr` on the module. Here each such attribute is threaded through the graph as an SSA
value: its reads take the current value, its writes make a new one, `prim::If` and `prim::Loop` carry it out of
their blocks. The graph then takes the attributes' values after the model's own inputs and returns their new values
after its own outputs, a pure function the rest of the pipeline types, fuses and verifies like any other; the
runtimes hold the values between calls (see `StateSlot`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from jit2triton.errors import ConversionError

from .graph_nodes import all_nodes


@dataclass
class StateSlot:
    name: str  # the attribute's path from the module: "roi_heads._has_warned"
    initial: Any  # its value in the saved module
    written: bool  # forward() assigns it, or it is a tensor, list or dict (else only read: one freezing left)
    # verification compares its new value with TorchScript's: not for an object the model made (local_objects.py),
    # which TorchScript cannot hand to Python when its class is not importable
    compared: bool = True
    type: str = ""  # its TorchScript type ("List[Tensor]": an empty list's elements are still tensors)
    # the value as torch handed it to Python, for putting back: `initial` holds an object of a TorchScript class as
    # a dict of its attributes, which the attribute's type does not take (a detector run before it was saved holds
    # its LevelMapper; restored as a dict, every reference run raised and verification compared nothing)
    saved: Any = None


def thread_module_state(graph: torch._C.Graph, module: torch.jit.ScriptModule) -> list[StateSlot]:
    """Rewrite `graph` (its first input the module) so that it reads no module state; -> the state it took in,
    in the order of the inputs added after the model's own (and, for those written, of the outputs added)."""
    self_value = next(iter(graph.inputs()))
    paths = _attribute_paths(graph, self_value)
    if not paths:
        return []
    types = {}
    for node in graph.findAllNodes("prim::GetAttr", recurse=True):
        key = paths.get(node.output().unique())
        if key is not None and not _is_object(node.output()):
            types.setdefault(key, node.output().type())
    for node in graph.findAllNodes("prim::SetAttr", recurse=True):  # a method that only writes it (`reset`): the
        owner = paths.get(node.inputsAt(0).unique())              # type of what it writes (an empty list's too)
        if owner is not None:
            types.setdefault(owner + (node.s("name"),), node.inputsAt(1).type())
    keys = sorted(set(types) | {k for k in _written(graph.block(), paths)})
    assigned = _written(graph.block(), paths)
    slots = []
    for key in keys:
        raw = _read_attribute(module, key, as_value=False)
        initial = _as_value(raw)
        # a tensor may be written in place (`self.seen.add_(1)`) with no assignment, and so may a list or a dict
        # (`self.seen.append(y)`): such a value is returned as well, so the new value is kept wherever the plan ran
        # (a CUDA graph writes a copy of its inputs) and conversion observes it over calls (a list that grows)
        slots.append(StateSlot(".".join(key), initial,
                               key in assigned or isinstance(initial, (torch.Tensor, list, dict)),
                               compared="Dict[str, Any]" not in str(types.get(key, "")),
                               saved=raw if _holds_object(raw) else None))
    env = {}
    for key, slot in zip(keys, slots):
        value = graph.addInput(".".join(key).replace(".", "_"))
        value.setType(types.get(key) or _type_of(slot))
        types[key] = value.type()
        slot.type = str(value.type())
        env[key] = value
    _thread(graph.block(), env, paths, types)
    for key, slot in zip(keys, slots):
        if slot.written:
            graph.registerOutput(env[key])
    torch._C._jit_pass_dce(graph)
    return slots


def _attribute_paths(graph: torch._C.Graph, self_value) -> dict[int, tuple[str, ...]]:
    """Value id -> attribute path, for every value a chain of GetAttr reads from the module, and for the objects
    SetAttr writes to. Objects (submodules) are only stepping stones: their own paths are kept to name the leaves."""
    paths = {self_value.unique(): ()}
    for node in all_nodes(graph.block()):
        if node.kind() == "prim::GetAttr":
            owner = paths.get(node.input().unique())
            if owner is not None:
                paths[node.output().unique()] = owner + (node.s("name"),)
    return paths


def _is_object(value) -> bool:
    return isinstance(value.type(), torch._C.ClassType)


def _written(block, paths: dict) -> set[tuple[str, ...]]:
    found = set()
    for node in all_nodes(block):
        if node.kind() == "prim::SetAttr":
            owner = paths.get(node.inputsAt(0).unique())
            if owner is None:
                raise ConversionError(f"the model assigns attribute {node.s('name')!r} of an object it did not read "
                                      f"from the module ({_where(node)}); only module attributes can be state")
            found.add(owner + (node.s("name"),))
    return found


def _thread(block, env: dict, paths: dict, types: dict) -> None:
    """Replace state reads and writes in `block` (and the blocks inside it) by SSA values; `env` maps each state
    path to its current value and is updated in place."""
    for node in list(block.nodes()):
        kind = node.kind()
        if kind == "prim::GetAttr":
            key = paths.get(node.output().unique())
            if key in env and not _is_object(node.output()):
                node.output().replaceAllUsesWith(env[key])
                node.destroy()
        elif kind == "prim::SetAttr":
            key = paths[node.inputsAt(0).unique()] + (node.s("name"),)
            env[key] = node.inputsAt(1)
            node.destroy()
        elif kind == "prim::If":
            _thread_if(node, env, paths, types)
        elif kind == "prim::Loop":
            _thread_loop(node, env, paths, types)
        elif any(True for _ in node.blocks()):
            if _written_in(node, paths):
                raise ConversionError(f"the model assigns module state inside {kind} ({_where(node)}), which "
                                      "jit2triton cannot carry out of it; assign it outside")
            for inner in node.blocks():
                _thread(inner, dict(env), paths, types)


def _written_in(node, paths: dict) -> set:
    found = set()
    for inner in node.blocks():
        found |= _written(inner, paths)
    return found


def _thread_if(node, env: dict, paths: dict, types: dict) -> None:
    branches = []
    for inner in node.blocks():
        branch_env = dict(env)
        _thread(inner, branch_env, paths, types)
        branches.append((inner, branch_env))
    for key in env:
        if any(branch_env[key].unique() != env[key].unique() for _, branch_env in branches):
            for inner, branch_env in branches:
                inner.registerOutput(branch_env[key])
            out = node.addOutput()
            out.setType(types[key])
            env[key] = out


def _thread_loop(node, env: dict, paths: dict, types: dict) -> None:
    """State written in a loop's body is loop-carried: an input of the loop, a parameter and an output of its body,
    an output of the loop."""
    body = next(iter(node.blocks()))
    carried = [key for key in env if key in _written(body, paths)]
    body_env = dict(env)
    for key in carried:
        node.addInput(env[key])
        param = body.addInputToBlock()
        param.setType(types[key])
        body_env[key] = param
    _thread(body, body_env, paths, types)
    for key in carried:
        body.registerOutput(body_env[key])
        out = node.addOutput()
        out.setType(types[key])
        env[key] = out


def _read_attribute(module: torch.jit.ScriptModule, key: tuple[str, ...], as_value: bool = True) -> Any:
    """The attribute at `key`, as the plan holds it (`_as_value`), or as torch gives it (`as_value=False`)."""
    obj = module._c
    try:
        for name in key:
            obj = obj.getattr(name)
    except RuntimeError as err:  # an object of a class Python cannot import (torch.jit.load'ed): torch cannot hand it
        raise ConversionError(f"module attribute {'.'.join(key)!r} holds an object jit2triton cannot read "
                              f"({str(err).splitlines()[0][:120]}); convert the model before running it, or "
                              "from a freshly loaded .pt") from None
    return _as_value(obj) if as_value else obj


def _script_object(obj: Any) -> bool:
    """An object of a TorchScript class, as torch hands it to Python (an instance of the class's Python twin)."""
    return hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type, torch.Tensor))


def _holds_object(obj: Any) -> bool:
    return _script_object(obj) or isinstance(obj, (list, tuple)) and any(_holds_object(v) for v in obj)


def _as_value(obj: Any) -> Any:
    """An attribute's value as the plan holds it: tensors copied, objects of TorchScript classes (a model that ran
    before it was converted cached one) as dicts of their attributes, as local_objects.py makes them."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, list):
        return [_as_value(v) for v in obj]
    if _script_object(obj):
        return {name: _as_value(v) for name, v in vars(obj).items()}
    return obj


def _type_of(slot: StateSlot):
    inferred = torch._C._jit_try_infer_type(slot.initial)
    if not inferred.success():
        raise ConversionError(f"module attribute {slot.name!r} holds a {type(slot.initial).__name__}, which "
                              "jit2triton cannot keep as state")
    return inferred.type()


def _where(node) -> str:
    try:
        source = node.sourceRange().split("\n")[0].strip()
    except Exception:  # noqa: BLE001 - a node with no source range
        source = ""
    return source or node.kind()


def restore_state(module: torch.jit.ScriptModule, slots: list[StateSlot]) -> None:
    """Put the attributes back to their saved values (verification runs each case from the saved state)."""
    for slot in slots:
        *owner_path, name = slot.name.split(".")
        owner = module._c
        for part in owner_path:
            owner = owner.getattr(part)
        if slot.saved is not None:  # (torch makes a new object of its attributes each time it is set)
            value = slot.saved
        else:
            value = slot.initial.clone() if isinstance(slot.initial, torch.Tensor) else slot.initial
        owner.setattr(name, value)


def state_values(module: torch.jit.ScriptModule, slots: list[StateSlot]) -> dict[str, Any]:
    """Every slot's current value, by name (a state to observe a method from)."""
    return {slot.name: _read_attribute(module, tuple(slot.name.split("."))) for slot in slots}


def read_state(module: torch.jit.ScriptModule, slots: list[StateSlot]) -> dict[str, Any]:
    """The written attributes' current values that verification compares, by name."""
    return {slot.name: _read_attribute(module, tuple(slot.name.split("."))) for slot in slots
            if slot.written and slot.compared}

