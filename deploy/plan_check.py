"""Every index a package's plan holds, and every shape a kernel relies on, checked once at load against what it
indexes or what the kernel was built for (the C++ runtime's check_plan in deploy/cpp/src/plan.cpp and
check_structure in deploy/cpp/src/plan_check.cpp do the same): a hand-edited manifest is refused with a clear
error, never read or written out of bounds during a call."""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

from jit2triton.errors import CorruptPackageError

from .format import BLOCK, PLAN, STEP, check_fields
from .op_facts import FORBIDDEN
from .policy import MAX_ARENA_BYTES, RECONVERT
from .resolve import interpreter_only
from .sizes import is_dynamic, shape_function

# A plan must not call an op that reaches outside the model (files, the process's random generator and autograd
# state): op_facts.FORBIDDEN, which the C++ runtime refuses too (op_facts.h). An allowlist of every op models call
# would refuse valid models with custom ops; these are refused by what they do.
ARENA_ALIGN = 64
# The container ops whose step records the type of what they build (the C++ runtime types the container by it)
CONTAINERS = {"prim::ListConstruct": "List", "prim::DictConstruct": "Dict"}
# Dims a dynamic layout is evaluated at to check it is dense: a damaged polynomial fails at these as at any size.
SAMPLE_DIMS = (2, 3)


def check_plan(plan: dict, num_nodes: int, kernels: list[dict],
               weights: Optional[dict[str, torch.Tensor]] = None) -> None:
    """`weights`: the package's, to check those a kernel reads are the dtype, shape and layout it was built for."""
    try:
        table = {k["name"]: k for k in kernels}
        if len(table) != len(kernels):  # (one runtime read the first of two entries, the other the last)
            _bad("the kernel index names a kernel twice")
        slots = plan.get("num_slots") if isinstance(plan, dict) else None
        check_fields(PLAN, plan, num_slots=slots if type(slots) is int else 0)
        dims = [d[0] for d in plan.get("dims", ())] + plan.get("bound_dims", [])
        _steps(plan["steps"], slots, num_nodes, table, weights or {}, dims)
        _arena_fits(plan)
    except (KeyError, TypeError, IndexError, AttributeError, ValueError):
        _bad("a step lacks a field it needs")


def check_inputs(plan: dict, signature: dict, state: Optional[list]) -> None:
    """The plan takes a slot per input of the signature and then per value of the module state (deploy/state.py):
    with another count a slot is never set, or an input is dropped, and the call runs on None where the model had
    a value (plan.cpp's Plan checks the same)."""
    expected = len(signature["inputs"]) + len(state or ())
    if len(plan["inputs"]) != expected:
        _bad(f"{len(plan['inputs'])} input slots where its signature and module state give {expected}")


def check_dims(plan: dict, signature: dict) -> None:
    """Each dynamic dim the plan reads at call time comes from an axis of a tensor input, and each dim's range is
    one a call can meet (the C++ runtime checks the same when it reads the plan's and the signature's dims)."""
    try:
        for _, position, axis in plan.get("dims", ()):
            inputs = signature["inputs"]
            entry = inputs[position] if type(position) is int and position >= 0 else None
            if (entry is None or entry["type"] != "Tensor" or type(axis) is not int
                    or not 0 <= axis < len(entry["shape"])):
                _bad(f"a dynamic dim read from input {position}")
    except (KeyError, TypeError, IndexError, ValueError):
        _bad("a dynamic dim's source")
    dims = signature.get("dims") or {}
    if not isinstance(dims, dict):
        raise CorruptPackageError("the package's signature is damaged (its dims); " + RECONVERT)
    for name, limits in dims.items():
        low, high = (limits.get("min"), limits.get("max")) if isinstance(limits, dict) else (None, None)
        if type(low) is not int or low < 0 or not (high is None or (type(high) is int and high >= low)):
            raise CorruptPackageError(f"the package's signature is damaged (dim {name!r}'s range); {RECONVERT}")


def _bad(what: str) -> None:
    raise CorruptPackageError(f"the package's plan is damaged ({what}); {RECONVERT}")


def _steps(steps: list, num_slots: int, num_nodes: int, table: dict[str, dict], weights: dict, dims: list) -> None:
    """`table`: kernel name -> its entry in the manifest's kernel index (buffers, sizes, inputs, outputs)."""
    for step in steps:
        check_fields(STEP, step, num_slots, num_nodes)
        kind = step["kind"]
        if kind == "call" and step.get("op") in FORBIDDEN:
            raise CorruptPackageError(
                f"the package's plan calls {step['op']}, which reaches outside the model (files, global state); a "
                "converted model never does, so the package was edited: " + RECONVERT)
        if kind == "call" and interpreter_only(step.get("op", "")):
            raise CorruptPackageError(
                f"the package's plan calls {step['op']}, which TorchScript runs only inside its interpreter (with the "
                "graph node or the interpreter's stack it needs) and no runtime can call as a plan step; a converted "
                "model never does, so the package was edited or is damaged: " + RECONVERT)
        built = CONTAINERS.get(step.get("op")) if kind == "call" else None
        if built and step.get("type") is not None and step["type"][0] != built:  # (the schema checked its form)
            _bad(f"a step building a {built} records the type {step['type'][0]}")
        if kind == "kernel":
            _kernel_step(step, table.get(step["kernel"]), weights, dims)
        if kind in ("if", "loop"):
            _control_flow(step)
        for name, index, axis in step.get("binds", ()):  # sizes a call binds from its outputs (bind_sizes.py)
            if (kind != "call" or name not in dims or type(index) is not int or not 0 <= index < len(step["outs"])
                    or type(axis) is not int or axis < 0):
                _bad("a step binds a size it cannot")
        if kind == "graph" and any(r[0] != "s" for r in step["args"]):
            _bad("a graph region reads a value that is not a slot")
        if "steps" in step:
            _steps(step["steps"], num_slots, num_nodes, table, weights, dims)
        for block in step.get("blocks", ()):
            check_fields(BLOCK, block, num_slots, num_nodes)
            _steps(block["steps"], num_slots, num_nodes, table, weights, dims)


def _kernel_step(step: dict, kernel: Optional[dict], weights: dict, dims: list) -> None:
    """The buffers a kernel step passes are the ones its kernel was built for: as many, of the kernel's dtypes and
    shapes, its outputs allocated dense (else a kernel writes past them), the layouts it checks its inputs
    against and the weights it reads exactly the kernel's."""
    name = repr(step["kernel"])
    args, outs = step["args"], step["outs"]
    if kernel is None or kernel["num_buffers"] != len(args) + len(outs):
        _bad(f"kernel step {name} passes another number of buffers than its kernel takes")
    if list(step.get("sizes", ())) != list(kernel.get("sizes", ())):
        _bad(f"kernel step {name} passes other sizes than its kernel takes")
    # (a number where a kernel reads a pointer, or the reverse, would send it through memory it does not own)
    if list(step.get("by_value", ())) != list(kernel.get("by_value", ())):
        _bad(f"kernel step {name} passes other arguments by value than its kernel takes")
    # the outputs the step allocates are the ones its kernel writes (an emptied list made a kernel write through a
    # pointer never passed; found by tests/mutate_packages.py), in a dense layout of their own
    types, written = step["out_types"], kernel.get("outputs")
    if (not isinstance(written, list) or len(types) != len(outs) or len(types) != len(written)
            or any(len(t) != 3 or [t[1], t[0]] != w for t, w in zip(types, written))
            or not all(_dense(t[0], t[2], dims) for t in types)):
        _bad(f"kernel step {name} allocates other outputs than its kernel writes")
    inputs = kernel.get("inputs")
    if inputs is None:
        return
    if len(inputs) != len(args):
        _bad(f"kernel step {name} passes other inputs than its kernel reads")
    for key, part in (("in_strides", 2), ("in_shapes", 1)):
        expected = step.get(key)
        if expected is not None and (len(expected) != len(args) or any(
                e is not None and e != buffer[part] for e, buffer in zip(expected, inputs))):
            _bad(f"kernel step {name} checks its inputs against other layouts than its kernel reads ({key})")
    for ref, (dtype, shape, strides) in zip(args, inputs):
        if ref[0] == "w" and not _fits(weights.get(ref[1]), dtype, shape, strides):
            _bad(f"kernel step {name} reads weight {ref[1]!r}, which is not the dtype, shape and layout its kernel "
                 "was built for")


def _fits(weight: Optional[torch.Tensor], dtype: str, shape: list, strides: list) -> bool:
    """A weight is what a kernel reads: its dtype and shape, and its strides on every dim longer than 1."""
    if weight is None or str(weight.dtype).removeprefix("torch.") != dtype or list(weight.shape) != shape:
        return False
    return len(strides) == len(shape) and all(n <= 1 or s == t for n, s, t in zip(shape, weight.stride(), strides))


def _dense(shape: list, strides: list, dims: list) -> bool:
    """Whether an output of `shape` laid out with `strides` covers exactly its elements, no more, no fewer: what
    a kernel writing every element assumes of the buffer it is given. A layout over dynamic dims is checked at
    sample sizes."""
    if not isinstance(shape, list) or not isinstance(strides, list) or len(shape) != len(strides):
        return False
    if not (is_dynamic(shape) or is_dynamic(strides)):
        return _dense_at(shape, strides)
    try:
        at_shape, at_strides = shape_function(shape), shape_function(strides)
        return all(_dense_at(list(at_shape(sizes)), list(at_strides(sizes)))
                   for sizes in ({d: n for d in dims} for n in SAMPLE_DIMS))
    except (KeyError, TypeError, ValueError):  # a dim the plan does not read, a malformed term
        return False


def _dense_at(shape: list, strides: list) -> bool:
    if not all(type(n) is int and n >= 0 for n in (*shape, *strides)):
        return False
    expected = 1
    for n, stride in sorted(((n, s) for n, s in zip(shape, strides) if n > 1), key=lambda p: p[1]):
        if stride != expected:
            return False
        expected *= n
    return True


def _control_flow(step: dict) -> None:
    """An `if` gives what either branch gives, a loop what its body carries: as many values as its outputs."""
    blocks, outs, args = step["blocks"], step["outs"], step["args"]
    if step["kind"] == "if":
        if len(blocks) != 2 or len(args) != 1 or any(len(b["outputs"]) != len(outs) for b in blocks):
            _bad("an if step gives another number of values than its branches")
        return
    carried = len(args) - 2
    if (len(blocks) != 1 or carried < 0 or len(outs) != carried or len(blocks[0]["inputs"]) != carried + 1
            or len(blocks[0]["outputs"]) != carried + 1):
        _bad("a loop step carries another number of values than its body")


def _arena_fits(plan: dict) -> None:
    """Each output planned into the arena lies inside it, aligned, and the arena is no larger than they need (rounded
    up to its alignment): a damaged size would allocate what no buffer uses. The C++ runtime places the outputs
    there (plan.cpp checks the same as it does); the Python one allocates each afresh but refuses what C++ refuses."""
    arena = plan.get("arena")
    if arena is None:
        return
    size = arena.get("bytes") if isinstance(arena, dict) else None
    if type(size) is not int or not 0 <= size <= MAX_ARENA_BYTES or size % ARENA_ALIGN:
        _bad("its arena")
    end = 0
    pending = list(plan["steps"])
    while pending:
        step = pending.pop()
        pending += step.get("steps", [])
        for block in step.get("blocks", []):
            pending += block["steps"]
        offsets, types = step.get("arena"), step.get("out_types", ())
        if offsets is None or size == 0:  # (an empty arena places nothing: every output is allocated)
            continue
        if not isinstance(offsets, list) or len(offsets) != len(types):
            _bad("its arena")
        for offset, (shape, dtype, strides) in zip(offsets, types):
            if offset is None:
                continue
            if (type(offset) is not int or offset < 0 or offset % ARENA_ALIGN or offset > size or len(shape) != len(strides)
                    or not all(type(n) is int and n >= 0 for n in (*shape, *strides))):
                _bad("its arena")
            if all(shape):
                span = 1 + sum((n - 1) * s for n, s in zip(shape, strides))
                end = max(end, offset + span * getattr(torch, dtype).itemsize)
                if end > size:
                    _bad("its arena")
    if size > math.ceil(end / ARENA_ALIGN) * ARENA_ALIGN:
        _bad("its arena is larger than the outputs planned into it")


MAX_OUTPUT_DEPTH = 100  # kMaxOutputDepth in deploy/cpp/src/module.cpp


def check_finite_nesting(value: Any) -> None:
    """Refuse an output holding a list, tuple or dict inside itself (or nested past any model's depth): only a
    damaged plan builds one (TorchScript's types cannot express it), as a list stored into itself by an edited
    argument; the C++ runtime refuses the same, where whatever walks it next would recurse without end."""
    _walk(value, 0, set(), set())


def _walk(value: Any, depth: int, open_: set, done: set) -> None:
    if not isinstance(value, (list, tuple, dict)) or id(value) in done:
        return
    if id(value) in open_ or depth > MAX_OUTPUT_DEPTH:
        raise CorruptPackageError("the model's output holds a list, tuple or dict inside itself, which no TorchScript "
                                  "model can return: the package's plan is damaged; " + RECONVERT)
    open_.add(id(value))
    for item in value.values() if isinstance(value, dict) else value:
        _walk(item, depth + 1, open_, done)
    open_.discard(id(value))
    done.add(id(value))
