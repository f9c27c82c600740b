"""The on-disk cache of compiled kernels and materialised libraries, content-addressed: a file's name is a hash of
everything that made it, so a cached file can never be a stale one."""
from __future__ import annotations

import os


def cache_dir(kind: str) -> str:
    root = os.environ.get("JIT2TRITON_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jit2triton")
    path = os.path.join(root, kind)
    os.makedirs(path, exist_ok=True)
    return path


def write_once(path: str, data: bytes) -> str:
    """Write `data` at `path` unless it is there: through a temporary file and a rename, so a concurrent writer or
    reader never sees half a file."""
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    return path
