"""The on-disk cache of compiled kernels and materialised libraries, content-addressed: a file's name is a hash of
everything that made it, so a cached file can never be a stale one."""
from __future__ import annotations

import hashlib
import os


def cache_dir(kind: str) -> str:
    """The cache folder for `kind`, created private to this user (0700): other users must not plant files in it."""
    root = os.environ.get("JIT2TRITON_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jit2triton")
    path = os.path.join(root, kind)
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


def write_once(path: str, data: bytes) -> str:
    """`data` at `path`: written through a temporary file and a rename, so a concurrent writer or reader never sees
    half a file. A file already there is used only if it holds exactly `data` (a name is no proof of content: a
    planted or damaged file is replaced, never loaded)."""
    if os.path.exists(path):
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest():
                return path
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path
