"""Symbolic sizes: a dim that depends on the package's dynamic dims, as a small integer polynomial over them.

`SymSize` is what a dynamic dim of an IR type holds (`batch`, `12*batch`, `seq + 1`, `batch*seq*768`): a sum of
integer-weighted products of dim names, kept in one canonical order so equal sizes compare and hash equal. The
package stores it as plain data (`[[coef, [name, ...]], ...]`) that both runtimes evaluate with a few lines of code.

Sizes are found by observation (see infer_shapes.py): the model runs at several draws of the dynamic dims, and
each size that varied is fitted here to the simplest polynomial that gives its value at every draw.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Optional, Sequence, Union

Term = tuple[int, tuple[str, ...]]  # coefficient, the names multiplied (sorted, repeats for powers)


@dataclass(frozen=True)
class SymSize:
    terms: tuple[Term, ...]

    @staticmethod
    def of(terms: Sequence[Term]) -> Union[int, "SymSize"]:
        """The canonical size of `terms` (like terms added, zeros dropped): an int when no name is left."""
        total: dict[tuple[str, ...], int] = {}
        for coef, names in terms:
            key = tuple(sorted(names))
            total[key] = total.get(key, 0) + coef
        kept = tuple(sorted(((c, k) for k, c in total.items() if c), key=lambda t: (-len(t[1]), t[1])))
        if not kept:
            return 0
        if len(kept) == 1 and not kept[0][1]:
            return kept[0][0]
        return SymSize(kept)

    @staticmethod
    def symbol(name: str) -> "SymSize":
        return SymSize(((1, (name,)),))

    @property
    def names(self) -> frozenset[str]:
        return frozenset(n for _, names in self.terms for n in names)

    def evaluate(self, sizes: Mapping[str, int]) -> int:
        return sum(coef * math.prod(sizes[n] for n in names) for coef, names in self.terms)

    def to_json(self) -> list:
        return [[coef, list(names)] for coef, names in self.terms]

    # arithmetic with ints and other sizes, so shape code (products of dims, strides) works on either
    def __add__(self, other): return SymSize.of(self.terms + _terms(other))
    __radd__ = __add__
    def __mul__(self, other): return SymSize.of([(c1 * c2, n1 + n2) for c1, n1 in self.terms for c2, n2 in _terms(other)])
    __rmul__ = __mul__
    def __neg__(self): return SymSize.of([(-c, n) for c, n in self.terms])
    def __sub__(self, other): return self + (-other)
    def __rsub__(self, other): return (-self) + other

    def __str__(self) -> str:
        parts = []
        for coef, names in self.terms:
            factors = ([] if coef == 1 and names else [str(coef)]) + list(names)
            parts.append("*".join(factors))
        return " + ".join(parts).replace("+ -", "- ")

    def __repr__(self) -> str:
        return str(self)


def _terms(x: Union[int, SymSize]) -> tuple[Term, ...]:
    if isinstance(x, SymSize):
        return x.terms
    if isinstance(x, int):
        return ((x, ()),)
    return NotImplemented


def at_least_one(size):
    """max(size, 1) for a dim; a dynamic dim's own minimum is at least 1."""
    return max(size, 1) if isinstance(size, int) else size


Size = Union[int, SymSize, str]  # str: a size that varies in a way no polynomial here explains (opaque)


def at_example(dims: Sequence[Size], sizes: Mapping[str, int]) -> Optional[list[int]]:
    """Sizes (a shape, strides) at the example's dynamic dims; None when one is opaque (a floor division of a dim,
    say, whose value is not known from the dims alone)."""
    out = [n.evaluate(sizes) if isinstance(n, SymSize) else n for n in dims]
    return out if all(isinstance(n, int) for n in out) else None


def size_json(size: Size) -> Union[int, str, list]:
    return size.to_json() if isinstance(size, SymSize) else size


MAX_POWER = 2  # per name: seq*seq (attention scores flattened) is the highest power a fitted size may have


def fit(values: Sequence[int], draws: Sequence[Mapping[str, int]]) -> Optional[Size]:
    """The simplest size that is values[k] at draws[k] for every k: an int when they all agree, else `c*m + d`
    or `c1*m1 + c2*m2 + d` over monomials m of the draws' names; None when no such form fits every draw."""
    if len(set(values)) == 1:
        return values[0]
    names = sorted(set().union(*draws))
    monomials = [m for m in _monomials(names) if len({_value(m, d) for d in draws}) > 1]
    for count in (1, 2):
        if len(draws) < count + 2:  # one more draw than unknowns, so a fit is checked, not just solved
            break
        for chosen in itertools.combinations(monomials, count):
            coefs = _solve(chosen, values, draws)
            if coefs is not None:
                return SymSize.of([(c, m) for c, m in zip(coefs, chosen + ((),))])
    return None


def _monomials(names: list[str]) -> list[tuple[str, ...]]:
    found = []
    for powers in itertools.product(range(MAX_POWER + 1), repeat=len(names)):
        if any(powers):
            found.append(tuple(n for n, p in zip(names, powers) for _ in range(p)))
    return sorted(found, key=lambda m: (len(m), m))


def _value(monomial: tuple[str, ...], draw: Mapping[str, int]) -> int:
    return math.prod(draw[n] for n in monomial)


def _solve(monomials: tuple, values: Sequence[int], draws: Sequence[Mapping[str, int]]) -> Optional[list[int]]:
    """Integer coefficients (one per monomial, then a constant) that give every value exactly, or None."""
    from fractions import Fraction
    rows = [[Fraction(_value(m, d)) for m in monomials] + [Fraction(1)] for d in draws]
    n = len(monomials) + 1
    # Gaussian elimination; the rows left over check the answer.
    basis: list[int] = []
    matrix = [row[:] + [Fraction(v)] for row, v in zip(rows, values)]
    pivot_rows = []
    for col in range(n):
        pivot = next((r for r in range(len(matrix)) if r not in pivot_rows and matrix[r][col] != 0), None)
        if pivot is None:
            return None
        pivot_rows.append(pivot)
        basis.append(col)
        for r in range(len(matrix)):
            if r != pivot and matrix[r][col] != 0:
                factor = matrix[r][col] / matrix[pivot][col]
                matrix[r] = [a - factor * b for a, b in zip(matrix[r], matrix[pivot])]
    coefs = []
    for col, r in zip(basis, pivot_rows):
        value = matrix[r][n] / matrix[r][col]
        if value.denominator != 1:
            return None
        coefs.append(int(value))
    if any(sum(c * x for c, x in zip(coefs, row)) != v for row, v in zip(rows, values)):
        return None
    return coefs
