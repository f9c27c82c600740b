"""Kernels that differ only in integer constants share one compiled C++ body.

A conv net repeats the same kernel at other sizes: DenseNet-121's 58 ReLUs between its convolutions are four
shapes, the BatchNorm-ReLU after each long concatenation one kernel at every channel count, and the fused cats of
its four blocks the same seven kernels at four image sizes; a stack of identical layers repeats kernels outright.
Compiling each copy made the C++ build most of a conversion. The renderer writes every static int64 of a kernel (a
literal, a loop bound, a size in an unravel) as a placeholder, and kernels whose code is the same but for their
name, their buffers' and reduction variables' numbers and those integers are one group:

    static int k1_relu_shared(void* const* buffers, const int64_t* sizes, int num_threads, const int64_t* params) {
      const int64_t j2t_p0 = params[0];     // an integer that differs between the kernels: an argument
      ... k1_relu's body, with the integers all of them agree on still literals ...
    }
    J2T_KERNEL int k1_relu(void* const* buffers, const int64_t* sizes, int num_threads) {
      static const int64_t params[] = {401408};
      return k1_relu_shared(buffers, sizes, num_threads, params);
    }

Each kernel keeps its own exported name (the runtimes are unchanged), and with its own integers the shared body
computes exactly what its own rendering would: only where the constants differ does the compiler see a variable.
A kernel alone in its group is written as before, every integer a literal.
"""
from __future__ import annotations

import itertools
import re
from dataclasses import dataclass

_PLACEHOLDER = re.compile("\x01(\\d+)\x01")
_NUMBERED = re.compile(r"(?<![A-Za-z0-9])(buf|r)(\d+)")  # buffers and reduction variables: numbered model-wide
SIGNATURE = "(void* const* buffers, const int64_t* sizes, int num_threads)"


def placeholder(index: int) -> str:
    return f"\x01{index}\x01"


def shifted_placeholders(code: str, offset: int) -> str:
    """`code` with its placeholders numbered `offset` on: for code joined after another's `offset` integers."""
    return _PLACEHOLDER.sub(lambda m: placeholder(int(m.group(1)) + offset), code)


@dataclass
class Rendered:
    """A kernel rendered with placeholders: its name, its code (provenance comment, signature line, body), and
    per placeholder index the integer and the code that writes it as a literal."""
    name: str
    code: str
    ints: list[tuple[int, str]]

    @property
    def head(self) -> str:
        """The provenance comment and the signature line."""
        return self.code[:self.code.index("{\n", self.code.index("\nJ2T_KERNEL int ")) + 2]

    @property
    def body(self) -> str:
        return self.code[len(self.head):]

    def in_order(self) -> list[tuple[int, str]]:
        """The integers in the order their placeholders appear in the body."""
        return [self.ints[int(m.group(1))] for m in _PLACEHOLDER.finditer(self.body)]

    def identity(self) -> str:
        """The body without its integers and with its buffers and reduction variables renumbered in order of
        appearance: equal for kernels that compute the same thing at other sizes."""
        numbers: dict[str, str] = {}
        body = _PLACEHOLDER.sub("\x01", self.body)
        return _NUMBERED.sub(lambda m: m.group(1) + "_" + numbers.setdefault(m.group(0), str(len(numbers))), body)


def share_bodies(rendered: list[Rendered]) -> list[str]:
    """The C++ functions of the kernels, in order: a kernel alone as itself, a group as one shared body (at its
    first kernel) and a wrapper per kernel."""
    groups: dict[str, list[Rendered]] = {}
    for r in rendered:
        groups.setdefault(r.identity(), []).append(r)
    functions = []
    for members in groups.values():
        functions += [_alone(members[0])] if len(members) == 1 else _shared(members)
    return functions


def count_bodies(source: str) -> int:
    """How many kernel bodies a module of these functions compiles: each kernel alone, and each shared body once
    (its kernels' wrappers call it)."""
    kernels = source.count("\nJ2T_KERNEL int ")
    wrappers = source.count("_shared(buffers, sizes, num_threads, ")
    return kernels - wrappers + source.count("_shared(void* const* buffers")


def _alone(r: Rendered) -> str:
    return _PLACEHOLDER.sub(lambda m: r.ints[int(m.group(1))][1], r.code)


def _shared(members: list[Rendered]) -> list[str]:
    first = members[0]
    columns = list(zip(*[m.in_order() for m in members]))  # per placeholder in the body: every kernel's integer
    varying = [i for i, column in enumerate(columns) if len({value for value, _ in column}) > 1]
    argument = {position: k for k, position in enumerate(varying)}
    positions = itertools.count()

    def fill(_: re.Match) -> str:
        position = next(positions)
        return f"j2t_p{argument[position]}" if position in argument else columns[position][0][1]

    body = _PLACEHOLDER.sub(fill, first.body)
    shared = f"{first.name}_shared"
    names = ", ".join(m.name for m in members)
    functions = [f"// {shared}: the body of {len(members)} kernels that differ only in integers ({names})\n"
                 f"static int {shared}(void* const* buffers, const int64_t* sizes, int num_threads, "
                 f"const int64_t* params) {{\n"
                 + "".join(f"  const int64_t j2t_p{k} = params[{k}];\n" for k in range(len(varying))) + body]
    for m in members:
        values = m.in_order()
        params = "{" + ", ".join(f"INT64_C({values[i][0]})" for i in varying) + "}"
        own = (f"  static const int64_t params[] = {params};\n  return {shared}(buffers, sizes, num_threads, params);"
               if varying else f"  return {shared}(buffers, sizes, num_threads, nullptr);")
        functions.append(_PLACEHOLDER.sub("", m.head) + own + "\n}")
    return functions
