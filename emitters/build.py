"""Turn a model's kernels into package members: sources for people, binaries for the runtime."""
from __future__ import annotations

import re
from typing import Any

from jit2triton.transpiler.kernel_ir import Kernel
from jit2triton.transpiler.symbolic import size_json

from . import cpp, cpp_conv
from .cpp_shared import count_bodies
from .compile_cpp import (BASE_FLAGS, ISA_FLAGS, CompileFailed, compile_library, compiler_version, find_compiler,
                          host_isa, vector_math_functions, wide_math_functions)

MAX_COMPILE_PROBES = 20  # compiles the search for the kernels a model's C++ fails on may spend (one culprit in
# N kernels takes about 2*log2(N), each of a part of the model: about twice its own compile in all)


def kernel_index(kernels: list[Kernel], backend: str) -> list[dict[str, Any]]:
    """The manifest's kernel list: names, buffers and provenance, for the runtime and for people."""
    return [{
        "name": k.name,
        "backend": backend,
        "num_buffers": len(k.inputs) + len(k.outputs),
        "sizes": list(k.size_names),  # the dynamic dims it takes, in its `sizes` argument's order
        **({"by_value": by_value} if (by_value := [i for i, b in enumerate(k.inputs) if b.by_value]) else {}),
        "inputs": [[b.dtype, [size_json(n) for n in b.shape], [size_json(n) for n in b.strides]] for b in k.inputs],
        "outputs": [[b.dtype, [size_json(n) for n in b.shape]] for b in k.outputs],
        "provenance": k.provenance,
    } for k in kernels]


def render_cpp(kernels: list[Kernel]) -> str:
    """The model's one C++ translation unit, calling the vector math this host's libmvec has, with AVX-512 twins
    of the kernels that call it (cpp_wide.py)."""
    isa = host_isa()
    return cpp.render_module(kernels, vector_math_functions(isa, cpp.VECTOR_MATH), cpp_conv.render_template,
                             cpp_conv.PRELUDE, wide_math_functions(isa, cpp.VECTOR_MATH))


def compile_cpp(source: str) -> tuple[dict[str, bytes], dict[str, Any]]:
    """-> (package files, the manifest's "cpp" section): the source file and its shared library."""
    isa = host_isa()
    library = compile_library(source, isa)
    compiler = find_compiler() or ""
    files = {"kernels/kernels.cpp": source.encode(), "binaries/kernels.so": library}
    return files, {"isa": isa, "flags": BASE_FLAGS + ISA_FLAGS[isa], "compiler": compiler_version(compiler),
                   "bodies": count_bodies(source)}


class _OutOfProbes(Exception):
    pass


def kernels_that_fail_to_compile(kernels: list[Kernel]) -> dict[str, str]:
    """{name: the compiler's first error} of the kernels that do not compile alone, where their translation unit
    did not: halves are compiled in turn and a half that compiles is cleared whole. {} where the search spends
    MAX_COMPILE_PROBES compiles, or the kernels fail only together: no kernel to blame."""
    isa, failing, probes = host_isa(), {}, [MAX_COMPILE_PROBES]

    def error_of(group: list[Kernel]) -> str:
        if not probes[0]:
            raise _OutOfProbes
        probes[0] -= 1
        try:
            compile_library(render_cpp(group), isa)
        except CompileFailed as err:
            found = re.search(r"error: (.*)", str(err))
            return found.group(1).strip() if found else str(err).splitlines()[0]
        return ""

    def search(group: list[Kernel]) -> None:  # (it failed to compile together)
        for half in (group[:len(group) // 2], group[len(group) // 2:]):
            error = error_of(half)
            if error and len(half) == 1:
                failing[half[0].name] = f"failed to compile ({error})"
            elif error:
                search(half)
    try:
        if len(kernels) > 1:
            search(kernels)
    except _OutOfProbes:
        return {}
    return failing
