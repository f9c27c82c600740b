"""Open checked bytes as a shared library: exactly those bytes, never a file that could change between the check and
the dlopen (a package's kernel library, the C++ runtime's extension).

The bytes go into an anonymous file (memfd_create), sealed against every later write, which dlopen opens through
/proc/self/fd. Its descriptor stays open for the life of the process, as the library does: dlopen knows a library
it opened by its path, so that path must never come to name another file. Where memfd is missing, or may not hold
code (vm.memfd_noexec), the bytes go into a file created in a fresh folder only this user can write (mkdtemp,
0700), opened, then removed.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
from typing import Callable, TypeVar

Opened = TypeVar("Opened")
_SEALS = ("F_SEAL_SEAL", "F_SEAL_SHRINK", "F_SEAL_GROW", "F_SEAL_WRITE")
_lock = threading.Lock()
_kept: list[int] = []  # descriptors of opened libraries: their /proc/self/fd paths keep naming them


def open_verified(data: bytes, open_path: Callable[[str], Opened], name: str = "jit2triton") -> Opened:
    """`open_path(path)` (a dlopen: ctypes.CDLL, an extension import) on a path that holds exactly `data`."""
    with _lock:
        fd = _sealed_memfd(data, name)
        if fd is not None:
            try:
                opened = open_path(f"/proc/self/fd/{fd}")
            except (OSError, ImportError):
                os.close(fd)  # memfd may not hold code here: a private file below
            else:
                _kept.append(fd)
                return opened
    folder = tempfile.mkdtemp(prefix="jit2triton-")  # 0700, a fresh name: no one else can have put anything here
    try:
        path = os.path.join(folder, f"{name}.so")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o700)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return open_path(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _sealed_memfd(data: bytes, name: str):
    """A memfd holding `data`, sealed against any change; None where this system has none."""
    import fcntl
    create = getattr(os, "memfd_create", None)
    if create is None or not all(hasattr(fcntl, seal) for seal in _SEALS) or not os.path.isdir("/proc/self/fd"):
        return None
    try:
        fd = create(name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except OSError:
        return None
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        seals = 0
        for seal in _SEALS:
            seals |= getattr(fcntl, seal)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except OSError:
        os.close(fd)
        return None
    return fd
