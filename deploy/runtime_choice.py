"""Which runtime runs a package: `jit2triton.load` and serving's replicas load through `load_runtime`, so both choose
alike.

"auto" (the default, or the JIT2TRITON_RUNTIME environment variable) takes the C++ runtime and falls back to the
Python one, with a one-time warning, where the C++ one can neither be built on this machine (no compiler) nor be
taken from the package (which carries the build that verified it, usable where this jit2triton, torch and Python made
it): the user then gets the Python runtime, the reference interpreter: a few microseconds of Python per plan step,
and on CUDA no CUDA graphs. It falls back too where conversion found the C++ runtime to run the package wrongly.
From Python the C++ runtime runs, through its extension, what it cannot alone: a Triton package on the CPU (its
kernels under Triton's interpreter) and kernels built for another CPU or GPU (rebuilt from the bundled sources).
"cpp" and "python" insist on one.
"""
from __future__ import annotations

import dataclasses
import json
import os
import warnings
from typing import Any, Callable, Optional, Sequence, Union

from jit2triton.errors import PackageDeviceError

from .package import PackageContents, read_package
from .runtime import DeviceLike, python_runtimes, resolve_map_location
from .signing import trusted_key_paths

RUNTIMES = ("auto", "cpp", "python")


@dataclasses.dataclass(frozen=True)
class LoadedRuntime:
    """A package in the runtime chosen for it: forward's runtime, one per other method, and the package (the C++
    runtime's as it read it, built when first asked: `contents()` copies the weights)."""
    runtime: Any
    methods: dict
    contents: Union[PackageContents, Callable[[], PackageContents]]

    @property
    def manifest(self) -> dict:
        if isinstance(self.contents, PackageContents):
            return self.contents.manifest
        return json.loads(self.runtime.module.member("manifest.json"))  # the bytes the C++ runtime read


def load_runtime(path: Union[str, os.PathLike], runtime: Optional[str] = None, map_location: DeviceLike = None,
                 num_threads: Optional[int] = None, cuda_graphs: bool = True, alias_outputs: bool = False,
                 mmap: bool = False, trusted_keys: Optional[Sequence[Union[str, os.PathLike]]] = None,
                 built_here: bool = False) -> LoadedRuntime:
    """The package at `path` in the runtime `runtime` names (None: JIT2TRITON_RUNTIME, else "auto"). `built_here`:
    a package this process just converted (`jit2triton.convert`'s module), which no key signed and none need, and
    which falls back to the Python runtime without the warning (its `runtime` says where it runs)."""
    path = os.fspath(path)
    trusted_keys = [] if built_here else trusted_key_paths(trusted_keys)
    runtime = runtime or os.environ.get("JIT2TRITON_RUNTIME") or "auto"
    if runtime not in RUNTIMES:
        raise ValueError(f"runtime must be one of {', '.join(RUNTIMES)}, not {runtime!r}")
    why = None
    if runtime != "python":
        from . import cpp_runtime
        # "cpp": build it (or take the package's) or say why it cannot
        why = cpp_runtime.unavailable(path, trusted_keys) if runtime == "auto" else None
        if why is None:
            if isinstance(map_location, dict):  # which entry applies depends on the device the package was built for
                built_for = read_package(path, mmap=True, trusted_keys=trusted_keys,
                                         keys_from_environment=False).manifest["device"]
                map_location = resolve_map_location(map_location, built_for)
            try:
                loaded = cpp_runtime.CppRuntime(path, map_location, num_threads, cuda_graphs, alias_outputs, mmap,
                                                trusted_keys)
                return LoadedRuntime(loaded, loaded.methods(), loaded.contents)
            except PackageDeviceError as err:
                if runtime == "cpp":
                    raise
                why = str(err)  # the Python runtime may run it (rebuilding kernels, or under Triton's interpreter)
    contents = read_package(path, mmap=mmap, trusted_keys=trusted_keys, keys_from_environment=False)
    forward, methods = python_runtimes(contents, map_location, num_threads)  # (no CUDA graphs there)
    if runtime == "auto" and not built_here:  # only once it runs there: a package neither runtime can run gets its one
        _python_fallback_notice(why)       # error alone (convert's module says which runs it: its `runtime`)
    return LoadedRuntime(forward, methods, contents)


_noticed: set[str] = set()


def _python_fallback_notice(why: str) -> None:
    """Once per reason and process: the default fell back to the Python runtime, and what that costs."""
    if why in _noticed:
        return
    _noticed.add(why)
    warnings.warn(f"jit2triton: running the package in the Python runtime, the reference interpreter, which adds a "
                  f"few microseconds of Python per plan step to every call and runs no CUDA graphs (the C++ runtime "
                  f"adds none and runs them): {why}. Pass runtime='python' (or set "
                  "JIT2TRITON_RUNTIME=python) to choose it and silence this", stacklevel=4)
