"""Load a package's Triton kernels: one launcher per kernel, `launch(inputs, outputs[, sizes])`; `sizes` are the
call's values of the dynamic dims the kernel takes (its "size_args"), which also set its grid.

On CUDA each kernel's cubin is loaded with the CUDA driver (cuModuleLoadData) and launched with cuLaunchKernel
through ctypes, on torch's current stream, with the grid, warps and shared memory recorded at convert time: no
Triton compiler, no C compiler, and Triton itself need not be installed. A GPU of another architecture than the
cubins' gets them rebuilt from the bundled sources, once, with a warning. On the CPU the sources run under Triton's
interpreter.
"""
from __future__ import annotations

import ctypes
import json
import struct
import warnings
from typing import Any, Callable, Optional

import torch

from jit2triton.errors import CorruptPackageError, PackageDeviceError

from .package import PackageContents
from .policy import RECONVERT, message
from .sizes import positional_size_function

CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
STATIC_SHARED_LIMIT = 48 * 1024  # above this a kernel must opt in to dynamic shared memory
ALIGNMENT = 16  # the cubins assume every pointer 16-byte aligned but the entry's "unaligned" inputs
# (see emitters/compile_triton.compile_config)
# a host number a kernel takes by value (emitters/triton.py SCALAR_TYPES) -> its bits in a 64-bit argument slot
NUMBER_BITS = {"i64": lambda n: int(n) & 0xFFFF_FFFF_FFFF_FFFF,
               "fp64": lambda x: struct.unpack("<Q", struct.pack("<d", float(x)))[0]}
SCRATCH_POINTERS = 2  # Triton kernels end with global and profile scratch pointers (null: our kernels use none)


def load_kernels(contents: PackageContents, num_threads: Optional[int], device: torch.device) -> dict[str, Callable]:
    """The package's kernels on `device` (Triton sets its own parallelism: `num_threads` is not its)."""
    return load_triton_kernels(contents.files, contents.manifest.get("triton"), contents.manifest["kernels"], device)


def load_triton_kernels(files: dict[str, bytes], section: Optional[dict], kernels: list[dict],
                        device: torch.device) -> dict[str, Callable]:
    entries = _entries(files, section, kernels)
    if device.type == "cuda":
        return _load_cuda(files, entries, device)
    return _load_interpreted(files, entries)


def rebuilt_for_cpp(files: dict[str, bytes], section: Optional[dict], kernels: list[dict], arch: int,
                    index: int) -> tuple[str, dict[str, bytes]]:
    """For the C++ runtime (deploy/cpp/python/bindings.cpp): the Triton section, as JSON, with every kernel rebuilt
    for this GPU (sm_`arch`) from the bundled sources, and the new cubins by kernel name (_rebuilt's warning, or
    its error naming what to install)."""
    entries = _entries(files, section, kernels)
    rebuilt = _rebuilt(files, entries, arch, {entry.get("arch") for entry in entries.values()},
                       torch.device("cuda", index))
    cubins = {name: entry.pop("cubin") for name, entry in rebuilt.items()}
    for entry in rebuilt.values():
        entry["arch"] = arch
        entry["zeroed"] = list(entry["zeroed"])
    return json.dumps(dict(section, kernels={**section["kernels"], **rebuilt})), cubins


def _entries(files: dict[str, bytes], section: Optional[dict], kernels: list[dict]) -> dict[str, dict]:
    """Each kernel's launch entry, checked against the kernel index, with what the launchers need from it."""
    if not section or "kernels" not in section:
        raise CorruptPackageError("the package lists Triton kernels but has no 'triton' manifest section; " + RECONVERT)
    entries = {}
    for meta in kernels:
        entry = section["kernels"].get(meta["name"])
        if entry is None or entry["source"] not in files:
            raise CorruptPackageError(f"the package has no Triton kernel {meta['name']!r}; {RECONVERT}")
        if list(entry.get("size_args", ())) != list(meta.get("sizes", ())):
            raise CorruptPackageError(message("kernel_sizes", kernel=repr(entry["function"])))
        # (the kernel index says which inputs are host numbers the kernel takes by value; the launcher needs it)
        entries[meta["name"]] = dict(entry, by_value=meta.get("by_value", []), zeroed=_zeroed(entry, meta))
    return entries


def _zeroed(entry: dict, meta: dict) -> tuple[int, ...]:
    """The outputs the launcher zeroes before each launch (a kernel that adds into them atomically), checked to be
    positions among the kernel's outputs."""
    zeroed = entry.get("zeroed", [])
    outputs = len(meta.get("outputs") or ())
    if not isinstance(zeroed, list) or not all(type(i) is int and 0 <= i < outputs for i in zeroed):
        raise CorruptPackageError(message("kernel_zeroed", kernel=repr(entry["function"])))
    return tuple(zeroed)


# --- the CPU: Triton's interpreter ----------------------------------------------------------------------------


def _load_interpreted(files: dict[str, bytes], entries: dict[str, dict]) -> dict[str, Callable]:
    from jit2triton.emitters.compile_triton import INTERPRETER_HINT, interpreter_active, triton_available
    if not triton_available():
        raise PackageDeviceError("the package's Triton kernels run on the CPU under Triton's interpreter, and Triton "
                                 "is not installed: pip install 'triton>=3.6', or convert with backend='cpp'")
    if not interpreter_active():
        raise PackageDeviceError("the package's Triton kernels run on the CPU under Triton's interpreter, which is "
                                 f"off in this process: {INTERPRETER_HINT}; or convert with backend='cpp'")
    from jit2triton.emitters.compile_triton import kernel_function
    launchers = {}
    for name, entry in entries.items():
        fn = kernel_function(files[entry["source"]].decode(), entry["function"])
        launchers[name] = _interpreted_launcher(fn, entry)
    return launchers


def interpreted_for_cpp(files: dict[str, bytes], section: Optional[dict], kernels: list[dict]) -> dict[str, Callable]:
    """Launchers of the package's Triton kernels on the CPU for the C++ runtime (deploy/cpp/python/bindings.cpp),
    which calls each with the launch's inputs and outputs and its 64-bit words: the sizes the kernel takes, then the
    bits of each host number it takes by value (a None among the inputs, where that number goes)."""
    launchers = load_triton_kernels(files, section, kernels, torch.device("cpu"))
    made = {}
    for meta in kernels:
        entry = section["kernels"][meta["name"]]
        numbers = [(i, entry["arg_types"][i]) for i in meta.get("by_value") or ()]
        if not all(kind in NUMBER_BITS for _, kind in numbers):
            raise CorruptPackageError(message("kernel_numbers", kernel=repr(entry["function"])))
        made[meta["name"]] = _from_words(launchers[meta["name"]], len(meta.get("sizes") or ()), numbers)
    return made


def _from_words(launch: Callable, num_sizes: int, numbers: list[tuple[int, str]]) -> Callable:
    def call(inputs: list, outputs: list, words: list) -> None:
        for (i, kind), word in zip(numbers, words[num_sizes:]):
            inputs[i] = word if kind == "i64" else struct.unpack("<d", struct.pack("<q", word))[0]
        if num_sizes:
            launch(inputs, outputs, words[:num_sizes])
        else:
            launch(inputs, outputs)
    return call


def _grid_function(entry: dict) -> Callable[[list], int]:
    """A kernel's grid size (programs on axis 0) from the call's size arguments: fixed for a static grid."""
    if "grid_items" not in entry:
        programs = entry["grid"][0]
        return lambda sizes: programs
    names = {d for _, dims in entry["grid_items"] for d in dims}
    if not names <= set(entry.get("size_args", ())):
        raise CorruptPackageError(f"kernel {entry['function']!r}'s grid names dims it is not given; {RECONVERT}")
    items, block = positional_size_function(entry["grid_items"], entry["size_args"]), entry["constants"]["XBLOCK"]
    return lambda sizes: -(-items(sizes) // block)


def _interpreted_launcher(fn, entry: dict) -> Callable:
    grid, constants, zeroed = tuple(entry["grid"]), entry["constants"], entry["zeroed"]
    if entry.get("size_args"):
        grid_of = _grid_function(entry)

        def launch_dynamic(inputs: list, outputs: list, sizes: list) -> None:
            for i in zeroed:
                outputs[i].zero_()
            programs = grid_of(sizes)
            if programs:
                fn[(programs,)](*inputs, *outputs, *sizes, **constants)
        return launch_dynamic

    def launch(inputs: list, outputs: list) -> None:
        for i in zeroed:
            outputs[i].zero_()
        if grid[0]:
            fn[grid](*inputs, *outputs, **constants)

    return launch


# --- CUDA: cubins through the driver API --------------------------------------------------------------------


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (CUDA 12): grid, block, shared memory and stream of a launch; built once per kernel, so a
    call writes only the stream into it."""
    _fields_ = [("grid_x", ctypes.c_uint), ("grid_y", ctypes.c_uint), ("grid_z", ctypes.c_uint),
                ("block_x", ctypes.c_uint), ("block_y", ctypes.c_uint), ("block_z", ctypes.c_uint),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p),
                ("num_attrs", ctypes.c_uint)]


class _Driver:
    """The few CUDA driver calls a launch needs, through ctypes on libcuda."""

    def __init__(self) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as err:
            raise PackageDeviceError(f"the CUDA driver library (libcuda.so.1) cannot be opened ({err}); "
                                     "install the NVIDIA driver") from None
        p, i = ctypes.c_void_p, ctypes.c_int
        self.lib.cuModuleLoadData.argtypes = (ctypes.POINTER(p), p)
        self.lib.cuModuleGetFunction.argtypes = (ctypes.POINTER(p), p, ctypes.c_char_p)
        self.lib.cuFuncSetAttribute.argtypes = (p, i, i)
        self.lib.cuGetErrorString.argtypes = (i, ctypes.POINTER(ctypes.c_char_p))
        # Launches go through PyDLL, which keeps the GIL: cuLaunchKernelEx only queues work, and holding the GIL
        # means no other thread can touch a launcher's reused argument buffers during the call. Its four
        # arguments are ctypes objects made at load, passed without argtypes: no conversion per call (on an H100
        # host, 3.7 us a launch against 5.2 us for cuLaunchKernel's eleven converted arguments).
        held = ctypes.PyDLL("libcuda.so.1")
        if not hasattr(held, "cuLaunchKernelEx"):
            raise PackageDeviceError("the CUDA driver is older than CUDA 12 (no cuLaunchKernelEx); update the "
                                     "NVIDIA driver")
        held.cuLaunchKernelEx.restype = i
        self.launch = held.cuLaunchKernelEx

    def check(self, result: int, what: str) -> None:
        if result != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(result, ctypes.byref(text))
            raise PackageDeviceError(f"CUDA {what} failed: {(text.value or b'').decode()} (error {result})")

    def function(self, cubin: bytes, name: str, shared: int) -> ctypes.c_void_p:
        module, function = ctypes.c_void_p(), ctypes.c_void_p()
        image = ctypes.create_string_buffer(cubin, len(cubin))
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), image), f"loading kernel {name}")
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode()),
                   f"finding kernel {name}")
        if shared > STATIC_SHARED_LIMIT:
            self.check(self.lib.cuFuncSetAttribute(function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared),
                       f"granting kernel {name} {shared} bytes of shared memory")
        return function


_driver: Optional[_Driver] = None


def _get_driver() -> _Driver:
    global _driver
    if _driver is None:
        _driver = _Driver()
    return _driver


def _load_cuda(files: dict[str, bytes], entries: dict[str, dict], device: torch.device) -> dict[str, Callable]:
    index = device.index if device.index is not None else torch.cuda.current_device()
    major, minor = torch.cuda.get_device_capability(index)
    arch = major * 10 + minor
    built_for = {entry.get("arch") for entry in entries.values()}
    if built_for != {arch}:
        entries = _rebuilt(files, entries, arch, built_for, torch.device("cuda", index))
    driver = _get_driver()
    launchers = {}
    with torch.cuda.device(index):
        torch.cuda.current_stream()  # makes this device's primary context current on this thread
        for name, entry in entries.items():
            binary = entry.get("cubin") or files.get(entry.get("binary", ""))
            if binary is None:
                raise CorruptPackageError(f"the package has no compiled binary for kernel {name!r}; {RECONVERT}")
            function = driver.function(binary, entry["function"], entry["shared"])
            launchers[name] = _cuda_launcher(driver, function, entry, index)
    return launchers


def _rebuilt(files: dict[str, bytes], entries: dict[str, dict], arch: int, built_for: set,
             device: torch.device) -> dict[str, dict]:
    """Entries whose cubins were compiled here from the bundled sources, for a GPU the package was not built for."""
    from jit2triton.emitters.compile_triton import COMPILER_HINT, interpreter_active, triton_available
    found = ", ".join(f"sm_{a}" for a in sorted(a for a in built_for if a is not None)) or "an unknown GPU"
    if not triton_available():
        raise PackageDeviceError(f"the package's GPU kernels were built for {found} and this GPU is sm_{arch}; "
                                 "rebuilding them needs Triton: pip install 'triton>=3.6', or convert again here")
    if interpreter_active():
        raise PackageDeviceError(f"the package's GPU kernels were built for {found} and this GPU is sm_{arch}, so "
                                 f"they must be rebuilt from source, but {COMPILER_HINT}")
    warnings.warn(f"jit2triton: the package's GPU kernels were built for {found} and this GPU is sm_{arch}; "
                  "rebuilding them from the bundled sources (Triton caches the result on disk)", stacklevel=4)
    from jit2triton.emitters.compile_triton import compile_config, launch_entry
    from jit2triton.emitters.triton import TritonKernel
    rebuilt = {}
    with torch.cuda.device(device):
        for name, entry in entries.items():
            r = TritonKernel(entry["function"], files[entry["source"]].decode(), entry["arg_types"], 0,
                             unaligned=tuple(entry.get("unaligned", ())))
            config = {"constants": entry["constants"], "num_warps": entry["num_warps"]}
            compiled = compile_config(r, config, device)
            fresh = {k: v for k, v in launch_entry(r, config, compiled).items() if k != "grid"}
            rebuilt[name] = dict(entry, **fresh, cubin=compiled.asm["cubin"])
    return rebuilt


def _cuda_launcher(driver: _Driver, function: ctypes.c_void_p, entry: dict[str, Any], index: int) -> Callable:
    if entry.get("num_ctas", 1) != 1:
        raise PackageDeviceError("the package's kernels use thread-block clusters, which this runtime does not "
                                 "launch; convert again with this jit2triton")
    grid_x, grid_y, grid_z = entry["grid"]
    dynamic = bool(entry.get("size_args"))
    grid_of = _grid_function(entry)
    zeroed = entry["zeroed"]  # outputs the kernel adds into atomically: zeroed first, even where it has no programs
    if not grid_x and "grid_items" not in entry:
        def no_programs(inputs: list, outputs: list, sizes: Optional[list] = None) -> None:
            for k in zeroed:
                outputs[k].zero_()
        return no_programs
    scratch_per_program = entry.get("global_scratch_size", 0)
    scratch = scratch_per_program * grid_x * grid_y * grid_z
    num_args = len(entry["arg_types"])
    launch_kernel, check, device = driver.launch, driver.check, torch.device("cuda", index)
    current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or \
        (lambda i: torch.cuda.current_stream(i).cuda_stream)
    name = entry["function"]
    first_size = num_args - len(entry.get("size_args", ()))  # a size goes in a 64-bit slot; an i32 one is read
    # as its low half, which on the little-endian hosts CUDA runs on is the value
    several_gpus = torch.cuda.device_count() > 1
    # the inputs compiled for any address (a view that starts elsewhere each call): passed as they are
    unaligned = entry.get("unaligned", [])
    if not isinstance(unaligned, list) or not all(type(i) is int and 0 <= i < first_size for i in unaligned):
        raise CorruptPackageError(message("kernel_unaligned", kernel=repr(name)))
    alignment = [1 if i in unaligned else ALIGNMENT for i in range(first_size)]
    # inputs that are host numbers: their bits, where a pointer would go
    numbers = entry["by_value"]
    if (not isinstance(numbers, list) or not all(type(i) is int and 0 <= i < first_size for i in numbers)
            or any((i in numbers) != (t in NUMBER_BITS) for i, t in enumerate(entry["arg_types"][:first_size]))):
        raise CorruptPackageError(message("kernel_numbers", kernel=repr(name)))
    bits = {i: NUMBER_BITS[entry["arg_types"][i]] for i in numbers}

    # Everything but the pointers and the stream is fixed at load: a call writes this call's pointers into the
    # argument buffer and the current stream into the launch configuration.
    config = _LaunchConfig(grid_x, grid_y, grid_z, 32 * entry["num_warps"], 1, 1, entry["shared"], None, None, 0)
    config_pointer = ctypes.pointer(config)
    values = (ctypes.c_uint64 * (num_args + SCRATCH_POINTERS))()
    params = (ctypes.c_void_p * (num_args + SCRATCH_POINTERS))(
        *[ctypes.addressof(values) + 8 * i for i in range(num_args + SCRATCH_POINTERS)])

    def launch(inputs: list, outputs: list, sizes: Optional[list] = None) -> None:
        keep = []  # aligned copies and scratch memory, alive until the launch is queued
        scratch_bytes = scratch
        for k in zeroed:  # (on torch's current stream, as the launch: ordered before it)
            outputs[k].zero_()
        if dynamic:  # sizes (after the buffers) and the grid are the call's
            programs = grid_of(sizes)
            if not programs:
                return
            config.grid_x = programs
            scratch_bytes = scratch_per_program * programs
            for k, n in enumerate(sizes):
                values[first_size + k] = n
        i = 0
        for t in inputs:
            if bits and i in bits:  # (a kernel without numbers pays no lookup)
                values[i] = bits[i](t)
                i += 1
                continue
            pointer = t.data_ptr()
            if pointer % alignment[i]:
                keep.append(_aligned_copy(t))
                pointer = keep[-1].data_ptr()
            values[i] = pointer
            i += 1
        for t in outputs:
            values[i] = t.data_ptr()
            i += 1
        if scratch_bytes:
            keep.append(torch.empty(scratch_bytes, dtype=torch.uint8, device=device))
            values[num_args] = keep[-1].data_ptr()
        if several_gpus and torch.cuda.current_device() != index:
            with torch.cuda.device(index):
                config.stream = current_stream(index)
                result = launch_kernel(config_pointer, function, params, None)
        else:
            config.stream = current_stream(index)
            result = launch_kernel(config_pointer, function, params, None)
        if result:
            check(result, f"launching kernel {name}")

    return launch


def _aligned_copy(t: torch.Tensor) -> torch.Tensor:
    """The same values at the same strides in fresh (aligned) memory: the kernel indexes with the input's strides,
    so the whole span they reach is copied (overlapping strides included)."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride()) if n > 0)
    return t.as_strided((span,), (1,)).clone().as_strided(t.shape, t.stride())
