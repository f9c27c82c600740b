"""Find the callable behind an op name: the runtime's own host ops first, then ATen through `torch.ops`.

Only an op in torch's operator registry (the schemas TorchScript itself resolves, as the C++ runtime's
findOperatorFor does) is looked up in `torch.ops`: a name is data from the package, and `torch.ops` has attributes
that are not ops (`torch.ops.load_library`, `torch.ops.import_module`), which a plan must never reach.
"""
from __future__ import annotations

from typing import Callable

import torch

from jit2triton.errors import PackageError

from .host_ops import HOST_OPS


def resolve_op(op: str) -> Callable:
    """`aten::add.Tensor` -> torch.ops.aten.add.Tensor. Raises PackageError naming the op if it does not exist."""
    if op in HOST_OPS:
        return HOST_OPS[op]
    namespace, _, rest = op.partition("::")
    name, _, overload = rest.partition(".")
    qualified = f"{namespace}::{name}"
    if any(schema.overload_name == overload for schema in _schemas(qualified)):
        try:
            fn = getattr(getattr(getattr(torch.ops, namespace), name), overload or "default")
        except (AttributeError, RuntimeError):
            fn = None
        if isinstance(fn, torch._ops.OpOverload) and fn._schema.name == qualified \
                and fn._schema.overload_name == overload:
            return fn
    raise PackageError(
        f"op {op!r} does not exist in this torch ({torch.__version__}); the package needs a torch that has it "
        "(convert and run with the same torch version)")


def _schemas(qualified: str) -> list:
    try:
        return torch._C._jit_get_schemas_for_operator(qualified)
    except (RuntimeError, ValueError):  # not a qualified name at all ("x", "::")
        return []
