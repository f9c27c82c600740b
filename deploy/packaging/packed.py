"""Packed constants: what a plan's "packed" list builds once at load (transpiler/packed_params.py writes it).

Each entry is one op over weights, literals and earlier entries: a quantized weight made from its stored integers and
quantizer, then the op that packs it for the quantized engine's kernels (`quantized::linear_prepack`, ...), which the
plan's steps then read as ["p", name]. Only the ops in op_facts.PACKING_OPS may run here. Packing ops name the engine
the package was converted under; they pack for that engine, as the package was verified with it, and a torch without
it is refused with a QuantizedEngineError. The C++ runtime builds the same list the same way (literals.cpp).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Optional

import torch

from jit2triton.errors import CorruptPackageError, QuantizedEngineError

from ..op_facts import PACKING_OPS
from ..policy import QUANTIZED_ENGINES, message
from ..resolve import resolve_op

_ENGINE_SWITCH = threading.Lock()  # torch's quantized engine is process-wide: one load switches it at a time


def build_packed(entries: list[dict], literal: Callable[[list], Any]) -> dict[str, Any]:
    """name -> the constant each entry builds; `literal` resolves a weight or literal reference."""
    built: dict[str, Any] = {}

    def argument(ref: list) -> Any:
        return packed_constant(built, ref[1]) if ref[0] == "p" else literal(ref)

    for entry in entries:
        if entry["op"] not in PACKING_OPS:
            raise CorruptPackageError(message("packing_op", op=repr(entry["op"])))
        pack = resolve_op(entry["op"])
        args = [argument(r) for r in entry["args"]]
        with quantized_engine(entry.get("engine")):
            built[entry["name"]] = pack(*args)
    return built


def packed_constant(built: dict[str, Any], name: str) -> Any:
    if name not in built:
        raise CorruptPackageError(message("packed_missing", name=repr(name)))
    return built[name]


def check_engine(engine: str) -> None:
    supported = torch.backends.quantized.supported_engines
    if engine not in supported:
        have = ", ".join(sorted(e for e in QUANTIZED_ENGINES if e in supported)) or "none"
        raise QuantizedEngineError(message("missing_engine", engine=engine, supported=have))


@contextlib.contextmanager
def quantized_engine(engine: Optional[str]) -> Iterator[None]:
    """Run the block with torch's quantized engine set to `engine` (as it is, when None or already so)."""
    if engine is None or torch.backends.quantized.engine == engine:
        yield
        return
    check_engine(engine)
    with _ENGINE_SWITCH:
        previous = torch.backends.quantized.engine
        torch.backends.quantized.engine = engine
        try:
            yield
        finally:
            torch.backends.quantized.engine = previous
