"""Compile rendered Triton kernels at convert time.

On a GPU, Triton compiles each kernel for this GPU (a few launch configurations are timed when the kernel is big
enough for the choice to matter) and we keep the cubin and what a launch needs: the function name, grid, warps,
shared memory, target architecture. The runtime then launches it through the CUDA driver, with no Triton compiler.
On the CPU there is nothing to compile: the package holds the sources, which the runtime runs under Triton's
interpreter.

Triton decides at import whether its own library functions (tl.sum, tl.sigmoid, ...) are interpreted or compiled,
from TRITON_INTERPRET, so one process does one or the other; both paths check which one this process is in and
say what to do when it is the wrong one.
"""
from __future__ import annotations

import hashlib
import importlib.util
import json
import math
import os
import re
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from types import ModuleType
from typing import Any, Callable, Optional

import torch

from jit2triton.errors import ConversionError
from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.kernel_ir import Kernel
from jit2triton.transpiler.symbolic import size_json
from jit2triton.transpiler.timing import range_points

from .cache import cache_dir, write_once
from .dependent_launch import enabled, waiting_source
from .jobs import job_slot, job_slots
from .triton import TritonKernel

TUNE_MIN_ELEMENTS = 1 << 18  # below this much work every configuration is launch-bound: take the default
# No FMA across what were separate ops: ATen rounds after every op, and a fused x * 3 - mean(x * 3) over one
# element left 4e-7 where ATen gives exactly 0 (as -ffp-contract=off for the C++ kernels)
FP_FUSION = False
_modules: dict[str, ModuleType] = {}  # one import per kernel source and process


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def interpreter_active() -> bool:
    """Whether this process imported Triton in interpreter mode (TRITON_INTERPRET set before `import triton`)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(tl.standard.sigmoid, InterpretedFunction)


INTERPRETER_HINT = ("set TRITON_INTERPRET=1 in the environment before Python starts (or before anything imports "
                    "triton), e.g. `TRITON_INTERPRET=1 python ...`")
COMPILER_HINT = ("TRITON_INTERPRET is set, so Triton runs kernels in its interpreter and cannot compile them for the "
                 "GPU; unset it (start Python without TRITON_INTERPRET)")


def check_triton_target(device: torch.device) -> None:
    """A ConversionError, before any work, where this process cannot build Triton kernels for `device`: no Triton,
    the CPU without Triton's interpreter, or CUDA with it."""
    if not triton_available():
        raise ConversionError("the triton backend needs Triton (pip install 'triton>=3.6'), or convert with "
                              "backend='cpp' on the CPU")
    if device.type != "cuda" and not interpreter_active():
        raise ConversionError(f"the triton backend on the CPU runs kernels under Triton's interpreter: "
                              f"{INTERPRETER_HINT}; or convert with backend='cpp'")
    if device.type == "cuda" and interpreter_active():
        raise ConversionError(f"converting for CUDA compiles Triton kernels, but {COMPILER_HINT}")


def load_module(source: str) -> ModuleType:
    """Import a kernel module from its source; Triton reads a kernel's source from its file, so it gets one, named
    by the source's hash (never stale, shared by every package holding the same kernel)."""
    key = hashlib.sha256(source.encode()).hexdigest()[:32]
    module = _modules.get(key)
    if module is not None:
        return module
    path = write_once(os.path.join(cache_dir("triton"), f"kernel_{key}.py"), source.encode())
    name = f"jit2triton_kernel_{key}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _modules[key] = module
    return module


def kernel_function(source: str, name: str):
    return getattr(load_module(source), name)


def build_triton(rendered: list[TritonKernel], kernels: list[Kernel], device: torch.device,
                 progress: Optional[Callable[[str], None]] = None) -> tuple[dict[str, bytes], dict[str, Any]]:
    """-> (package files, the manifest's "triton" section): a source per kernel (`rendered` from `kernels`), and on
    CUDA a cubin per kernel. `progress` hears "compiling Triton kernels i/n" after each kernel compiled (the slow
    part of a GPU conversion)."""
    check_triton_target(device)
    import triton
    files = {f"kernels/{r.name}.py": r.source.encode() for r in rendered}
    section: dict[str, Any] = {"triton": triton.__version__, "kernels": {}}
    if device.type != "cuda":
        for r in rendered:
            section["kernels"][r.name] = launch_entry(r, interpreter_config(r))
        return files, section
    # A kernel identical to an earlier one but for its name, comments and buffer numbers (a model's repeated
    # layers) shares its binary: compiled and tuned once
    first: dict[str, int] = {}
    same_as = [first.setdefault(kernel_identity(r), i) for i, r in enumerate(rendered)]
    unique = sorted(set(same_as))
    for i in unique:  # imported here, one at a time: the compile threads only compile
        load_module(rendered[i].source)
    with torch.cuda.device(device):
        arch = torch.cuda.get_device_capability(device)
        tuned = {}
        for done, (i, choice) in enumerate(_compile_all([(rendered[i], kernels[i]) for i in unique], device, arch),
                                           1):
            tuned[unique[i]] = choice
            if progress is not None:
                progress(f"compiling Triton kernels {done}/{len(unique)}"
                         + (f" ({len(kernels)} with repeats)" if len(unique) < len(kernels) else ""))
        for i, (r, same) in enumerate(zip(rendered, same_as)):
            config, compiled = tuned[same]
            if same == i:
                files[f"binaries/{r.name}.cubin"] = compiled.asm["cubin"]
                section["kernels"][r.name] = launch_entry(r, config, compiled)
            else:  # launched as its twin (source, binary, function); its own source stays in the package to read
                section["kernels"][r.name] = dict(section["kernels"][rendered[same].name], same_as=rendered[same].name)
        target = compiled.metadata.target
        section["target"] = {"backend": target.backend, "arch": target.arch, "warp_size": target.warp_size}
    return files, section


_NUMBERED = re.compile(r"(?<![A-Za-z0-9])(buf|r)(\d+)")  # buffers and reduction variables: numbered model-wide


def kernel_identity(r: TritonKernel) -> str:
    """A hash of what a kernel computes and how it launches: its source without comments, with its own name and
    buffer and reduction-variable numbers replaced by placeholders (renumbered in order of appearance)."""
    code = "\n".join(line for line in r.source.splitlines() if not line.lstrip().startswith("#"))
    code = re.sub(rf"\b{re.escape(r.name)}\b", "KERNEL", code)
    numbers: dict[str, str] = {}
    code = _NUMBERED.sub(lambda m: m.group(1) + "_" + numbers.setdefault(m.group(0), str(len(numbers))), code)
    described = json.dumps([code, r.arg_types, r.configs, list(r.size_args), str(r.items)] +
                           ([list(r.unaligned)] if r.unaligned else []) +
                           ([["zeroed", *r.zeroed]] if r.zeroed else []), sort_keys=True)
    return hashlib.sha256(described.encode()).hexdigest()


def _compile_all(jobs: list[tuple[TritonKernel, Kernel]], device: torch.device, arch: tuple[int, int]):
    """Yield (job index, (config, compiled)) as kernels are ready. Every candidate configuration of every kernel
    is compiled first, in threads (Triton's compiler releases the GIL: about 1.9x on 2 cores), as many at once as
    the machine's compile slots allow; then the kernels
    with several candidates are timed one after another (timings must not overlap). A choice made before, for the
    same kernel, GPU and Triton, is read from the tuning cache, so converting a model again compiles little and
    times nothing."""
    import triton
    plans = []
    for r, kernel in jobs:
        key = hashlib.sha256(f"{kernel_identity(r)} {arch} {triton.__version__} "
                             f"{sorted(_example_sizes(r).items())} {sorted(r.dims.items())}".encode()).hexdigest()
        known = _tuning_cache_read(key, r.configs)
        plans.append((key, [known] if known is not None else tuning_candidates(r, kernel)))

    def build(index: int) -> list:
        with torch.cuda.device(device), job_slot():
            return [compile_config(jobs[index][0], c, device) for c in plans[index][1]]

    # As many threads as this process may use cores; each compiles only while it holds a machine-wide slot
    # (emitters/jobs.py), so conversions side by side share the cores instead of each taking them all
    with ThreadPoolExecutor(max_workers=job_slots()) as pool:
        futures = {pool.submit(build, i): i for i in range(len(jobs))}
        compiled: dict[int, list] = {}
        for future in as_completed(futures):
            i = futures[future]
            compiled[i] = future.result()
            if len(plans[i][1]) == 1:
                yield i, (plans[i][1][0], compiled[i][0])
    for i, (key, candidates) in enumerate(plans):
        if len(candidates) > 1:
            best = time_candidates(jobs[i][0], jobs[i][1], candidates, device)
            _tuning_cache_write(key, candidates[best])
            yield i, (candidates[best], compiled[i][best])


def _tuning_cache_read(key: str, configs: list[dict]) -> Optional[dict]:
    path = os.path.join(cache_dir("tuning"), f"{key}.json")
    try:
        with open(path) as f:
            config = json.load(f)
    except (OSError, ValueError):
        return None
    return config if config in configs else None  # only ever one of the kernel's own candidates


def _tuning_cache_write(key: str, config: dict) -> None:
    try:
        write_once(os.path.join(cache_dir("tuning"), f"{key}.json"), json.dumps(config, sort_keys=True).encode())
    except OSError:  # a read-only cache costs only the timing next time
        pass


def interpreter_config(r: TritonKernel) -> dict:
    """Under the interpreter each program and each loop step is a round of Python: take the widest chunks, then
    the most rows per program."""
    def steps(c: dict) -> tuple:
        constants = c["constants"]
        return constants.get("RBLOCK", constants.get("YBLOCK", 0)), constants["XBLOCK"]
    return max(r.configs, key=steps)


def launch_entry(r: TritonKernel, config: dict, compiled=None) -> dict[str, Any]:
    """What a launch needs. A kernel over dynamic dims takes their sizes ("size_args") after its buffers; when its
    grid depends on them it has "grid_items" (the grid covers ceil(items / XBLOCK) programs, items a polynomial in
    the size_args), and its "grid" is the example's, for people."""
    example = _example_sizes(r)
    entry = {"function": r.name, "source": f"kernels/{r.name}.py", "arg_types": r.arg_types,
             "constants": config["constants"], "num_warps": config["num_warps"],
             "grid": [r.grid(config, example), 1, 1]}
    if r.size_args:
        entry["size_args"] = list(r.size_args)
    if r.unaligned:
        entry["unaligned"] = list(r.unaligned)
    if r.zeroed:
        entry["zeroed"] = list(r.zeroed)
    if not isinstance(r.items, int):
        entry["grid_items"] = size_json(r.items)
    if compiled is not None:
        meta = compiled.metadata
        entry.update(binary=f"binaries/{r.name}.cubin", function=meta.name, num_warps=meta.num_warps,
                     num_ctas=meta.num_ctas, shared=meta.shared, arch=meta.target.arch,
                     pdl=enabled(meta.target.arch),  # (compile_config compiled the wait in where this holds)
                     global_scratch_size=getattr(meta, "global_scratch_size", 0),
                     global_scratch_align=getattr(meta, "global_scratch_align", 1))
    return entry


def compile_config(r: TritonKernel, config: dict, device: torch.device):
    """Triton's compiled kernel for one configuration; on Hopper and later it waits first for the kernel before it
    (emitters/dependent_launch.py). Every pointer is specialized as 16-byte aligned (fresh
    allocations are), but the inputs in `r.unaligned`, given a dummy that starts one element in; the runtime
    copies any other input that is not aligned before launching. Size arguments are not specialized (the kernel
    says so), so any value compiles the one binary."""
    arch = torch.cuda.get_device_capability(device) if device.type == "cuda" else (0, 0)
    source = waiting_source(r.source, r.name) if enabled(arch[0] * 10 + arch[1]) else r.source
    fn = kernel_function(source, r.name)
    dummies = [(2.0 if t == "fp64" else 2) if t in SIZE_TYPES else
               torch.empty(17, dtype=_torch_dtype(t), device=device)[int(i in r.unaligned):]
               for i, t in enumerate(r.arg_types)]
    try:
        return fn.warmup(*dummies, grid=(1,), num_warps=config["num_warps"], enable_fp_fusion=FP_FUSION,
                         **config["constants"])
    except Exception as err:  # a compiler failure here is a renderer bug: show the kernel that caused it
        raise ConversionError(f"Triton could not compile generated kernel {r.name} ({type(err).__name__}: {err}); "
                              f"please report it with this source:\n{r.source}") from err


def tuning_candidates(r: TritonKernel, kernel: Kernel) -> list[dict]:
    """The default configuration, or every candidate on kernels big enough (at some point of the dynamic range) for
    the choice to matter."""
    work = max(sum(math.prod(K.at(n, point) for n in b.shape) for b in kernel.inputs + kernel.outputs)
               for point in range_points(kernel.dims))
    return r.configs if work >= TUNE_MIN_ELEMENTS and len(r.configs) > 1 else r.configs[:1]


def time_candidates(r: TritonKernel, kernel: Kernel, candidates: list[dict], device: torch.device) -> int:
    """The index of the best candidate: at the example's sizes, or over dynamic dims the one never far behind the
    fastest at the example and the ranges' ends (a block shaped for 1024 rows can be slow at 16)."""
    from triton.testing import do_bench
    fn = kernel_function(r.source, r.name)
    at_points = []
    for point in range_points(kernel.dims):
        buffers = _buffers_at(kernel, device, point)
        if buffers is None:  # too large to time here
            continue
        args = buffers + [point[name] for name in r.size_args]
        # the median launch, not the mean: a host that stalls (conversions side by side) or another process's
        # kernels on the GPU lengthen some launches, and a mean takes them in
        at_points.append({i: do_bench(lambda c=c: fn[(r.grid(c, point),)](
            *args, num_warps=c["num_warps"], enable_fp_fusion=FP_FUSION, **c["constants"]), warmup=5, rep=25,
            return_mode="median") for i, c in enumerate(candidates)})
    if not at_points:
        return 0
    worst = {i: max(times[i] / min(times.values()) for times in at_points) for i in range(len(candidates))}
    return min(worst, key=lambda i: (worst[i], at_points[0][i]))


def _example_sizes(r: TritonKernel) -> dict[str, int]:
    """The example's size of each dynamic dim the kernel takes (its "grid" for people, and the tuning cache's key
    with the dims' ranges)."""
    return {name: r.dims[name][2] for name in r.size_args}


MAX_TUNING_BYTES = 2 ** 30  # a point of a dynamic range whose buffers are larger is not timed


def _buffers_at(kernel: Kernel, device: torch.device, point: dict[str, int]) -> Optional[list[torch.Tensor]]:
    """Random inputs and empty outputs at `point`'s sizes; None where they would take more than MAX_TUNING_BYTES."""
    layouts = []
    for b in kernel.inputs:
        shape, strides = [K.at(n, point) for n in b.shape], [K.at(n, point) for n in b.strides]
        layouts.append((b, shape, strides, 1 + sum((n - 1) * s for n, s in zip(shape, strides) if n > 0)))
    outputs = [(b, [K.at(n, point) for n in b.shape]) for b in kernel.outputs]
    total = sum(extent * getattr(torch, b.dtype).itemsize for b, _, _, extent in layouts) + \
        sum(math.prod(shape) * getattr(torch, b.dtype).itemsize for b, shape in outputs)
    if total > MAX_TUNING_BYTES:
        return None
    buffers = []
    for b, shape, strides, extent in layouts:
        dtype = getattr(torch, b.dtype)
        storage = torch.randn(extent, device=device).to(dtype) if dtype.is_floating_point else \
            torch.zeros(extent, dtype=dtype, device=device)
        buffers.append(storage.as_strided(shape, strides or ()))
    return buffers + [torch.empty(shape, dtype=getattr(torch, b.dtype), device=device) for b, shape in outputs]


SIZE_TYPES = ("i32", "i64", "fp64")  # a dynamic dim's size, or a host number passed by value (emitters/triton.py)
_POINTER_DTYPES = {"*fp32": torch.float32, "*fp64": torch.float64, "*fp16": torch.float16, "*bf16": torch.bfloat16,
                   "*i64": torch.int64, "*i32": torch.int32, "*i16": torch.int16, "*i8": torch.int8,
                   "*u8": torch.uint8, "*i1": torch.bool}


def _torch_dtype(pointer_type: str) -> torch.dtype:
    return _POINTER_DTYPES[pointer_type]


def buildable_device() -> torch.device:
    """The device this process can build Triton kernels for: the CPU under the interpreter, else the GPU."""
    if triton_available() and not interpreter_active() and torch.cuda.is_available():
        return torch.device("cuda")
    return torch.device("cpu")
