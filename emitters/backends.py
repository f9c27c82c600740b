"""The kernel backends, one record each: what renders and compiles a model's kernels, the manifest section that
build writes, and what loads them again in each runtime. Conversion, both runtimes and the CLI look a backend up
here by name (the manifest's "backend") instead of comparing strings, so a new backend is one record plus its
renderer and loaders (as Triton keeps one `backends/<name>/` pair per backend).

The loaders are named, not imported: deploy/ comes after emitters/ in the flow, so a Python loader is a module
of deploy/ with a `load_kernels(contents, num_threads, device)` function, and a C++ loader is a function of the
C++ runtime, listed in plan.cpp's table of backends (a test holds the two lists equal).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from jit2triton.errors import ConversionError

if TYPE_CHECKING:  # (the CLI lists the backends' names without importing torch: `--help` answers at once)
    import torch

    from jit2triton.transpiler.kernel_ir import Kernel

Files = dict[str, bytes]
Progress = Callable[[str], None]


@dataclass(frozen=True)
class Backend:
    name: str
    section: Optional[str] = None  # the manifest section `compile` writes (none for "aten": it generates nothing)
    render: Optional[Callable[[list[Kernel]], Any]] = None  # kernels -> their rendered source(s)
    # (rendered, kernels, target device or None for this process's, progress) -> (package files, manifest section)
    compile: Optional[Callable[[Any, list[Kernel], Optional[torch.device], Progress],
                               tuple[Files, dict[str, Any]]]] = None
    python_loader: Optional[str] = None  # the deploy/ module whose load_kernels launches them
    cpp_loader: Optional[str] = None  # the C++ runtime's loader (plan.cpp, kKernelBackends)
    # The GEMM form it generates for transpiler/gemm_forms.py to time (its `Generated` hook), if any
    generated_gemm: Optional[Callable[..., Any]] = None
    # The convolutions it generates for transpiler/onednn_conv.py to time (ConvKernels -> calls to time), if any
    generated_conv: Optional[Callable[..., Any]] = None

    @property
    def generates_kernels(self) -> bool:
        return self.render is not None

    def build(self, kernels: list[Kernel], device: Optional[torch.device],
              say: Progress) -> tuple[Files, dict[str, Any]]:
        """-> (package files, {section: its manifest section}) for the kernels; `device` is the conversion target,
        without it the device this process can build for (for Triton, the CPU under the interpreter)."""
        files, section = self.compile(self.render(kernels), kernels, device, say)
        return files, {self.section: section}


def _render_cpp(kernels: list[Kernel]) -> str:
    from .build import render_cpp
    return render_cpp(kernels)


def _compile_cpp(source: str, kernels: list[Kernel], device: Optional[torch.device],
                 say: Progress) -> tuple[Files, dict[str, Any]]:
    from .build import compile_cpp
    say(f"compiling {len(kernels)} C++ kernels")
    return compile_cpp(source)


def _render_triton(kernels: list[Kernel]) -> list:
    from .triton import render_kernel
    return [render_kernel(k) for k in kernels]


def _compile_triton(rendered: list, kernels: list[Kernel], device: Optional[torch.device],
                    say: Progress) -> tuple[Files, dict[str, Any]]:
    from .compile_triton import build_triton, buildable_device
    device = device or buildable_device()
    say(f"rendering {len(kernels)} Triton kernels" + (" and compiling them" if device.type == "cuda" else ""))
    return build_triton(rendered, kernels, device, say)


def _cpp_conv(*args) -> Any:
    from .cpp_conv import conv_templates
    return conv_templates(*args)


def _triton_gemm(*args) -> Any:
    from .triton_gemm import gemm_template
    return gemm_template(*args)


BACKENDS: dict[str, Backend] = {b.name: b for b in [
    Backend("cpp", "cpp", _render_cpp, _compile_cpp, "jit2triton.deploy.cpp_kernels", "load_cpu_kernels",
            generated_conv=_cpp_conv),
    Backend("triton", "triton", _render_triton, _compile_triton, "jit2triton.deploy.triton_kernels",
            "load_cuda_kernels", _triton_gemm),
    Backend("aten"),  # no generated kernels: every op runs through ATen
]}
NAMES = tuple(BACKENDS)


def backend_named(name: str) -> Backend:
    found = BACKENDS.get(name)
    if found is None:
        raise ConversionError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")
    return found

