"""A C++ pointwise kernel whose innermost dim its reads take apart by a constant is swept as two loops.

`x.transpose(1, 2).reshape(b, s, h * d)` times 2 (an attention's heads merged) writes its output's last dim of
h * d elements, and reads element j at `(j // d) * (s * d) + j % d`: a gather the compiler does not vectorize, so
every element paid a scalar load (and a scalar `tanhf` where the kernel applies one). Swept as h rows of d
elements, `j = jo * d + ji`, the read is dense in `ji` as the write is, and the loop vectorizes. The same points
are computed by the same operations in the same order: only the loop nest changes (the index rules fold
`(jo * d + ji) // d` to `jo` and `% d` to `ji`).

Taken for kernels of expressions without reductions whose innermost range is static, where some division or modulo
of an expression of the innermost variable is by a constant `d` that divides its range (the largest such), with `d`
at least MIN_INNER so that the inner loop still fills vectors.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from jit2triton.transpiler import kernel_ir as K

MIN_INNER = 16  # the shortest inner loop worth a split: below, a loop of a few lanes loses what the gather did


def split_sweep(kernel: K.Kernel) -> K.Kernel:
    """The kernel with its innermost range split at the divisor its reads take it apart by, or itself."""
    if type(kernel) is not K.Kernel or not kernel.ranges or any(K.reductions_in(v) for v in kernel.values):
        return kernel
    v = kernel.ranges[-1]
    n = v.arg[1]
    if not isinstance(n, int):
        return kernel
    divisor = _divisor(kernel, v, n)
    if divisor is None:
        return kernel
    outer, inner = K.var(f"{v.arg[0]}o", n // divisor), K.var(f"{v.arg[0]}i", divisor)
    joined = K.add(K.mul(outer, K.const(divisor, K.INT)), inner)
    memo: dict[int, K.KExpr] = {}
    return dataclasses.replace(
        kernel, ranges=kernel.ranges[:-1] + (outer, inner),
        index=tuple(joined if x is v else x for x in kernel.index),
        values=[K.substitute(x, v, joined, memo) for x in kernel.values])


def _divisor(kernel: K.Kernel, v: K.KExpr, n: int) -> Optional[int]:
    found = [x.args[1].arg for x in K.nodes_in(*kernel.values)
             if x.op in ("index_div", "index_mod") and x.args[1].op == "const" and v in K.free_vars(x.args[0])]
    fitting = [d for d in found if isinstance(d, int) and MIN_INNER <= d < n and n % d == 0]
    return max(fitting) if fitting else None


