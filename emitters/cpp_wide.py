"""A 16-lane AVX-512 twin of each C++ kernel that calls float vector math, chosen at load by the CPU.

Packages are built for the AVX2 baseline (x86-64-v3) so that they load on any AVX2 machine. There glibc's vector
`expf` and friends take 8 floats a call; on an AVX-512 CPU ATen takes 16 (SLEEF), and a sigmoid, a SiLU or a GELU
over a tensor ran at 0.54-0.78x ATen's speed. Built with AVX-512 for the whole module, 16-lane loops won on these
and lost up to 2.3x on short rows (a mean over 56 floats: three 16-lane vectors and a remainder).

So only the kernels that call float vector math, and read no bool mask, get a twin (a softmax after
`masked_fill(bool, -inf)` ran 2.1x slower at 16 lanes: its bool reads and selects, in every loop), compiled for
x86-64-v4 inside the same library (a `target` attribute naming AVX-512's features) with their `omp simd` loops at 16
lanes (glibc's `_ZGVeN16v_` functions), and the kernel's exported entry calls the twin where the CPU has AVX-512 (F,
BW, CD, DQ, VL), else the AVX2 body, which is the kernel as it always was. One library, one package ISA; a sigmoid
over 256,000 floats, one thread: 70 -> 49 us (ATen 52). `J2T_NO_AVX512=1` in the environment when the library loads
keeps the AVX2 bodies (tests run both).
"""
from __future__ import annotations

import re

# The library's one test of the CPU, made when it loads (before any kernel runs)
PRELUDE = r"""
static const bool j2t_avx512 = (__builtin_cpu_init(), __builtin_cpu_supports("avx512f") &&
    __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
    __builtin_cpu_supports("avx512vl") && std::getenv("J2T_NO_AVX512") == nullptr);
"""
# AVX-512's x86-64-v4 features on top of the module's x86-64-v3, named one by one (`arch=x86-64-v4` needs GCC 11)
_TARGET = '__attribute__((target("avx512f,avx512bw,avx512cd,avx512dq,avx512vl")))'
_HEAD = re.compile(r"^(J2T_KERNEL int|static int) (\w+)(\((?:void\* const\* buffers, const int64_t\* sizes, "
                   r"int num_threads)(?:, const int64_t\* params)?\)) \{$", re.M)
_ARGUMENTS = {False: "buffers, sizes, num_threads", True: "buffers, sizes, num_threads, params"}


# The prelude's helpers that call vector math (cpp.py's SATURATING_EXP), by the function they call
_HELPERS = {"j2t_expf_shifted": "expf", "j2t_exp_shifted": "exp"}


def vector_calls(code: str, math: tuple[str, ...]) -> set[str]:
    """The vector math functions of `math` that `code` calls, itself or through a prelude helper."""
    called = {name for name in math if re.search(rf"\b{name}\(", code)}
    return called | {name for helper, name in _HELPERS.items() if name in math and f"{helper}(" in code}


def with_twin(code: str, wide_math: tuple[str, ...], all_math: tuple[str, ...]) -> tuple[str, bool]:
    """(`code` with a 16-lane twin and the entry choosing between them, whether it has one): for one function of
    the module (a kernel, or a body kernels share), where it calls float vector math and every vector function it
    calls has a 16-lane form here (`wide_math`; `all_math`: every vector function the module declares)."""
    head = _HEAD.search(code)
    if head is None:
        return code, False
    close = re.compile(r"\n\}(\n|$)").search(code, head.end())  # (its first closing brace in column 0)
    if close is None:
        return code, False
    body, after = code[head.end():close.start() + 2], code[close.start() + 2:]
    calls = vector_calls(body, all_math)
    if not calls or not calls <= set(wide_math) or "#pragma omp simd" not in body or "(bool)" in body:
        return code, False
    qualifier, name, params = head.groups()
    wide = re.sub(r"#pragma omp simd\b", "#pragma omp simd simdlen(16)", body)
    arguments = _ARGUMENTS["params" in params]
    twin = (f"{code[:head.start()]}static int {name}_avx2{params} {{{body}\n"
            f"{_TARGET} static int {name}_avx512{params} {{{wide}\n"
            f"{qualifier} {name}{params} {{\n"
            f"  return j2t_avx512 ? {name}_avx512({arguments}) : {name}_avx2({arguments});\n}}{after}")
    return twin, True
