"""The kernel cache holds code this process runs, so only its user may write it (issue 34, items 2 and 3): folders
are created 0700; one owned by another user, or writable by others, is refused with an UnsafeCacheError; the C++
runtime's extension is imported only from bytes that hash to what its build recorded; and loading a package never
opens a library from the cache at all (it opens the checked bytes themselves)."""
from __future__ import annotations

import hashlib
import os
import stat

import pytest
import torch

import jit2triton
from jit2triton.deploy import cpp_runtime
from jit2triton.deploy.signing import generate_keys
from jit2triton.emitters.cache import cache_dir

from planted import planted_library
from package_tools import read_members

ROOT_USER = os.geteuid() == 0
STRANGER = 12345  # a uid no test process runs as


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("JIT2TRITON_CACHE", str(root))
    return root


def test_cache_folders_are_created_private(cache) -> None:
    folder = cache_dir("ext/build")
    assert folder == os.path.realpath(cache / "ext" / "build")
    for path in (cache, cache / "ext", cache / "ext" / "build"):
        assert _mode(path) == 0o700


def test_a_cache_of_ours_that_others_may_read_is_made_private(cache) -> None:
    """Earlier builds created the root 0755: it is ours, so it is tightened, not refused."""
    cache.mkdir(mode=0o755)
    os.chmod(cache, 0o755)
    cache_dir("cpp")
    assert _mode(cache) == 0o700


@pytest.mark.parametrize("mode", [0o1777, 0o777, 0o770])
@pytest.mark.parametrize("where", ["root", "kind"])
def test_a_cache_folder_others_can_write_is_refused(where, mode, cache) -> None:
    folder = cache if where == "root" else cache / "cpp"
    folder.mkdir(parents=True)
    os.chmod(folder, mode)
    with pytest.raises(jit2triton.UnsafeCacheError, match="writable by other users"):
        cache_dir("cpp")
    assert _mode(folder) == mode  # refused as it is: not silently taken over


@pytest.mark.skipif(not ROOT_USER, reason="making a folder owned by another user needs root")
@pytest.mark.parametrize("where", ["root", "kind"])
def test_a_cache_folder_owned_by_another_user_is_refused(where, cache) -> None:
    folder = cache if where == "root" else cache / "cpp"
    folder.mkdir(parents=True, mode=0o700)
    os.chown(folder, STRANGER, STRANGER)
    with pytest.raises(jit2triton.UnsafeCacheError, match=f"belongs to user {STRANGER}"):
        cache_dir("cpp")


def test_a_cache_inside_a_folder_others_can_change_is_refused(tmp_path, monkeypatch) -> None:
    """Whoever can rename entries of a folder above the cache can put a cache of their own in its place; a sticky
    folder (as /tmp) lets no one rename what is ours."""
    shared = tmp_path / "shared"
    shared.mkdir()
    monkeypatch.setenv("JIT2TRITON_CACHE", str(shared / "cache"))
    os.chmod(shared, 0o777)
    with pytest.raises(jit2triton.UnsafeCacheError, match="other users can change"):
        cache_dir("cpp")
    os.chmod(shared, 0o1777)
    assert _mode(cache_dir("cpp")) == 0o700


def test_a_link_planted_as_a_cache_folder_is_refused(cache, tmp_path) -> None:
    cache.mkdir(mode=0o700)
    (tmp_path / "elsewhere").mkdir()
    os.symlink(tmp_path / "elsewhere", cache / "cpp")
    with pytest.raises(jit2triton.UnsafeCacheError, match="not a folder"):
        cache_dir("cpp")


def test_a_library_planted_in_a_shared_cache_never_runs(small_package, cache, tmp_path, monkeypatch, request) -> None:
    """The attack of item 3: another user's world-writable sticky `cpp` folder holding `lib-<sha>.so` of the
    package's library. Loading never opens a library from the cache: the signed package runs its own."""
    request.getfixturevalue("cpp_runtime")  # (the fixture: the module of that name is imported here)
    private, public = generate_keys(tmp_path / "keys")
    signed = tmp_path / "signed.j2t"
    jit2triton.load(small_package[0]).save(signed, signing_key=private)
    library = read_members(signed)["binaries/kernels.so"]
    shared = cache / "cpp"
    shared.mkdir(parents=True)
    planted = shared / f"lib-{hashlib.sha256(library).hexdigest()}.so"
    planted_bytes = planted_library(tmp_path)
    planted.write_bytes(planted_bytes)
    os.chmod(shared, 0o1777)
    if ROOT_USER:
        os.chown(shared, STRANGER, STRANGER)
        os.chown(planted, STRANGER, STRANGER)
    mark = tmp_path / "planted-ran"
    monkeypatch.setenv("J2T_PLANTED_MARK", str(mark))
    module = jit2triton.load(signed, trusted_keys=[public])
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    torch.testing.assert_close(module(x, y), small_package[1](x, y))
    assert not mark.exists()
    assert os.listdir(shared) == [planted.name] and planted.read_bytes() == planted_bytes  # not even written


class _Built(Exception):
    """Raised instead of building the extension: the test only needs to know a build would start."""


@pytest.fixture
def no_build(monkeypatch):
    def refuse(*args):
        raise _Built()
    monkeypatch.setattr(cpp_runtime, "_compile", refuse)


def _extension_folder(cache):
    name = cpp_runtime.build_name(cpp_runtime.with_cuda())
    return cache / "ext" / name, name


@pytest.mark.parametrize("record", ["done marker", "hash of another library"])
def test_an_extension_planted_in_the_cache_is_never_imported(record, cache, tmp_path, monkeypatch, no_build):
    """The attack of item 2: a library at the runtime extension's cache path, with the marker an earlier build
    left (`.done`), or with a recorded hash that is not its own. It is never imported: its folder is emptied and
    the runtime is built again."""
    folder, name = _extension_folder(cache)
    folder.mkdir(parents=True)
    (folder / f"{name}.so").write_bytes(planted_library(tmp_path))
    if record == "done marker":
        (folder / f"{name}.so.done").write_bytes(b"")
    else:
        (folder / f"{name}.so{cpp_runtime.HASH_SUFFIX}").write_text(hashlib.sha256(b"the real build").hexdigest())
    mark = tmp_path / "planted-ran"
    monkeypatch.setenv("J2T_PLANTED_MARK", str(mark))
    with pytest.raises(_Built):
        cpp_runtime._build()
    assert not mark.exists()
    assert os.listdir(folder) == []


@pytest.mark.parametrize("owner", ["others may write it", "another user"])
def test_an_extension_in_a_folder_others_control_is_refused(owner, cache, tmp_path, monkeypatch, no_build) -> None:
    """With its hash recorded beside it, as a build would: only the folder's owner and mode can tell."""
    if owner == "another user" and not ROOT_USER:
        pytest.skip("making a folder owned by another user needs root")
    folder, name = _extension_folder(cache)
    folder.mkdir(parents=True)
    library = planted_library(tmp_path)
    (folder / f"{name}.so").write_bytes(library)
    (folder / f"{name}.so{cpp_runtime.HASH_SUFFIX}").write_text(hashlib.sha256(library).hexdigest())
    if owner == "another user":
        os.chown(folder, STRANGER, STRANGER)
    else:
        os.chmod(folder, 0o777)
    mark = tmp_path / "planted-ran"
    monkeypatch.setenv("J2T_PLANTED_MARK", str(mark))
    with pytest.raises(jit2triton.UnsafeCacheError):
        cpp_runtime._build()
    assert not mark.exists()
