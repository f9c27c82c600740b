"""The kernel IR's algebra (transpiler/kernel_ir.py), built directly: a sum of products whose factors read
different reduced variables becomes a product of sums (an outer product summed over both its dims costs O(n), not
O(n^2)); checked on the expression it builds, on its values, and on the C++ a zoo model compiles to."""
from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

import jit2triton
from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.symbolic import SymSize

from helpers import EXAMPLE_SEED, assert_same_outputs, copied, fresh_calls
from models import MODELS


def reduced_vars(reduction: K.KExpr) -> tuple:
    return reduction.arg[1]


def loop_trips(x: K.KExpr) -> int:
    """How many body evaluations the reductions in x cost per output element."""
    return sum(math.prod(v.arg[1] for v in reduced_vars(r)) for r in K.reductions_in(x))


def evaluate(x: K.KExpr, buffers: dict[str, torch.Tensor], env: dict) -> float:
    """The value of x at one point (env: loop var -> index): a small interpreter of the ops these tests build."""
    if x.op in ("var", "sym"):  # (a dynamic size: its value at this point, keyed by its node)
        return env[x]
    if x.op == "const":
        return x.arg
    if x.op == "load":
        return buffers[x.arg].flatten()[int(evaluate(x.args[0], buffers, env))].item()
    if x.op in ("add", "mul", "index_div", "index_mod"):
        a, b = (evaluate(arg, buffers, env) for arg in x.args)
        return {"add": a + b, "mul": a * b}.get(x.op) if x.op in ("add", "mul") else a // b if x.op == "index_div" \
            else a % b
    if x.op == "reduce":
        assert x.arg[0] == "sum", x
        variables = reduced_vars(x)
        return sum(evaluate(x.args[0], buffers, {**env, **dict(zip(variables, point))})
                   for point in itertools.product(*(range(v.arg[1]) for v in variables)))
    raise AssertionError(f"the test's interpreter does not know {x.op}")


def test_an_outer_product_summed_over_both_dims_is_a_product_of_two_sums() -> None:
    i, r, s = K.var("i", 64), K.var("r", 64), K.var("s", 64)
    a = K.load("buf_a", i * 64 + r, "float32")  # a(i, r): i is the output's, r reduced
    b = K.load("buf_b", s, "float32")  # b(s)
    total = K.reduce("sum", K.op("mul", a, b), (r, s), "float32")
    assert total.op == "mul", f"not factored: {total!r}"
    factors = sorted(total.args, key=lambda f: [v.arg[0] for v in reduced_vars(K.reductions_in(f)[0])])
    for factor, var, buffer in zip(factors, (r, s), ("buf_a", "buf_b")):
        inner = K.reductions_in(factor)
        assert len(inner) == 1 and inner[0].arg[0] == "sum" and reduced_vars(inner[0]) == (var,), factor
        assert K.loads_in(factor) == {buffer}, factor
    assert K.free_vars(total) == frozenset([i])
    # two 64-long sums, not one over 64 x 64
    assert len(K.reductions_in(total)) == 2 and loop_trips(total) == 64 + 64, total


def test_a_factored_sum_keeps_its_value() -> None:
    i, r, s, t = K.var("i", 3), K.var("r", 5), K.var("s", 4), K.var("t", 2)
    buffers = {"buf_a": torch.randn(3, 5, dtype=torch.float64), "buf_b": torch.randn(4, dtype=torch.float64)}
    a, b = K.load("buf_a", i * 5 + r, "float64"), K.load("buf_b", s, "float64")
    outer = buffers["buf_a"][:, :, None] * buffers["buf_b"][None, None, :]
    # t is reduced but read by neither factor: the sum adds the same product t's size times
    cases = {(r, s): outer.sum(dim=(1, 2)), (r, s, t): 2 * outer.sum(dim=(1, 2)), (r,): None}
    for rvars, expected in cases.items():
        total = K.reduce("sum", K.op("mul", a, b), rvars, "float64")
        if expected is None:  # only a reads r: b(s) moves out of the sum, s stays the output's
            expected = buffers["buf_a"].sum(dim=1)[:, None] * buffers["buf_b"][None, :]
            assert total.op == "mul" and K.free_vars(total) == frozenset([i, s]), total
            got = torch.tensor([[evaluate(total, buffers, {i: x, s: y}) for y in range(4)] for x in range(3)],
                               dtype=torch.float64)
        else:
            got = torch.tensor([evaluate(total, buffers, {i: x}) for x in range(3)], dtype=torch.float64)
        torch.testing.assert_close(got, expected, msg=lambda m: f"sum over {rvars}: {m}")


def test_sums_that_do_not_split_stay_one_reduction() -> None:
    r, s = K.var("r", 8), K.var("s", 8)
    a_rs = K.load("buf_a", r * 8 + s, "float32")  # reads both reduced vars: nothing to split
    b = K.load("buf_b", s, "float32")
    shared = K.reduce("sum", K.op("mul", a_rs, b), (r, s), "float32")
    assert shared.op == "reduce" and set(reduced_vars(shared)) == {r, s}, shared
    a = K.load("buf_a", r, "float32")
    for reduction in ("max", "min", "prod"):  # only a sum distributes over a product
        kept = K.reduce(reduction, K.op("mul", a, b), (r, s), "float32")
        assert kept.op == "reduce" and kept.arg[0] == reduction, kept
    sum_of_sum = K.reduce("sum", K.op("add", a, b), (r, s), "float32")
    assert sum_of_sum.op == "reduce", sum_of_sum


def _reduction_loops(code: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The C++ renderer's reduction loops (`for (int64_t r3_0 = 0; r3_0 < 40; ++r3_0) {`): every loop's trip count,
    and (outer, inner) trip counts of each loop whose body starts with another reduction loop."""
    loop = re.compile(r"^\s*for \(int64_t (r\d+_\d+) = 0; \1 < (\d+); \+\+\1\) \{$")
    lines = code.splitlines()
    trips, nested = [], []
    for line, following in zip(lines, lines[1:] + [""]):
        outer = loop.match(line)
        if outer:
            trips.append(int(outer.group(2)))
            inner = loop.match(following)
            if inner:
                nested.append((int(outer.group(2)), int(inner.group(2))))
    return trips, nested


def test_the_zoos_summed_outer_product_compiles_to_two_single_loops(tmp_path) -> None:
    """numpy_fn sums w[:, :, None] * b[:, None, :] over both dims: per output row, two loops over the row (40
    each), not one loop inside another (1600 steps)."""
    spec = next(s for s in MODELS if s.name == "numpy_fn")
    torch.manual_seed(EXAMPLE_SEED)
    model, example = spec.build()
    columns = example[0].shape[1]
    converted = jit2triton.convert(model, example_inputs=example, backend="cpp")
    trips, nested = _reduction_loops(converted.code)
    assert trips.count(columns) >= 2, f"the renderer's loops changed shape: update _reduction_loops\n{converted.code}"
    assert (columns, columns) not in nested, f"a {columns} x {columns} reduction loop nest:\n{converted.code}"
    for call in fresh_calls(spec, example):
        assert_same_outputs(converted(*copied(call)), model(*copied(call)), spec)


# --- the simplification rules, one case each: it must fire, and keep the value ---------------------------------

def _rule_cases():
    i, j = K.var("i", 4), K.var("j", 8)
    r, s = K.var("r", 3), K.var("s", 5)
    size = K.sym("n")  # a size known only at run time: the rules' test runs it over SIZES
    t = K.var("t", SymSize.symbol("n"))  # a loop variable over it
    c = lambda v: K.const(v, K.INT)  # noqa: E731
    product = lambda: K.op("mul", K.load("buf_a", r, "float64"), K.load("buf_b", s, "float64"))  # noqa: E731
    return {
        "fold_add": lambda: K.add(c(2), c(3)),
        "add_zero": lambda: K.add(i, c(0)),
        "add_constant_last": lambda: K.add(c(3), i),
        "add_constants_together": lambda: K.add(K.add(i, c(4)), c(-4)),
        "recombine_div_mod": lambda: K.add(K.add(K.mul(K.floordiv(j, 4), c(12)), c(5)), K.mul(K.mod(j, 4), c(3))),
        "fold_mul": lambda: K.mul(c(2), c(3)),
        "mul_constant_last": lambda: K.mul(c(3), i),
        "mul_zero": lambda: K.mul(i, c(0)),
        "mul_one": lambda: K.mul(i, c(1)),
        "distribute_stride": lambda: K.mul(K.add(i, j), K.mul(size, c(3))),
        "div_one": lambda: K.floordiv(i, 1),
        "div_small": lambda: K.floordiv(i, 8),
        "fold_div": lambda: K.floordiv(c(17), 5),
        "div_multiples": lambda: K.floordiv(i * 8 + j, 4),
        "div_dynamic_multiples": lambda: K.floordiv(K.add(K.mul(i, K.mul(size, c(6))), K.add(K.mul(j, size), t)),
                                                   K.mul(size, c(2))),
        "div_below_dynamic_size": lambda: K.floordiv(K.floordiv(K.mod(i * 8 + j, K.mul(size, size)), size), size),
        "mod_one": lambda: K.mod(i, 1),
        "mod_small": lambda: K.mod(i, 8),
        "fold_mod": lambda: K.mod(c(17), 5),
        "mod_multiples": lambda: K.mod(i * 8 + j, 4),
        "mod_dynamic_multiples": lambda: K.mod(K.add(K.mul(i, K.mul(size, c(6))), K.add(K.mul(j, size), t)),
                                               K.mul(size, c(2))),
        "mod_below_dynamic_size": lambda: K.mod(t, size),
        "factor_sum_of_products": lambda: K.reduce("sum", product(), (r, s), "float64"),
    }


def test_every_simplification_rule_has_a_case() -> None:
    assert set(_rule_cases()) == {rule.name for rule in K.RULES}


@pytest.mark.parametrize("name", [rule.name for rule in K.RULES])
def test_a_simplification_rule_fires_and_keeps_the_value(name: str) -> None:
    build = _rule_cases()[name]
    simplified = build()
    with K.rules_disabled(name):
        plain = build()
    assert K.rule(name).enabled, "the switch was not restored"
    assert simplified is not plain, f"{name} changed nothing: {simplified!r}"
    buffers = {"buf_a": torch.randn(3, dtype=torch.float64), "buf_b": torch.randn(5, dtype=torch.float64)}
    _assert_same_values(plain, simplified, buffers, name)


SIZES = range(1, 7)  # the values a dynamic size takes in the rules' tests


def _assert_same_values(plain: K.KExpr, simplified: K.KExpr, buffers: dict, name: str) -> None:
    """Equal at every point of the loop variables' ranges and, for a dynamic size, at each of SIZES."""
    variables = sorted(K.free_vars(plain) | K.free_vars(simplified), key=lambda v: v.arg[0])
    sizes = sorted({n for n in K.nodes_in(plain, simplified) if n.op == "sym"} |
                   {K.sym(s) for v in variables if isinstance(v.arg[1], SymSize) for s in v.arg[1].names},
                   key=lambda n: n.arg)
    for at in itertools.product(*(SIZES for _ in sizes)):
        values = {n.arg: value for n, value in zip(sizes, at)}  # a variable over a dynamic size ranges over its value
        ranges = [range(v.arg[1].evaluate(values) if isinstance(v.arg[1], SymSize) else v.arg[1]) for v in variables]
        for point in itertools.product(*ranges):
            env = {**dict(zip(variables, point)), **dict(zip(sizes, at))}
            expected, got = evaluate(plain, buffers, env), evaluate(simplified, buffers, env)
            assert math.isclose(got, expected, rel_tol=1e-12), f"{name} at {env}: {got} != {expected}"


def test_a_quotient_by_a_dynamic_size_is_bounded_by_the_range_over_it() -> None:
    """r over 4*h*w: r // (h*w) is below 4 (a group's channel), so its % 4 and // 4 fold away."""
    h, w = SymSize.symbol("h"), SymSize.symbol("w")
    r = K.var("r", SymSize.symbol("h") * SymSize.symbol("w") * 4)
    channel = K.floordiv(r, K.mul(K.size(h), K.size(w)))
    assert K.bounds(channel) == (0, 3)
    assert K.mod(channel, 4) is channel and K.floordiv(channel, 4) is K.const(0, K.INT)
    # a flattened image's pixel p over h*w (ViT's patches): its row p // w is below h
    p = K.var("p", h * w)
    row = K.floordiv(p, K.size(w))
    assert K.mod(row, K.size(h)) is row and K.floordiv(row, K.size(h)) is K.const(0, K.INT)
    assert K.add(K.mul(row, K.size(w)), K.mod(p, K.size(w))) is p


def test_a_split_and_joined_index_over_dynamic_sizes_is_the_index_again() -> None:
    """A group norm's statistics over a dynamic image: element r of group g read at
    (4g + r // (h*w)) * (h*w) + ((r % (h*w)) // w % h) * w + r % (h*w) % w, which is 4g*(h*w) + r (a dense read)."""
    g, r = K.var("g", 3), K.var("r", 40)
    h, w = K.sym("h"), K.sym("w")
    hw = K.mul(h, w)
    within = K.mod(r, hw)
    index = K.add(K.add(K.mul(K.add(K.mul(g, K.const(4, K.INT)), K.floordiv(r, hw)), hw),
                        K.mul(K.mod(K.floordiv(within, w), h), w)), K.mod(within, w))
    assert r in K.split_terms(index) and not any(n.op in ("index_div", "index_mod") for n in K.nodes_in(index)), index
    with K.rules_disabled("recombine_div_mod", "distribute_stride", "mod_below_dynamic_size"):
        plain = K.add(K.add(K.mul(K.add(K.mul(g, K.const(4, K.INT)), K.floordiv(r, hw)), hw),
                            K.mul(K.mod(K.floordiv(K.mod(r, hw), w), h), w)), K.mod(K.mod(r, hw), w))
    assert plain is not index
    _assert_same_values(plain, index, {}, "the joined index")
