"""What the C++ runtime's extension asks of Python for a package's Triton kernels (deploy/cpp/python/bindings.cpp):
on the CPU, a launcher per kernel running its source under Triton's interpreter (`interpreted_for_cpp`); on a GPU
of another architecture than the cubins', the cubins rebuilt from the bundled sources, once, with a warning
(`rebuilt_for_cpp`). The C++ runtime loads and launches cubins itself (cuda_kernels.cpp): no Triton compiler, no
C compiler, and Triton itself need not be installed for that.
"""
from __future__ import annotations

import json
import math
import struct
import warnings
from typing import Callable, Optional

import torch

from jit2triton.errors import CorruptPackageError, PackageDeviceError

from .policy import RECONVERT, message

# a host number a kernel takes by value (emitters/triton.py SCALAR_TYPES) -> its bits in a 64-bit argument slot
NUMBER_KINDS = ("i64", "fp64")  # a host number a kernel takes by value (emitters/triton.py SCALAR_TYPES)


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
    launchers = _load_interpreted(files, _entries(files, section, kernels))
    made = {}
    for meta in kernels:
        entry = section["kernels"][meta["name"]]
        numbers = [(i, entry["arg_types"][i]) for i in meta.get("by_value") or ()]
        if not all(kind in NUMBER_KINDS for _, kind in numbers):
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


# --- CUDA: cubins rebuilt for this GPU -----------------------------------------------------------------------


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


def positional_size_function(n, names: list) -> Callable[[list], int]:
    """A size as a function of dim values given as a list in `names`' order (how kernels receive them): an int, or
    where it depends on the dynamic dims, a polynomial `[[coef, [dim, ...]], ...]` (transpiler/symbolic.py's SymSize
    as data)."""
    if isinstance(n, int):
        return lambda values: n
    where = {name: i for i, name in enumerate(names)}
    terms = [(int(coef), tuple(where[d] for d in dims)) for coef, dims in n]
    return lambda values: sum(coef * math.prod(values[i] for i in at) for coef, at in terms)
