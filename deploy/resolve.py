"""Find the callable behind an op name: the runtime's own host ops first, then ATen through `torch.ops`.

Only an op in torch's operator registry (the schemas TorchScript itself resolves, as the C++ runtime's
findOperatorFor does) is looked up in `torch.ops`: a name is data from the package, and `torch.ops` has attributes
that are not ops (`torch.ops.load_library`, `torch.ops.import_module`), which a plan must never reach.
"""
from __future__ import annotations

from typing import Callable, Iterator

import torch

from jit2triton.errors import PackageError

from .host_ops import HOST_OPS
from .op_facts import NODE_ATTRIBUTE_OPS
from .policy import RUNTIME_NAMESPACE, unknown_op


def resolve_op(op: str) -> Callable:
    """`aten::add.Tensor` -> torch.ops.aten.add.Tensor. Raises PackageError naming the op if it does not exist."""
    if op in HOST_OPS:
        return _typed(op, HOST_OPS[op])
    namespace, _, rest = op.partition("::")
    if namespace == RUNTIME_NAMESPACE:  # the runtime's own ops: registered with torch when it loads
        from .cpp_runtime import extension
        extension()
    name, _, overload = rest.partition(".")
    qualified = f"{namespace}::{name}"
    if any(schema.overload_name == overload for schema in _schemas(qualified)):
        try:
            fn = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
        except (AttributeError, RuntimeError):
            fn = None
        if isinstance(fn, torch._ops.OpOverload) and fn._schema.name == qualified \
                and fn._schema.overload_name == overload:
            # (arithmetic on numbers only: where an op takes a tensor, its dtype or layout arguments are "int" in
            # the schema and torch objects here)
            numbers_only = all(str(a.type) in _SCALARS for a in fn._schema.arguments)
            return _typed(op, fn) if numbers_only else fn
    raise PackageError(unknown_op(op, torch.__version__))


def check_plan_ops(plan: dict) -> None:
    """Every op the plan's call steps name resolves here (blocks included): a package whose library is not loaded
    (torchvision::nms before `import torchvision`) is refused before a server starts replicas that would each fail."""
    for step in call_steps(plan):
        if step["op"].partition("::")[0] != RUNTIME_NAMESPACE:  # (the runtime's own: there when it loads)
            resolve_op(step["op"])


def call_steps(plan: dict) -> Iterator[dict]:
    """The plan's call steps, in order, those in blocks included. A plan of another shape yields what it can: the
    runtime's checks at load refuse it, in their words."""
    for step in plan.get("steps") or () if isinstance(plan, dict) else ():
        if not isinstance(step, dict):
            continue
        if step.get("kind") == "call" and isinstance(step.get("op"), str):
            yield step
        for block in step.get("blocks") or ():
            yield from call_steps(block)
        if "steps" in step:
            yield from call_steps(step)


def interpreter_only(op: str) -> bool:
    """Whether `op` is one of TorchScript's interpreter's own prim:: ops that no runtime can call as a plan step:
    not one the runtime runs itself (HOST_OPS), and either no registered op at all (prim::fork, an interpreter
    instruction), of a variadic schema (made for the interpreter's stack: a fusion group, a bailout, an RPC, whose
    operation TorchScript makes from the graph node), or one whose operation reads the node (NODE_ATTRIBUTE_OPS).
    Called with no node, such an operation reads through a null pointer: a crash, not an error."""
    if not op.startswith("prim::") or op in HOST_OPS:
        return False
    name, _, overload = op.partition(".")
    found = [s for s in _schemas(name) if s.overload_name == overload]
    return not found or _variadic(found[0]) or op in NODE_ATTRIBUTE_OPS


def _variadic(schema) -> bool:
    return str(schema).partition(" -> ")[0].endswith("...)")  # (the Python binding does not expose is_vararg)


# TorchScript's scalar types, and the Python types a value of each is (a bool is no int there; a dtype, a layout
# and a memory format are ints to TorchScript, `x.dtype != torch.bool` an aten::ne.int)
_SCALARS = {"int": (int, torch.dtype, torch.layout, torch.memory_format), "float": (float,), "bool": (bool,)}


def _typed(op: str, fn: Callable) -> Callable:
    """A host op that refuses a number of another type than its schema's (a bool, a tensor or a list where it takes
    an int), as TorchScript's operator and the C++ runtime's do, where Python's operators would compute something
    (tests/test_runtime_refusals.py: a plan edited to pass another slot there)."""
    name, _, overload = op.partition(".")
    schema = next((s for s in _schemas(name) if s.overload_name == overload), None)
    checks = [(i, _SCALARS[str(a.type)], a.name) for i, a in enumerate(schema.arguments if schema else ())
              if str(a.type) in _SCALARS and not a.kwarg_only]
    if not checks:
        return fn

    def typed(*args, **named):
        for i, kind, arg in checks:
            if i < len(args) and type(args[i]) not in kind:
                raise TypeError(f"{op} takes {kind[0].__name__} {arg}, and was given {type(args[i]).__name__}")
        return fn(*args, **named)
    return typed


def _schemas(qualified: str) -> list:
    try:
        return torch._C._jit_get_schemas_for_operator(qualified)
    except (RuntimeError, ValueError):  # not a qualified name at all ("x", "::")
        return []
