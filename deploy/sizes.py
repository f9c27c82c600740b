"""Dynamic sizes at run time: a package's plan names a size either as an int or, when it depends on the dynamic
dims, as a polynomial `[[coef, [dim, ...]], ...]` (transpiler/symbolic.py's SymSize as data). Each is turned into
a function of one call's dims once, at load; a call evaluates only what its kernels need."""
from __future__ import annotations

import math
from typing import Callable, Union

Sizes = dict  # dim name -> its size in this call
SizeRef = Union[int, list]


def is_dynamic(entries) -> bool:
    return any(isinstance(n, list) for n in entries)


def size_function(n: SizeRef) -> Callable[[Sizes], int]:
    if isinstance(n, int):
        return lambda sizes: n
    terms = [(int(coef), tuple(names)) for coef, names in n]
    return lambda sizes: sum(coef * math.prod(sizes[d] for d in names) for coef, names in terms)


def shape_function(entries: list) -> Callable[[Sizes], tuple]:
    """A shape or strides list as a function of the call's dims (a constant tuple's function when static)."""
    if not is_dynamic(entries):
        fixed = tuple(entries)
        return lambda sizes: fixed
    parts = [size_function(n) for n in entries]
    return lambda sizes: tuple(f(sizes) for f in parts)


def positional_size_function(n: SizeRef, names: list) -> Callable[[list], int]:
    """A size as a function of dim values given as a list in `names`' order (how kernels receive them)."""
    if isinstance(n, int):
        return lambda values: n
    where = {name: i for i, name in enumerate(names)}
    terms = [(int(coef), tuple(where[d] for d in dims)) for coef, dims in n]
    return lambda values: sum(coef * math.prod(values[i] for i in at) for coef, at in terms)
