"""The C++ runtime from Python: what `jit2triton.load` runs, and what conversion verifies a package in.

The runtime's sources (deploy/cpp) are built into a Python extension with torch's cpp_extension on first use and
cached under ~/.cache/jit2triton/ext, keyed by a hash of the sources, the torch version and the Python version: a
later process (or a later load) only imports it, in a folder checked to be the user's own (emitters/cache.py), and
only from bytes whose sha256 is the one recorded when it was built. Once loaded, a call converts the inputs, releases the GIL and runs
the whole plan in C++ (kernels, ATen ops, control flow, CUDA graphs), so no per-step Python work remains.

A package carries the build that verified it (`runtime/<build name>.so`, checked and signed with the package's other
members): a machine that cannot build the runtime (no compiler, no ninja) runs it from there, where it was built from
these sources for this torch and Python (the build name says so). Where neither is possible, load says what to
install (deploy/runtime_choice.py).
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import importlib.machinery
import importlib.util
import os
import shutil
import sys
import threading
from typing import Any, Optional, Sequence

import torch

from jit2triton.emitters.cache import cache_dir, write_once
from jit2triton.errors import (CorruptPackageError, InputError, Jit2TritonError, ModelRaisedError, PackageDeviceError,
                               PackageError, PackageVersionError, QuantizedEngineError, SignatureError, SizeChangedError,
                               StepError)

from .package import PackageContents, package_from_members
from .policy import RECONVERT
from .signature import output_rebuilder
from .verified_library import open_verified

# The classes the extension raises, by name: the C++ runtime's errors are jit2triton's exceptions.
EXCEPTIONS = {cls.__name__: cls for cls in (PackageError, CorruptPackageError, PackageVersionError, PackageDeviceError,
                                            SignatureError, InputError, StepError, ModelRaisedError,
                                            QuantizedEngineError, SizeChangedError)}

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpp")
SOURCES = ["src/json.cpp", "src/sha256.cpp", "src/signing.cpp", "src/package.cpp", "src/literals.cpp", "src/plan.cpp",
           "src/host_ops.cpp", "src/plan_check.cpp", "src/state.cpp", "src/signature.cpp", "src/module.cpp",
           "src/cpu_kernels.cpp", "src/cuda_kernels.cpp", "src/cuda_graph.cpp", "src/native_ops.cpp",
           "python/bindings.cpp"]
HEADERS = ["include/jit2triton/jit2triton.h", "src/json.h", "src/sha256.h", "src/signing.h", "src/package.h", "src/literals.h",
           "src/plan.h", "src/graph_admission.h", "src/host_ops.h", "src/plan_check.h", "src/state.h", "src/policy.h", "src/op_facts.h", "src/manifest_schema.h", "src/scalar_ops.h"]

HASH_SUFFIX = ".sha256"  # beside the built extension: the sha256 of its bytes, written when it was built
CARRIED = "runtime/"  # a package's member holding the runtime build that verified it: runtime/<build name>.so

_lock = threading.Lock()
_extension = None
_bytes: Optional[tuple[str, bytes]] = None  # (build name, bytes) of the extension this process imported


def with_cuda() -> bool:
    """Build the GPU half too: a CUDA build of torch and CUDA's headers (a toolkit) on this machine. Where the
    toolkit is, found as torch's cpp_extension finds it (CUDA_HOME, CUDA_PATH, nvcc on the PATH, /usr/local/cuda),
    without importing cpp_extension: that import (setuptools) took 120 ms, most of a cold start."""
    if torch.version.cuda is None:
        return False
    nvcc = shutil.which("nvcc")
    return bool(os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or nvcc
                or os.path.exists("/usr/local/cuda"))


def extension(package: Optional[str] = None, trusted_keys: Sequence[str] = ()):
    """The compiled runtime, built on first use (a minute or two) and cached by content; where it cannot be built,
    the one `package` carries, if that fits this machine (else the build's PackageError)."""
    global _extension
    with _lock:
        if _extension is None:
            try:
                _extension = _build()
            except PackageError:
                if package is None or _carried(package, trusted_keys) is None:
                    raise
    return _extension


_unavailable: Optional[str] = None


def unavailable(package: Optional[str] = None, trusted_keys: Sequence[str] = ()) -> Optional[str]:
    """None when the C++ runtime can be used (building it now if this machine has not yet, or taking the build
    `package` carries where none can be made here), else why not. A failed build is not retried in this process."""
    global _unavailable
    if _extension is None and _unavailable is None:
        try:
            extension()
        except PackageError as err:
            _unavailable = str(err)
    if _extension is None and package is not None:
        with _lock:
            if _extension is None and _carried(package, trusted_keys) is None:
                return (f"{_unavailable}; and the package carries no C++ runtime built from this jit2triton for "
                        f"torch {torch.__version__} and Python {sys.version_info[0]}.{sys.version_info[1]}")
    return _unavailable if _extension is None else None


def carried_member() -> Optional[tuple[str, bytes]]:
    """(member name, bytes): the runtime build this process runs, for a package verified in it to carry to machines
    that cannot build it; None where none is loaded."""
    return None if _bytes is None else (f"{CARRIED}{_bytes[0]}.so", _bytes[1])


def _carried(package: str, trusted_keys: Sequence[str]):
    """The runtime build `package` carries, imported (and made this process's extension), where it is a build of
    these sources for this torch and Python, with or without the GPU half: its member's name says which. None where
    the package carries none that fits, or cannot be read (the load that follows says what is wrong with it).
    Called under _lock."""
    global _extension, _bytes
    from .package import read_package
    try:
        files = read_package(package, mmap=True, trusted_keys=list(trusted_keys), keys_from_environment=False).files
    except (Jit2TritonError, OSError):
        return None
    for name in (build_name(cuda) for cuda in (True, False)):
        data = files.get(f"{CARRIED}{name}.so")
        if data is None:
            continue
        data = bytes(data)
        try:  # (the bytes the package's checksums cover, opened as they are: open_verified)
            module = open_verified(data, lambda path, name=name: _import(name, path), name)
        except (ImportError, OSError):
            continue
        _extension, _bytes = module, (name, data)
        return module
    return None


def _flags(cuda: bool) -> list[str]:
    # No FMA contraction anywhere in the runtime: its own kernels (native_ops.cpp) give ATen's and torchvision's bits,
    # their loops vectorised by `omp simd` (-fopenmp-simd: the pragma only, no OpenMP runtime). (The escaped quotes
    # survive the shell that ninja runs the compiler through.)
    return (["-O2", "-ffp-contract=off", "-fopenmp-simd", "-std=c++17",
             f'-DJ2T_TORCH_VERSION=\\"{torch.__version__}\\"'] + (["-DJ2T_WITH_CUDA"] if cuda else []))


def build_name(cuda: bool) -> str:
    """The extension's name, and its cache folder's: a hash of its sources, its flags and what it is built against."""
    digest = hashlib.sha256()
    for name in SOURCES + HEADERS:
        with open(os.path.join(ROOT, name), "rb") as f:
            digest.update(name.encode() + b"\0" + f.read())
    digest.update(f"{torch.__version__} {sys.version_info[:2]} cuda={cuda} {' '.join(_flags(cuda))}".encode())
    return f"jit2triton_runtime_{digest.hexdigest()[:16]}"


def _build():
    cuda = with_cuda()
    name = build_name(cuda)
    build_dir = cache_dir(f"ext/{name}")  # each folder ours and private (emitters/cache.py), or refused
    built = os.path.join(build_dir, f"{name}.so")
    module = _import_checked(name, built, empty=False)
    if module is not None:  # built by an earlier process: no build tools needed
        return module
    # One build at a time across processes (two conversions, a test run beside a program): without it, a second
    # process empties the folder the first is compiling in, and both builds fail. Whoever waited imports the
    # first one's build.
    with open(build_dir + ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            return _import_checked(name, built) or _built_now(name, build_dir, built, cuda)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _built_now(name: str, build_dir: str, built: str, cuda: bool):
    from torch.utils import cpp_extension
    if not cpp_extension.is_ninja_available():
        raise PackageError("the C++ runtime is built on first use with torch's cpp_extension, which needs ninja: "
                           "pip install ninja")
    print(f"jit2triton: building the C++ runtime for torch {torch.__version__} (once per machine, about a minute; "
          f"cached in {build_dir})", file=sys.stderr, flush=True)
    global _bytes
    module = _compile(name, build_dir, cuda)
    with open(built, "rb") as f:  # what a later process checks before it imports the build
        data = f.read()
    write_once(built + HASH_SUFFIX, hashlib.sha256(data).hexdigest().encode())
    _bytes = (name, data)
    return module


def _import_checked(name: str, built: str, empty: bool = True):
    """The extension an earlier process built, imported from exactly the bytes that hash to what that build
    recorded (deploy/verified_library.py). None when there is none, or it is not what was built (damaged, replaced,
    or from a jit2triton that recorded no hash): then, with `empty` (under the build lock), its folder is emptied,
    so the build starts from nothing of what was there."""
    global _bytes
    try:
        with open(built + HASH_SUFFIX, "rb") as f:
            recorded = f.read().decode("ascii", "replace").strip()
        with open(built, "rb") as f:
            data = f.read()
    except OSError:
        data = None
    if data is not None and hashlib.sha256(data).hexdigest() == recorded:
        try:
            module = open_verified(data, lambda path: _import(name, path), name)
        except (ImportError, OSError):
            pass
        else:
            _bytes = (name, data)
            return module
    if empty:
        _empty(os.path.dirname(built))
    return None


def _empty(folder: str) -> None:
    for entry in os.listdir(folder):
        path = os.path.join(folder, entry)
        shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)


def _compile(name: str, build_dir: str, cuda: bool):
    from torch.utils import cpp_extension
    flags = _flags(cuda)
    try:
        return cpp_extension.load(name=name, sources=[os.path.join(ROOT, s) for s in SOURCES],
                                  extra_include_paths=[os.path.join(ROOT, "include"), os.path.join(ROOT, "src")],
                                  extra_cflags=flags, extra_ldflags=["-ldl"], with_cuda=cuda,
                                  build_directory=build_dir, verbose=False)
    except (RuntimeError, OSError) as err:
        raise PackageError(f"building the C++ runtime failed ({err}); it needs a C++17 compiler (g++ or clang++) "
                           "and torch's headers") from None


def _import(name: str, path: str):
    """The built extension at `path`, imported as cpp_extension.load imports it (the path need not end in .so)."""
    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_loader(name, loader, origin=path)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


class CppRuntime:
    """A package loaded by the C++ runtime, called like the model."""

    name = "cpp"

    def __init__(self, path: str, map_location: Any = None, num_threads: Optional[int] = None,
                 cuda_graphs: bool = True, alias_outputs: bool = False, mmap: bool = False,
                 trusted_keys: Sequence[str] = ()) -> None:
        device = "" if map_location is None else str(torch.device(map_location))
        self.path = os.fspath(path)
        self.module = extension(self.path, trusted_keys).Module(self.path, device, num_threads or 0, cuda_graphs,
                                                                alias_outputs, mmap, list(trusted_keys))
        self.device = torch.device(self.module.device)
        self.uses_cuda_graph = self.module.uses_cuda_graph
        # The C++ runtime returns a NamedTuple as a plain tuple (deploy/cpp/src/module.cpp says why); the model's
        # NamedTuple classes are made here, once, from the signature the C++ runtime checked.
        self.rebuilders = named_tuple_rebuilders(self.module.member("manifest.json"))
        self.rebuild_outputs = self.rebuilders.get("forward")
        self.fastest_call = self.module if self.rebuild_outputs is None else self  # (no Python frame between)

    def contents(self) -> PackageContents:
        """The package as this runtime read and checked it (for reports and saving): the file it runs, never the
        path read again (it may name another file by now)."""
        return package_from_members(self.path, self.module.members(), self.module.weights())

    def __call__(self, *inputs: Any) -> Any:
        output = self.module(*inputs)
        return output if self.rebuild_outputs is None else self.rebuild_outputs(output)

    def set_profiling(self, on: bool, host_only: bool = False) -> None:
        """Per-step timers in the C++ plan (on: cleared and started), for `jit2triton bench --profile`; `host_only`:
        no synchronisation around a step (`--host-profile`)."""
        self.module.set_profiling(on, host_only)

    def step_times(self) -> list[tuple[int, float, int]]:
        """(node, exclusive seconds, runs) of each step timed since profiling was turned on."""
        return [(node, seconds, runs) for node, _op, _source, seconds, runs in self.module.step_times()]

    def attribute(self, name: str) -> Any:
        """A copy of the current value of an attribute the model writes (`m.calls`)."""
        return self.module.attribute(name)

    def methods(self) -> dict:
        """The model's other methods, each called like forward (they share the module's state)."""
        return {name: _returning_named_tuples(self.module.method(name), self.rebuilders.get(name))
                for name in self.module.method_names()}


def named_tuple_rebuilders(manifest: bytes) -> dict:
    """Per method ("forward" and the others) that returns NamedTuples, what rebuilds them (deploy/signature.py)."""
    try:
        parsed = json.loads(manifest)
        signatures = {"forward": parsed["signature"],
                      **{name: own["signature"] for name, own in (parsed.get("methods") or {}).items()}}
        rebuilders = {name: output_rebuilder(sig["outputs"]) for name, sig in signatures.items()}
    except (KeyError, TypeError, AttributeError, ValueError) as err:
        raise CorruptPackageError(f"the package's signature is damaged "
                                  f"({type(err).__name__}: {err}); {RECONVERT}") from None
    return {name: rebuild for name, rebuild in rebuilders.items() if rebuild is not None}


def _returning_named_tuples(method, rebuild):
    return method if rebuild is None else (lambda *inputs: rebuild(method(*inputs)))
