"""The on-disk cache of compiled kernels and of the C++ runtime's build, content-addressed: a file's name is a hash of
everything that made it, so a cached file can never be a stale one.

What the cache holds is code this process runs (a compiled library, a Triton kernel's source, the runtime
extension), so every folder of it must be private to this user, as ssh requires of ~/.ssh: owned by the user and
writable by no one else, in a path whose folders only root or the user can change (or that are sticky, as /tmp,
where no one else can rename what is ours). Folders are created 0700; one of ours that others may read (the 0755
of earlier builds) is made 0700; one owned by another user, or writable by others, is refused with an
UnsafeCacheError, never used.
"""
from __future__ import annotations

import hashlib
import os
import stat

from jit2triton.errors import UnsafeCacheError

FIX = "set JIT2TRITON_CACHE to a folder only you can write (it is created 0700)"


def cache_root() -> str:
    root = os.environ.get("JIT2TRITON_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "jit2triton")
    return os.path.realpath(root)


def cache_dir(kind: str) -> str:
    """The cache folder for `kind` ("cpp", "ext/<build>"), each folder from the root down created private to this
    user (0700) and checked to be so: other users must not plant files in it."""
    root = cache_root()
    os.makedirs(os.path.dirname(root), exist_ok=True)
    _check_parents(root)
    path = root
    _private_folder(path)
    for part in kind.split("/"):
        path = os.path.join(path, part)
        _private_folder(path)
    return path


def _private_folder(path: str) -> None:
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeCacheError(f"the cache folder {path!r} is not a folder (a link or a file was put there); "
                               f"remove it, or {FIX}")
    if info.st_uid != os.geteuid():
        raise UnsafeCacheError(f"the cache folder {path!r} belongs to user {info.st_uid}, not to you "
                               f"({os.geteuid()}): code in it could be anyone's. Remove it, or {FIX}")
    if info.st_mode & 0o022:
        raise UnsafeCacheError(f"the cache folder {path!r} is writable by other users (mode "
                               f"{stat.S_IMODE(info.st_mode):04o}), so code in it could have been planted: remove "
                               f"it (or `chmod 700` it if you trust what it holds), or {FIX}")
    if info.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours and readable by others (0755 of earlier builds): private from now on


def _check_parents(root: str) -> None:
    """Every folder above the root belongs to root or to this user, and no one else may rename what it holds."""
    parent = os.path.dirname(root)
    while True:
        info = os.stat(parent)
        sticky = info.st_mode & stat.S_ISVTX
        if info.st_uid not in (0, os.geteuid()) or (info.st_mode & 0o022 and not sticky):
            raise UnsafeCacheError(f"the cache {root!r} lies in {parent!r}, which other users can change (owner "
                                   f"{info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}): they could put their "
                                   f"own cache in its place; {FIX}")
        if parent == os.path.dirname(parent):
            return
        parent = os.path.dirname(parent)


def write_once(path: str, data: bytes) -> str:
    """`data` at `path`: written through a temporary file and a rename, so a concurrent writer or reader never sees
    half a file. A file already there is used only if it holds exactly `data` (a name is no proof of content: a
    damaged file is replaced, never loaded)."""
    if os.path.exists(path):
        with open(path, "rb") as f:
            if hashlib.sha256(f.read()).digest() == hashlib.sha256(data).digest():
                return path
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)
    return path
