"""Every index a package's plan holds, checked once at load against what it indexes (the C++ runtime's check_plan in
deploy/cpp/src/plan.cpp does the same): a hand-edited manifest is refused with a clear error, never read out of
bounds during a call."""
from __future__ import annotations

from typing import Any

from jit2triton.errors import CorruptPackageError

from .policy import MAX_SLOTS

# Ops a converted model never needs and a plan must not call: they reach outside the model (files, the process's
# random generator and autograd state). The C++ runtime refuses the same list (kSideEffectOps in plan.cpp; a test
# keeps the two equal). An allowlist of every op models call would refuse valid models with custom ops; these are
# refused by what they do.
SIDE_EFFECT_OPS = frozenset({"aten::save", "aten::from_file", "aten::from_file.out", "aten::manual_seed",
                             "aten::manual_seed.generator", "aten::seed", "aten::set_grad_enabled"})


def check_plan(plan: dict, num_nodes: int, kernels: list[dict]) -> None:
    try:
        buffers = {k["name"]: (k["num_buffers"], list(k.get("sizes", ())), k.get("outputs")) for k in kernels}
        slots = plan["num_slots"]
        if type(slots) is not int or not 0 <= slots <= MAX_SLOTS:
            _bad("num_slots")
        for slot in plan["inputs"]:
            _slot(slot, slots)
        _refs(plan["outputs"], slots)
        _steps(plan["steps"], slots, num_nodes, buffers)
    except (KeyError, TypeError, IndexError, AttributeError):
        _bad("a step lacks a field it needs")


def check_dims(plan: dict, signature_inputs: list[dict]) -> None:
    """Each dynamic dim the plan reads at call time comes from an axis of a tensor input (the C++ runtime checks the
    same when it reads the plan's dims)."""
    try:
        for _, position, axis in plan.get("dims", ()):
            entry = signature_inputs[position] if type(position) is int and position >= 0 else None
            if (entry is None or entry["type"] != "Tensor" or type(axis) is not int
                    or not 0 <= axis < len(entry["shape"])):
                _bad(f"a dynamic dim read from input {position}")
    except (KeyError, TypeError, IndexError, ValueError):
        _bad("a dynamic dim's source")


def _bad(what: str) -> None:
    raise CorruptPackageError(f"the package's plan is damaged ({what}); re-run `jit2triton convert`")


def _slot(value: Any, num_slots: int) -> None:
    if type(value) is not int or not 0 <= value < num_slots:
        _bad(f"a slot outside 0..{num_slots - 1}")


def _refs(refs: list, num_slots: int) -> None:
    for ref in refs:
        if isinstance(ref, (list, tuple)) and len(ref) == 2 and ref[0] == "s":
            _slot(ref[1], num_slots)


def _steps(steps: list, num_slots: int, num_nodes: int, buffers: dict[str, tuple]) -> None:
    """`buffers`: kernel name -> (its number of buffers, the dynamic dims it takes, its outputs' [dtype, shape])."""
    for step in steps:
        if step.get("kind") == "call" and step.get("op") in SIDE_EFFECT_OPS:
            raise CorruptPackageError(
                f"the package's plan calls {step['op']}, which reaches outside the model (files, global state); a "
                "converted model never does, so the package was edited: re-run `jit2triton convert`")
        if step.get("kind") == "kernel":
            arity = buffers.get(step["kernel"])
            if arity is None or arity[0] != len(step["args"]) + len(step["outs"]):
                _bad(f"kernel step {step['kernel']!r} passes another number of buffers than its kernel takes")
            if list(step.get("sizes", ())) != arity[1]:
                _bad(f"kernel step {step['kernel']!r} passes other sizes than its kernel takes")
            # the outputs the step allocates are the ones its kernel writes (an emptied list made a kernel write
            # through a pointer never passed; found by tests/mutate_packages.py)
            types, written = step["out_types"], arity[2]
            if (not isinstance(written, list) or len(types) != len(step["outs"]) or len(types) != len(written)
                    or any(len(t) != 3 or [t[1], t[0]] != w for t, w in zip(types, written))):
                _bad(f"kernel step {step['kernel']!r} allocates other outputs than its kernel writes")
        node = step.get("node")
        if type(node) is not int or not 0 <= node < num_nodes:
            _bad("a step names a node that is not in the node table")
        _refs(step.get("args", ()), num_slots)
        for key in ("outs", "free"):
            for slot in step.get(key, ()):
                _slot(slot, num_slots)
        if "steps" in step:
            _steps(step["steps"], num_slots, num_nodes, buffers)
        for block in step.get("blocks", ()):
            for slot in block["inputs"]:
                _slot(slot, num_slots)
            _refs(block["outputs"], num_slots)
            _steps(block["steps"], num_slots, num_nodes, buffers)
