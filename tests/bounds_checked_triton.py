"""The Triton interpreter with every load and store bounds-checked: each lane its mask lets through must address
memory inside one of the launch's tensor arguments. On the CPU the interpreter reads past a buffer's end without
complaint (the numbers are wrong, and verification may quietly take the kernel out); on a GPU the same read can be
an illegal memory access. `checked_loads()` turns such a read into an AssertionError naming the address.

    with checked_loads():
        converted = jit2triton.convert(model, example, backend="triton")   # under TRITON_INTERPRET=1
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import numpy as np


class _Checked:
    """Stands in for Triton's C++ interpreter module: load and store check their active addresses first."""

    def __init__(self, real, spans: list[tuple[int, int]]) -> None:
        self._real, self._spans = real, spans

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def load(self, ptrs, mask, other, dtype):
        self._check(ptrs, mask, np.dtype(dtype).itemsize, "load")
        return self._real.load(ptrs, mask, other, dtype)

    def store(self, ptrs, value, mask):
        self._check(ptrs, mask, value.dtype.itemsize, "store")
        return self._real.store(ptrs, value, mask)

    def _check(self, ptrs, mask, size: int, what: str) -> None:
        active = np.broadcast_to(ptrs, np.broadcast_shapes(np.shape(ptrs), np.shape(mask)))[
            np.broadcast_to(mask, np.broadcast_shapes(np.shape(ptrs), np.shape(mask)))].astype(np.uint64)
        inside = np.zeros(active.shape, dtype=bool)
        for start, end in self._spans:
            inside |= (active >= start) & (active + size <= end)
        if not inside.all():
            outside = int(active[~inside][0])
            raise AssertionError(f"a {what} of {size} bytes at {outside:#x} is outside every tensor argument "
                                 f"({', '.join(f'{s:#x}+{e - s}' for s, e in self._spans)})")


@contextlib.contextmanager
def checked_loads() -> Iterator[None]:
    from triton.runtime import interpreter

    spans: list[tuple[int, int]] = []
    init = interpreter.GridExecutor._init_args_hst

    def init_recording(self, args_dev, kwargs):
        args_hst, kwargs_hst = init(self, args_dev, kwargs)
        spans.clear()
        for arg in [*args_hst, *kwargs_hst.values()]:
            if hasattr(arg, "untyped_storage"):
                storage = arg.untyped_storage()
                spans.append((storage.data_ptr(), storage.data_ptr() + storage.nbytes()))
        return args_hst, kwargs_hst

    real = interpreter._interpreter
    interpreter.GridExecutor._init_args_hst = init_recording
    interpreter._interpreter = _Checked(real, spans)
    try:
        yield
    finally:
        interpreter.GridExecutor._init_args_hst = init
        interpreter._interpreter = real
