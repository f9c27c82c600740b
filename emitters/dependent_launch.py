"""Programmatic dependent launch (PDL, Hopper and later): each Triton kernel waits first for the kernel before it.

A launch-bound plan (BERT at 9 tokens: ~100 kernels of 1-8 us in one CUDA graph) loses time between kernels: each
is launched only once the one before has finished. Launched with PDL, a kernel is scheduled while the one before
still runs, and its first instruction, `griddepcontrol.wait` (Triton's `gdc_wait`), holds it until that kernel has
finished and its writes are visible: the launch hides behind the earlier kernel's tail (benchmarks/pdl_probe.py, an
H200: 1.17 -> 0.93 us a kernel in a graph of 100 small dependent kernels). Nothing of a kernel runs before its wait,
so no kernel reads or writes memory while the one before it runs, whatever that one is (ours, cuBLAS's, a copy).
The kernels never let the next one launch early (`gdc_launch_dependents`): that measured 0.72 us a kernel but gave
illegal memory accesses at 256 programs and more under Triton 3.6.

The wait is compiled into the cubin only (the package keeps the source as rendered: a rebuild for a GPU before
Hopper, whose PTX has no `griddepcontrol`, compiles it as it is), and the kernel's launch entry says `pdl`, which
the C++ runtime (deploy/cpp/src/cuda_kernels.cpp) launches with cuLaunchKernelEx's programmatic stream
serialization. Without the attribute the wait returns at once. JIT2TRITON_PDL=0 at conversion turns it off.

Measured on BERT base 1x9 (an H200, packages with and without, one process, in turns: benchmarks/bert_ab.py): fp32
437.2 against 439.9 us a call, fp16 348.7 against 354.4 (docs/benchmarks.md).
"""
from __future__ import annotations

import os
import re

PDL_ARCH = 90  # sm_90 (Hopper) and later have griddepcontrol

_IMPORT = "from triton.language.extra.cuda import gdc_wait\n"
_WAIT = "gdc_wait()  # programmatic dependent launch: nothing before this reads or writes memory\n"


def enabled(arch: int) -> bool:
    """Whether kernels built for sm_`arch` wait for the kernel before them and are launched with PDL."""
    return arch >= PDL_ARCH and os.environ.get("JIT2TRITON_PDL", "1") != "0"


def waiting_source(source: str, name: str) -> str:
    """`source` with `gdc_wait()` the first statement of kernel `name`'s body, and its import."""
    signature = re.search(rf"^def {re.escape(name)}\(.*?\):[^\n]*\n", source, re.S | re.M)
    if signature is None:
        raise ValueError(f"kernel {name} has no `def {name}(...):` in its source")
    body = source[signature.end():]
    indent = re.match(r"[ \t]*", body.lstrip("\n")).group(0)
    if not indent:
        raise ValueError(f"kernel {name}'s body is not indented")
    waiting = source[:signature.end()] + indent + _WAIT + body
    imports = re.search(r"^import triton\.language as tl\n", waiting, re.M)
    at = imports.end() if imports else 0
    return waiting[:at] + _IMPORT + waiting[at:]
