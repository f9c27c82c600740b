"""Turn a model's kernels into package members: sources for people, binaries for the runtime."""
from __future__ import annotations

from typing import Any

from jit2triton.transpiler.kernel_ir import Kernel
from jit2triton.transpiler.symbolic import size_json

from . import cpp, cpp_conv
from .cpp_shared import count_bodies
from .compile_cpp import (BASE_FLAGS, ISA_FLAGS, compile_library, compiler_version, find_compiler, host_isa,
                          vector_math_functions)


def kernel_index(kernels: list[Kernel], backend: str) -> list[dict[str, Any]]:
    """The manifest's kernel list: names, buffers and provenance, for the runtime and for people."""
    return [{
        "name": k.name,
        "backend": backend,
        "num_buffers": len(k.inputs) + len(k.outputs),
        "sizes": list(k.size_names),  # the dynamic dims it takes, in its `sizes` argument's order
        "inputs": [[b.dtype, [size_json(n) for n in b.shape], [size_json(n) for n in b.strides]] for b in k.inputs],
        "outputs": [[b.dtype, [size_json(n) for n in b.shape]] for b in k.outputs],
        "provenance": k.provenance,
    } for k in kernels]


def render_cpp(kernels: list[Kernel]) -> str:
    """The model's one C++ translation unit, calling the vector math this host's libmvec has."""
    return cpp.render_module(kernels, vector_math_functions(host_isa(), cpp.VECTOR_MATH), cpp_conv.render_template,
                             cpp_conv.PRELUDE)


def compile_cpp(source: str) -> tuple[dict[str, bytes], dict[str, Any]]:
    """-> (package files, the manifest's "cpp" section): the source file and its shared library."""
    isa = host_isa()
    library = compile_library(source, isa)
    compiler = find_compiler() or ""
    files = {"kernels/kernels.cpp": source.encode(), "binaries/kernels.so": library}
    return files, {"isa": isa, "flags": BASE_FLAGS + ISA_FLAGS[isa], "compiler": compiler_version(compiler),
                   "bodies": count_bodies(source)}
