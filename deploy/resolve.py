"""Find the callable behind an op name: the runtime's own host ops first, then ATen through `torch.ops`."""
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
    try:
        packet = getattr(getattr(torch.ops, namespace), name)
        return getattr(packet, overload or "default")
    except (AttributeError, RuntimeError):
        raise PackageError(
            f"op {op!r} does not exist in this torch ({torch.__version__}); the package needs a torch that has it "
            "(convert and run with the same torch version)") from None
