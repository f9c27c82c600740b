"""The C++ runtime from Python: `jit2triton.load(path, runtime="cpp")`.

The runtime's sources (deploy/cpp) are built into a Python extension with torch's cpp_extension on first use and
cached under ~/.cache/jit2triton/ext, keyed by a hash of the sources, the torch version and the Python version: a
later process (or a later load) only imports it. Once loaded, a call converts the inputs, releases the GIL and runs
the whole plan in C++ (kernels, ATen ops, control flow, CUDA graphs), so no per-step Python work remains.
"""
from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import sys
import threading
from typing import Any, Optional, Sequence

import torch

from jit2triton.emitters.cache import cache_dir, write_once
from jit2triton.errors import (CorruptPackageError, InputError, ModelRaisedError, PackageDeviceError, PackageError,
                               PackageVersionError, QuantizedEngineError, SignatureError, StepError)

# The classes the extension raises, by name: the C++ runtime's errors are the Python runtime's exceptions.
EXCEPTIONS = {cls.__name__: cls for cls in (PackageError, CorruptPackageError, PackageVersionError, PackageDeviceError,
                                            SignatureError, InputError, StepError, ModelRaisedError,
                                            QuantizedEngineError)}

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpp")
SOURCES = ["src/json.cpp", "src/sha256.cpp", "src/signing.cpp", "src/package.cpp", "src/literals.cpp", "src/plan.cpp", "src/state.cpp", "src/signature.cpp",
           "src/module.cpp",
           "src/cpu_kernels.cpp", "src/cuda_kernels.cpp", "src/cuda_graph.cpp", "python/bindings.cpp"]
HEADERS = ["include/jit2triton/jit2triton.h", "src/json.h", "src/sha256.h", "src/signing.h", "src/package.h", "src/literals.h",
           "src/plan.h", "src/state.h"]

_lock = threading.Lock()
_extension = None


def with_cuda() -> bool:
    """Build the GPU half too: a CUDA build of torch and CUDA's headers (a toolkit) on this machine. Where the
    toolkit is, found as torch's cpp_extension finds it (CUDA_HOME, CUDA_PATH, nvcc on the PATH, /usr/local/cuda),
    without importing cpp_extension: that import (setuptools) took 120 ms, most of a cold start."""
    if torch.version.cuda is None:
        return False
    nvcc = shutil.which("nvcc")
    return bool(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or nvcc
                or os.path.exists("/usr/local/cuda"))


def extension():
    """The compiled runtime, built on first use (a minute or two) and cached by content."""
    global _extension
    with _lock:
        if _extension is None:
            _extension = _build()
    return _extension


_unavailable: Optional[str] = None


def unavailable() -> Optional[str]:
    """None when the C++ runtime can be used (building it now if this machine has not yet), else why not: the
    default load then falls back to the Python runtime. A failed build is not retried in this process."""
    global _unavailable
    if _extension is None and _unavailable is None:
        try:
            extension()
        except PackageError as err:
            _unavailable = str(err)
    return _unavailable if _extension is None else None


def _build():
    cuda = with_cuda()
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        with open(os.path.join(ROOT, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    digest.update(f"{torch.__version__} {sys.version_info[:2]} cuda={cuda}".encode())
    name = f"jit2triton_runtime_{digest.hexdigest()[:16]}"
    build_dir = os.path.join(cache_dir("ext"), name)
    built = os.path.join(build_dir, f"{name}.so")
    if os.path.exists(built + ".done"):  # built by an earlier process: import it, no build tools needed
        try:
            return _import(name, built)
        except (ImportError, OSError):  # the library went missing or is damaged: build it again below
            os.remove(built + ".done")
    from torch.utils import cpp_extension
    if not cpp_extension.is_ninja_available():
        raise PackageError("the C++ runtime is built on first use with torch's cpp_extension, which needs ninja: "
                           "pip install ninja (or use the Python runtime: jit2triton.load(path, runtime='python'))")
    os.makedirs(build_dir, exist_ok=True)
    if not os.path.exists(built):
        print(f"jit2triton: building the C++ runtime for torch {torch.__version__} (once per machine, about a minute; "
              f"cached in {build_dir})", file=sys.stderr, flush=True)
    # (the escaped quotes survive the shell that ninja runs the compiler through)
    flags = ["-O2", "-std=c++17", f'-DJ2T_TORCH_VERSION=\\"{torch.__version__}\\"'] + (["-DJ2T_WITH_CUDA"] if cuda else [])
    try:
        module = cpp_extension.load(name=name, sources=[os.path.join(ROOT, s) for s in SOURCES],
                                    extra_include_paths=[os.path.join(ROOT, "include"), os.path.join(ROOT, "src")],
                                    extra_cflags=flags, extra_ldflags=["-ldl"], with_cuda=cuda,
                                    build_directory=build_dir, verbose=False)
    except (RuntimeError, OSError) as err:
        raise PackageError(f"building the C++ runtime failed ({err}); it needs a C++17 compiler and torch's headers. "
                           "Use the Python runtime meanwhile: jit2triton.load(path, runtime='python')") from None
    write_once(built + ".done", b"")  # the marker a later process trusts: the build finished and imported
    return module


def _import(name: str, path: str):
    """The built extension, imported as cpp_extension.load imports it."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class CppRuntime:
    """A package loaded by the C++ runtime; called like the Python `Runtime`."""

    name = "cpp"

    def __init__(self, path: str, map_location: Any = None, num_threads: Optional[int] = None,
                 cuda_graphs: bool = True, alias_outputs: bool = False, mmap: bool = False,
                 trusted_keys: Sequence[str] = ()) -> None:
        device = "" if map_location is None else str(torch.device(map_location))
        self.module = extension().Module(os.fspath(path), device, num_threads or 0, cuda_graphs, alias_outputs,
                                         mmap, list(trusted_keys))
        self.device = torch.device(self.module.device)
        self.uses_cuda_graph = self.module.uses_cuda_graph

    def __call__(self, *inputs: Any) -> Any:
        return self.module(*inputs)

    def methods(self) -> dict:
        """The model's other methods, each called like forward (they share the module's state)."""
        return {name: self.module.method(name) for name in self.module.method_names()}
