"""How a package is loaded: `jit2triton.load`, `jit2triton.convert`'s module and serving's replicas load through
`load_runtime`, so all run it alike, in the C++ runtime (deploy/cpp), the runtime conversion verified it in.

From Python the runtime is a Python extension built on first use (deploy/cpp_runtime.py), or taken from the package
(which carries the build that verified it) where this machine cannot build one. Where neither is possible (no
compiler, and the package's build is of another jit2triton, torch or Python), load raises a RuntimeUnavailableError
that says what to install. Through the extension the C++ runtime runs what it cannot alone: a Triton package on the
CPU (its kernels under Triton's interpreter) and kernels built for another CPU or GPU (rebuilt from the bundled
sources).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Callable, Optional, Sequence, Union

import torch

from jit2triton.errors import PackageDeviceError, RuntimeUnavailableError

from .package import PackageContents, read_package
from .signing import trusted_key_paths

DeviceLike = Union[str, torch.device, dict, None]  # a dict maps the device saved to the one wanted, as torch.jit
RUNTIMES = ("auto", "cpp")


@dataclasses.dataclass(frozen=True)
class LoadedRuntime:
    """A package in the C++ runtime: forward's, one per other method, and the package as the runtime read it (built
    when first asked: `contents()` copies the weights)."""
    runtime: Any
    methods: dict
    contents: Callable[[], PackageContents]

    @property
    def manifest(self) -> dict:
        return json.loads(self.runtime.module.member("manifest.json"))  # the bytes the C++ runtime read


def load_runtime(path: Union[str, os.PathLike], runtime: Optional[str] = None, map_location: DeviceLike = None,
                 num_threads: Optional[int] = None, cuda_graphs: bool = True, alias_outputs: bool = False,
                 mmap: bool = False, trusted_keys: Optional[Sequence[Union[str, os.PathLike]]] = None,
                 built_here: bool = False) -> LoadedRuntime:
    """The package at `path` in the C++ runtime. `runtime` (None: JIT2TRITON_RUNTIME, else "auto") is "auto" or
    "cpp", both the C++ runtime. `built_here`: a package this process just converted (`jit2triton.convert`'s
    module), which no key signed and none need."""
    from . import cpp_runtime

    path = os.fspath(path)
    trusted_keys = [] if built_here else trusted_key_paths(trusted_keys)
    runtime = runtime or os.environ.get("JIT2TRITON_RUNTIME") or "auto"
    if runtime == "python":
        raise ValueError("the Python runtime is retired: packages run in the C++ runtime, which conversion verified "
                         "them in (from Python through its extension, built on first use or carried by the package). "
                         "Leave `runtime` out (and unset JIT2TRITON_RUNTIME)")
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
    why = cpp_runtime.unavailable(path, trusted_keys)
    if why is not None:
        raise RuntimeUnavailableError(
            f"the C++ runtime that runs packages cannot be used here: {why}. Install a C++17 compiler (g++ or "
            "clang++) and ninja (pip install ninja) once, and load again (the runtime is built once per machine and "
            "cached); or convert the package with this jit2triton, torch and Python, so that it carries a build "
            "that runs here")
    if isinstance(map_location, dict):  # which entry applies depends on the device the package was built for
        built_for = read_package(path, mmap=True, trusted_keys=trusted_keys,
                                 keys_from_environment=False).manifest["device"]
        map_location = resolve_map_location(map_location, built_for)
    loaded = cpp_runtime.CppRuntime(path, map_location, num_threads, cuda_graphs, alias_outputs, mmap, trusted_keys)
    return LoadedRuntime(loaded, loaded.methods(), loaded.contents)


def resolve_map_location(map_location: DeviceLike, built_for: str) -> Union[str, torch.device, None]:
    """torch.jit.load's map_location forms: a device (or its name), or a dict from the device the package was built
    for to the one to load it on; a dict without that device leaves it where it was built. A package records only
    its device type (its kernels run on any GPU of the same architecture), so a "cuda:0" key applies to a CUDA
    package as "cuda" does (an exact "cuda" key first)."""
    if not isinstance(map_location, dict):
        return map_location
    built = torch.device(built_for)
    keys = {}
    for saved, wanted in map_location.items():
        try:
            keys[saved] = torch.device(saved)
        except (RuntimeError, TypeError):
            raise PackageDeviceError(f"map_location has a key {saved!r} that is not a device (use names like "
                                     "'cpu', 'cuda' or 'cuda:0')") from None
    for saved, wanted in map_location.items():
        if keys[saved] == built:
            return wanted
    for saved, wanted in map_location.items():
        if keys[saved].type == built.type:
            return wanted
    return None
