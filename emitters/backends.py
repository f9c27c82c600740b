"""The kernel backends, one record each: what renders and compiles a model's kernels, the manifest section that
build writes, and what loads them again in the runtime. Conversion, the runtime and the CLI look a backend up
here by name (the manifest's "backend") instead of comparing strings, so a new backend is one record plus its
renderer and loader (as Triton keeps one `backends/<name>/` pair per backend).

The loader is named, not imported: it is a function of the C++ runtime, listed in plan.cpp's table of backends (a
test holds the two lists equal).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Optional

from jit2triton.errors import ConversionError, Jit2TritonError

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
    cpp_loader: Optional[str] = None  # the C++ runtime's loader (plan.cpp, kKernelBackends)
    # The GEMM form it generates for transpiler/gemm_forms.py to time (its `Generated` hook), if any
    generated_gemm: Optional[Callable[..., Any]] = None
    # The attention it generates for transpiler/attention_kernels.py to time (its `Generated` hook), if any
    generated_attention: Optional[Callable[..., Any]] = None
    # The convolutions it generates for transpiler/onednn_conv.py to time (ConvKernels -> calls to time), if any
    generated_conv: Optional[Callable[..., Any]] = None
    devices: tuple[str, ...] = ("cpu", "cuda")  # the device types its packages run on
    default_on: tuple[str, ...] = ()  # the device types it is the default backend for
    hint: str = ""  # what to do instead, where it does not support a device
    # Whether its kernels take host numbers as arguments (KernelBuffer.by_value) and its launchers pass them; else
    # a number a kernel reads is made a 0-d tensor first (cheap on the CPU, a fill launch on a GPU)
    scalars_by_value: bool = False
    # Whether it renders torchvision's NMS as kernels (transpiler/gpu_nms.py's, emitters/triton_nms.py's)
    nms_kernels: bool = False

    def supports(self, device: torch.device) -> bool:
        return device.type in self.devices

    @property
    def generates_kernels(self) -> bool:
        return self.render is not None

    def build(self, kernels: list[Kernel], device: Optional[torch.device],
              say: Progress) -> tuple[Files, dict[str, Any]]:
        """-> (package files, {section: its manifest section}) for the kernels; `device` is the conversion target,
        without it the device this process can build for (for Triton, the CPU under the interpreter)."""
        try:
            rendered = self.render(kernels)
        except Jit2TritonError:
            raise
        except Exception:  # a renderer bug: the kernels that fail alone are to blame, if some render
            failing = _failing_alone(self.render, kernels)
            if failing and len(failing) < len(kernels):
                raise KernelsFailed(failing) from None
            raise
        files, section = self.compile(rendered, kernels, device, say)
        return files, {self.section: section}


class KernelsFailed(Exception):
    """Rendering or compiling these kernels failed, while the model's other kernels rendered and compiled (a bug in
    a renderer, not in the model): `failures` maps each one's name to why. Conversion runs their nodes through
    ATen and builds again (transpiler/fallbacks.py, rung 2), so one kernel's bug costs only that kernel."""

    def __init__(self, failures: dict[str, str]) -> None:
        super().__init__("; ".join(f"kernel {name} {why}" for name, why in failures.items()))
        self.failures = failures


def _failing_alone(render: Callable[[list[Kernel]], Any], kernels: list[Kernel]) -> dict[str, str]:
    """{name: why} of the kernels that fail to render on their own (each a renderer's work alone: cheap beside
    compiling them)."""
    failing = {}
    for kernel in kernels:
        try:
            render([kernel])
        except Exception as err:  # noqa: BLE001 - whatever the renderer raised is the reason, for the report
            failing[kernel.name] = f"failed to render ({type(err).__name__}: {err})"
    return failing


def _render_cpp(kernels: list[Kernel]) -> str:
    from .build import render_cpp
    return render_cpp(kernels)


def _compile_cpp(source: str, kernels: list[Kernel], device: Optional[torch.device],
                 say: Progress) -> tuple[Files, dict[str, Any]]:
    from .build import compile_cpp, kernels_that_fail_to_compile
    from .compile_cpp import CompileFailed
    say(f"compiling {len(kernels)} C++ kernels")
    try:
        return compile_cpp(source)
    except CompileFailed:  # one translation unit for every kernel: the kernels to blame are searched for in halves
        say("the C++ kernels did not compile: compiling parts of them for the kernels to blame")
        failing = kernels_that_fail_to_compile(kernels)
        if failing and len(failing) < len(kernels):
            raise KernelsFailed(failing) from None
        raise


def _render_triton(kernels: list[Kernel]) -> list:
    from jit2triton.transpiler.kernel_ir import AttentionKernel, GemmKernel, NmsMaskKernel, NmsWalkKernel

    from .triton import render_kernel
    from .triton_attention import render_attention  # templates, not expressions
    from .triton_gemm import render_gemm
    from .triton_nms import render_nms_mask, render_nms_walk
    templates = {GemmKernel: render_gemm, AttentionKernel: render_attention, NmsMaskKernel: render_nms_mask,
                 NmsWalkKernel: render_nms_walk}
    return [templates.get(type(k), render_kernel)(k) for k in kernels]


def _compile_triton(rendered: list, kernels: list[Kernel], device: Optional[torch.device],
                    say: Progress) -> tuple[Files, dict[str, Any]]:
    from .compile_triton import build_triton, buildable_device
    device = device or buildable_device()
    say(f"rendering {len(kernels)} Triton kernels" + (" and compiling them" if device.type == "cuda" else ""))
    return build_triton(rendered, kernels, device, say)


def _cpp_conv(*args) -> Any:
    from .conv_timing import conv_templates
    return conv_templates(*args)


def _triton_gemm(*args) -> Any:
    from .triton_gemm import gemm_template
    return gemm_template(*args)


def _triton_attention(*args) -> Any:
    from .triton_attention import attention_template
    return attention_template(*args)


BACKENDS: dict[str, Backend] = {b.name: b for b in [
    Backend("cpp", "cpp", _render_cpp, _compile_cpp, "load_cpu_kernels",
            generated_conv=_cpp_conv, devices=("cpu",), default_on=("cpu",),
            hint="the C++ backend generates CPU kernels; use device='cpu' or backend='triton'"),
    # (on the CPU its kernels run under the Triton interpreter: for tests, slow)
    Backend("triton", "triton", _render_triton, _compile_triton, "load_cuda_kernels", _triton_gemm,
            generated_attention=_triton_attention, default_on=("cuda",), scalars_by_value=True, nms_kernels=True),
    Backend("aten"),  # no generated kernels: every op runs through ATen
]}
NAMES = tuple(BACKENDS)


def default_for(device: torch.device) -> Backend:
    """The backend a conversion for `device` takes when none is named."""
    found = [b for b in BACKENDS.values() if device.type in b.default_on]
    if not found:
        raise ConversionError(f"no backend generates kernels for device {device.type!r}; use device='cpu' or "
                              "device='cuda'")
    return found[0]


def backend_for(name: Optional[str], device: torch.device) -> Backend:
    """The backend `name` (None: `device`'s default), refused where its packages cannot run on `device`."""
    backend = default_for(device) if name is None else backend_named(name)
    if not backend.supports(device):
        raise ConversionError(backend.hint or f"the {backend.name} backend does not run on {device.type}; choose "
                              f"backend={default_for(device).name!r}")
    return backend


def backend_named(name: str) -> Backend:
    found = BACKENDS.get(name)
    if found is None:
        raise ConversionError(f"unknown backend {name!r}; choose one of {', '.join(NAMES)}")
    return found

