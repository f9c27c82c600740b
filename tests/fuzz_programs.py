"""A differential fuzzer: random TorchScript programs drawn from what models are made of, converted, saved, loaded
and compared with TorchScript on fresh inputs.

A program is a list of statements `v7 = <expr>` over the inputs and earlier values. Each candidate statement is
run eagerly while the program is drawn, so every program is valid by construction, and shapes are known for the
next draw. The programs mix views (permute, transpose, reshape, select, slice, unbind, expand, unsqueeze and chains
of them) with pointwise ops, reductions over every dim, softmax and layer norm, externs fed by non-contiguous views
(matmul, linear, conv, scaled_dot_product_attention), in-place writes, broadcasting, int and bool tensors, and
sizes that depend on the data (mask indexing, nonzero, masked_select, unique, topk and slices by a count).

Each program is traced and scripted. A failure (a conversion error, a kernel that convert-time verification had to
take out, or an output that differs from TorchScript) is shrunk to a minimal program by dropping statements.

With `--dynamic`, the first input's first dim is a dynamic dim (a range around its drawn size) and the package is
run at other sizes in that range. The program was drawn at one size, so TorchScript may specialise to it (a trace
bakes sizes into constants); then conversion may refuse with a ConversionError naming the dim, which is no
failure. Anything else is: another error, a package that refuses a size in its range which TorchScript runs, or a
different answer.

    python tests/fuzz_programs.py --seeds 2000 [--first 0] [--backend cpp|triton] [--device cpu|cuda] [--dynamic]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

Shape = tuple


@dataclass
class Var:
    name: str
    shape: Shape
    dtype: torch.dtype


@dataclass
class Program:
    inputs: list[Var]
    statements: list[tuple[str, str]] = field(default_factory=list)  # (name, the lines that assign it)
    outputs: int = 1  # how many of the last values it returns
    dynamic: Optional[tuple[int, int]] = None  # (min, max) of the first input's first dim, in dynamic mode

    def source(self, statements: Optional[list[tuple[str, str]]] = None) -> str:
        statements = self.statements if statements is None else statements
        lines = [f"def program({', '.join(v.name for v in self.inputs)}):"]
        lines += [f"    {code}" for _, code in statements]
        values = [name for name, _ in statements] or [self.inputs[0].name]
        returned = values[-self.outputs:]
        lines.append(f"    return {', '.join(returned)}" + ("," if len(returned) == 1 and self.outputs > 1 else ""))
        return "\n".join(lines) + "\n"


def make_inputs(program: Program, seed: int, first_dim: Optional[int] = None) -> tuple:
    """Inputs of the drawn shapes; `first_dim` resizes the first input's first dim (dynamic mode)."""
    g = torch.Generator().manual_seed(seed)
    values = []
    for i, v in enumerate(program.inputs):
        if i == 0 and first_dim is not None:
            v = Var(v.name, (first_dim,) + v.shape[1:], v.dtype)
        if v.dtype == torch.bool:
            values.append(torch.rand(v.shape, generator=g) < 0.5)
        elif v.dtype.is_floating_point:
            values.append(torch.randn(v.shape, generator=g, dtype=v.dtype))
        else:
            values.append(torch.randint(-4, 9, v.shape, generator=g, dtype=v.dtype))
    return tuple(values)


def compile_eager(source: str) -> Callable:
    namespace = {"torch": torch, "__name__": "fuzz_program"}
    exec(compile(source, "<fuzz program>", "exec"), namespace)
    return namespace["program"]


# --- drawing programs ------------------------------------------------------------------------------------------

UNARY = ["torch.relu({a})", "torch.sigmoid({a})", "torch.tanh({a})", "torch.exp({a}.clamp(-8.0, 8.0))",
         "{a}.abs()", "-{a}", "torch.sin({a})", "torch.cos({a})", "torch.erf({a})", "{a} * {a}",
         "torch.sqrt({a}.abs() + 1.0)", "torch.log({a}.abs() + 1.0)", "torch.nn.functional.gelu({a})",
         "torch.nn.functional.silu({a})", "torch.reciprocal({a}.abs() + 1.0)", "torch.floor({a} * 3.0)",
         "{a} * 2.5", "{a} + 1.0", "{a} - 3.0", "torch.clamp({a}, -0.5, 0.5)", "torch.expm1({a}.clamp(-4.0, 4.0))",
         "torch.log1p({a}.abs())", "torch.nn.functional.leaky_relu({a}, 0.1)", "torch.nn.functional.hardswish({a})",
         "torch.where({a} > 0.0, {a}, {a} * 0.5)", "({a} > 0.25).float()", "torch.nn.functional.softplus({a})"]
BINARY = ["{a} + {b}", "{a} - {b}", "{a} * {b}", "{a} / ({b}.abs() + 1.0)", "torch.maximum({a}, {b})",
          "torch.minimum({a}, {b})", "torch.where({a} > {b}, {a}, {b})", "torch.pow({a}.abs() + 0.5, 2.0) - {b}",
          "torch.atan2({a}, {b}.abs() + 1.0)"]
INT_OPS = ["{a} + {a}", "{a} * 3", "{a} // 2", "{a} % 3", "{a}.float() * 0.5", "({a} > 2).long()",
           "{a}.sum({d})", "{a}.amax({d})", "torch.clamp({a}, 0, 5)"]
BOOL_OPS = ["{a}.float()", "{a}.any({d})", "{a}.all({d})", "~{a}", "{a} & ({a}.sum({d}, keepdim=True) > 1)",
            "{a}.long().sum({d})"]
REDUCE = ["{a}.sum({d})", "{a}.sum({d}, keepdim=True)", "{a}.mean({d})", "{a}.amax({d})", "{a}.amin({d}, True)",
          "{a}.argmax({d})", "{a}.std({d})", "{a}.var({d}, keepdim=True)", "torch.softmax({a}, {d})",
          "torch.log_softmax({a}, {d})", "torch.logsumexp({a}, [{d}])", "{a}.cumsum({d})",
          "({a}.clamp(-1.0, 1.0) * 0.5 + 1.0).prod({d})", "{a}.max({d})[0]", "{a}.min({d})[1]",
          "torch.nn.functional.layer_norm({a}, [{last}])", "{a}.norm(2.0, {d})"]
FULL_REDUCE = ["{a}.sum()", "{a}.mean()", "{a}.amax()", "{a} - {a}.mean()", "{a} / ({a}.std() + 1.0)"]
EXTERN = ["torch.matmul({a}, {a}.transpose(-2, -1))", "torch.matmul({a}.transpose(-2, -1), {a})",
          "torch.nn.functional.scaled_dot_product_attention({a}, {a}, {a})",
          "torch.nn.functional.scaled_dot_product_attention({a}.transpose(1, 2), {a}.transpose(1, 2), "
          "{a}.transpose(1, 2))", "torch.nn.functional.linear({a}, {a}[0].reshape(-1, {last})[:3])",
          "torch.nn.functional.conv2d({a}, torch.ones(2, {c1}, 2, 2) * 0.1, padding=1)",
          "torch.nn.functional.conv1d({a}, torch.ones(3, {c1}, 2) * 0.2)",
          "torch.nn.functional.max_pool2d({a}, 2)", "torch.nn.functional.avg_pool2d({a}, 2, 1)",
          "torch.nn.functional.adaptive_avg_pool2d({a}, 1)"]
CONCAT = ["torch.cat([{a}, {b}], {d})", "torch.stack([{a}, {b}], {d})", "torch.cat([{a}, {a} * 2.0], {d})",
          "torch.stack([{a}, {a} + 1.0, {a}], {d})"]
GATHER = ["torch.index_select({a}, {d}, torch.arange({size} - 1, -1, -1))",
          "torch.gather({a}, {d}, ({a}.abs() * 7.0).long() % {size})",
          "torch.embedding({a}.reshape(-1, {last}), ({a}.reshape(-1)[:4].abs() * 5.0).long() % {rows})"]
# sizes that depend on the data: a later statement's kernels must not fit the drawn count
DATA_SIZED = ["{a}[{a} > 0.0]", "torch.nonzero({a} > 0.0).float()", "torch.masked_select({a}, {a} > 0.25)",
              "torch.unique(({a} * 2.0).floor())", "torch.where({a} > 0.5)[0].float()",
              "torch.topk({a}.reshape(-1), int(({a} > 0.0).sum()) + 1).values",
              "{a}.reshape(-1)[:int(({a} > 0.0).sum()) + 1]"]
IN_PLACE = ["{a}.clone().mul_(2.0)", "{a}.clone().add_({b})", "{a}.clone().relu_()",
            "{a}.clone().masked_fill_({a} > 0.5, -1.0)"]
IN_PLACE_STATEMENTS = ["{t} = {a}.clone()\n    {t}[0] = 1.0", "{t} = {a}.clone()\n    {t}[..., 0] = {t}[..., 1]",
                       "{t} = {a}.clone()\n    {t}.select({d}, 0).mul_(3.0)", "{t} = {a}.clone()\n    {t} += 2.0"]


def _views(v: Var, rnd: random.Random) -> list[str]:
    rank = len(v.shape)
    out = []
    if rank >= 2:
        perm = list(range(rank))
        rnd.shuffle(perm)
        out += [f"{{a}}.permute({', '.join(map(str, perm))})", f"{{a}}.transpose({rnd.randrange(rank)}, "
                f"{rnd.randrange(rank)})", "{a}.flatten(1)", f"{{a}}.unbind({rnd.randrange(rank)})[0]",
                "{a}.t()" if rank == 2 else "{a}.transpose(-1, -2)", f"{{a}}.movedim(0, {rank - 1})"]
    if rank >= 1:
        d = rnd.randrange(rank)
        n = v.shape[d]
        out += [f"{{a}}.select({d}, {rnd.randrange(n)})", f"{{a}}.narrow({d}, {n // 2}, {n - n // 2})",
                f"{{a}}.unsqueeze({rnd.randrange(rank + 1)})", "{a}.reshape(-1)", f"{{a}}.chunk(2, {d})[0]",
                f"{{a}}[{':, ' * d}1:]" if n > 1 else "{a}.squeeze()", f"{{a}}[{':, ' * d}::2]"]
        total = 1
        for s in v.shape:
            total *= s
        for k in (2, 3, 4):
            if total % k == 0:
                out.append(f"{{a}}.reshape({k}, -1)")
                out.append(f"{{a}}.reshape(-1, {k})")
        ones = [d for d, s in enumerate(v.shape) if s == 1]
        if ones:
            target = list(v.shape)
            target[ones[0]] = 3
            out.append(f"{{a}}.expand({', '.join(map(str, target))})")
        if rank <= 3:
            out.append(f"{{a}}.unsqueeze(0).expand(2, {', '.join(map(str, v.shape))})")
    return out


def draw_program(seed: int, size: int = 6) -> Program:
    rnd = random.Random(seed)
    inputs = []
    for i in range(rnd.choice([1, 1, 2, 2, 3])):
        rank = rnd.choice([1, 2, 2, 3, 3, 4])
        shape = tuple(rnd.choice([1, 2, 3, 4, 5, 6, 8]) for _ in range(rank))
        if i > 0 and rnd.random() < 0.5:  # a second input that broadcasts against the first
            shape = tuple(s if rnd.random() < 0.7 else 1 for s in inputs[0].shape[-rnd.randint(1, len(inputs[0].shape)):])
        dtype = rnd.choices([torch.float32, torch.int64, torch.bool], [0.8, 0.12, 0.08])[0]
        inputs.append(Var(f"x{i}", shape, dtype))
    program = Program(inputs, outputs=rnd.choice([1, 1, 2]))
    values = list(inputs)
    eager_inputs = make_inputs(program, seed)
    env = {v.name: t for v, t in zip(inputs, eager_inputs)}
    attempts = 0
    while len(program.statements) < size and attempts < size * 40:
        attempts += 1
        name = f"v{len(program.statements) + 1}"
        statement = _draw_statement(rnd, values, name)
        if statement is None:
            continue
        expr, in_place = statement
        try:
            scope = dict(env, torch=torch)
            if in_place:
                exec(expr.replace("\n    ", "\n"), scope)
                result = scope[name]
            else:
                result = eval(expr, scope)
        except Exception:
            continue
        if not isinstance(result, torch.Tensor) or result.numel() == 0 or result.numel() > 4096:
            continue
        if result.dtype not in (torch.float32, torch.int64, torch.bool):
            continue
        env[name] = result
        values.append(Var(name, tuple(result.shape), result.dtype))
        program.statements.append((name, expr if in_place else f"{name} = {expr}"))
    return program


def _draw_statement(rnd: random.Random, values: list[Var], name: str) -> Optional[tuple[str, bool]]:
    recent = values[-3:] if rnd.random() < 0.7 else values
    a = rnd.choice(recent)
    b = rnd.choice(values)
    rank = len(a.shape)
    d = rnd.randrange(-rank, rank) if rank else 0
    fill = {"a": a.name, "b": b.name, "d": d, "last": a.shape[-1] if rank else 1,
            "c1": a.shape[1] if rank >= 2 else 1, "size": a.shape[d] if rank else 1,
            "rows": (a.shape[0] if rank else 1)}
    if a.dtype == torch.int64:
        kind = INT_OPS
    elif a.dtype == torch.bool:
        kind = BOOL_OPS
    else:
        kind = rnd.choices([UNARY, BINARY, REDUCE, FULL_REDUCE, EXTERN, CONCAT, GATHER, IN_PLACE, _views(a, rnd),
                            IN_PLACE_STATEMENTS, DATA_SIZED],
                           [14, 12, 12, 3, 6, 4, 3, 3, 16, 3, 3])[0]
    if not kind:
        return None
    template = rnd.choice(kind)
    if kind is IN_PLACE_STATEMENTS:
        fill["t"] = name
        return template.format(**fill), True
    return template.format(**fill), False


# --- running one program ---------------------------------------------------------------------------------------

def reference_of(program: Program, mode: str, statements=None) -> torch.jit.ScriptFunction:
    source = program.source(statements)
    if mode == "script":
        return torch.jit.CompilationUnit(source).program
    function = compile_eager(source)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(function, make_inputs(program, 0), check_trace=False)


def differs(actual, expected) -> Optional[str]:
    """Why `actual` is not TorchScript's `expected`, or None (floats within 1e-4 of each tensor's scale)."""
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected):
            return f"structure {type(actual).__name__}, expected {type(expected).__name__} of {len(expected)}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            why = differs(a, e)
            if why:
                return f"[{i}] {why}"
        return None
    if not isinstance(expected, torch.Tensor):
        return None if actual == expected else f"{actual!r} != {expected!r}"
    if actual.dtype != expected.dtype or actual.shape != expected.shape:
        return f"{actual.dtype}{list(actual.shape)} != {expected.dtype}{list(expected.shape)}"
    if not expected.is_floating_point():
        wrong = (actual != expected).sum().item()
        return f"{wrong} of {expected.numel()} elements differ" if wrong else None
    a, e = actual.double(), expected.double()
    if not torch.equal(a.isnan(), e.isnan()) or not torch.equal(a.isinf(), e.isinf()):
        return "NaN/inf positions differ"
    finite = e.isfinite()
    if finite.any():
        scale = max(e[finite].abs().max().item(), 1.0)
        error = (a - e)[finite].abs().max().item() / scale
        if error > 1e-4:
            return f"max error {error:.3g} of scale {scale:.3g}"
    return None


def failure_of(program: Program, mode: str, backend: str, device: str, statements=None) -> Optional[str]:
    """Why this program fails through jit2triton, or None. A program TorchScript itself cannot run is no failure."""
    import jit2triton
    try:
        reference = reference_of(program, mode, statements)
        example = make_inputs(program, 0)
        reference(*example)
    except Exception:
        return None
    options = {}
    if program.dynamic:
        low, high = program.dynamic
        options["dynamic_shapes"] = [{0: jit2triton.Dim("d0", min=low, max=high)}]
    try:
        converted = jit2triton.convert(reference, example, backend=backend, device=device, **options)
    except jit2triton.ConversionError as err:
        if program.dynamic and "d0" in str(err):  # the program specialises to the drawn size, and convert says so
            return None
        return f"convert raised ConversionError: {str(err)[:300]}"
    except Exception as err:
        return f"convert raised {type(err).__name__}: {str(err)[:300]}"
    removed = converted.summary().get("verification", {}).get("kernels_removed")
    if removed:
        return f"verification took out {[k['kernel'] + ': ' + ', '.join(k['ops']) for k in removed]}"
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "p.j2t")
        try:
            converted.save(path)
            loaded = jit2triton.load(path)
        except Exception as err:
            return f"save/load raised {type(err).__name__}: {err}"
        sizes = [None, None]
        if program.dynamic:  # the range's ends and a size between
            sizes = [program.dynamic[0], program.dynamic[1], random.Random(len(statements or ())).randint(*program.dynamic)]
        for seed, size in zip((101, 202, 303), sizes):
            inputs = tuple(x.to(device) for x in make_inputs(program, seed, size))
            try:
                expected = reference(*[x.clone() for x in inputs])
            except Exception:
                continue
            try:
                actual = loaded(*[x.clone() for x in inputs])
            except Exception as err:
                return f"run raised {type(err).__name__}: {str(err)[:300]}"
            why = differs(actual, expected)
            if why:
                return f"outputs differ on fresh inputs{f' with d0={size}' if size else ''}: {why}"
    return None


def shrink(program: Program, mode: str, backend: str, device: str) -> list[tuple[str, str]]:
    """Drop statements, one at a time, for as long as the program still fails."""
    statements = list(program.statements)
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(statements))):
            candidate = statements[:i] + statements[i + 1:]
            if candidate and failure_of(program, mode, backend, device, candidate):
                statements = candidate
                changed = True
    return statements


def with_dynamic_first_dim(program: Program) -> Program:
    """The program with its first input's first dim made dynamic: a range around the drawn size (above 1, where
    broadcasting would specialise)."""
    shape = program.inputs[0].shape
    if shape and shape[0] > 1:
        program.dynamic = (2, 2 * shape[0] + 3)
    return program


def check_seed(seed: int, backend: str = "cpp", device: str = "cpu", modes=("trace", "script"),
               dynamic: bool = False) -> Optional[str]:
    """None if the program of this seed passes in every mode; else a report with the shrunk program."""
    program = draw_program(seed)
    if dynamic:
        program = with_dynamic_first_dim(program)
    for mode in modes:
        why = failure_of(program, mode, backend, device)
        if why:
            small = shrink(program, mode, backend, device)
            return (f"seed {seed} ({mode}, {backend}{', dynamic d0 in %d..%d' % program.dynamic if program.dynamic else ''}): {why}\n"
                    f"inputs: {[(v.name, v.shape, str(v.dtype)) for v in program.inputs]}\n"
                    f"{program.source(small)}")
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--backend", default="cpp")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dynamic", action="store_true", help="the first input's first dim is dynamic")
    args = parser.parse_args(argv)
    started, failures = time.time(), []
    for seed in range(args.first, args.first + args.seeds):
        try:
            report = check_seed(seed, args.backend, args.device, dynamic=args.dynamic)
        except Exception:
            report = f"seed {seed}: the fuzzer itself raised\n{traceback.format_exc()}"
        if report:
            failures.append(report)
            print(report, flush=True)
        if (seed - args.first + 1) % 50 == 0:
            print(f"[fuzz] {seed - args.first + 1} seeds, {len(failures)} failing, {time.time() - started:.0f}s",
                  file=sys.stderr, flush=True)
    print(f"{args.seeds} seeds ({args.first}..{args.first + args.seeds - 1}), {args.backend} on {args.device}"
          f"{' (dynamic)' if args.dynamic else ''}: "
          f"{len(failures)} failing, {time.time() - started:.0f}s", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(__file__))
    sys.exit(main())
