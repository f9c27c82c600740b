"""Package format v2: one `.j2t` file in torch's own archive container (what `torch.save` and `torch.jit.save`
write: a zip read by `PyTorchFileReader` in Python and `caffe2::serialize::PyTorchStreamReader` in C++, both
shipped with torch), holding data only.

    manifest.json     format version, producer versions, device, signature, plan, weights index, kernels,
                      provenance and the conversion report
    weights.bin       every weight's raw bytes, 64-byte aligned, in its memory order
                      (channels-last stays channels-last); dtype/shape/offset/memory_order in the manifest
    kernels/          generated kernel sources (Triton, C++)
    binaries/         compiled kernels (cubins, shared libraries)
    runtime/          the C++ runtime's Python extension that verified the package (deploy/cpp_runtime.py)
    checksums.json    sha256 of every other member
    signature.ed25519 optional: an Ed25519 signature over checksums.json (deploy/signing.py)

torch's container stores every record uncompressed and 64-byte aligned, so the runtime and this reader use them in place in the
file's bytes, read once into memory they own (or mapped), with no inflate, through a reader that torch maintains
and fuzzes rather than one of our own.
torch adds its own bookkeeping records (`version`, `byteorder`, `.data/serialization_id`), which are not members.
Nothing in a package is pickled. Saving writes a temporary file beside the target and renames it, so a crash
never leaves a half-written package under the final name: the temporary is synced to disk before the rename,
takes its mode from the umask, and one left by a killed save is removed by the next save to that name.
"""
from __future__ import annotations

import hashlib
import io
import math
import json
import mmap
import os
import stat
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import Any

import torch

from jit2triton.errors import CorruptPackageError, PackageError, PackageVersionError, WriteError

from .format import WEIGHT, check_fields, read_manifest, written_fields
from .literals import decode, encode, map_manifest_plans
from .policy import DTYPES, FORMAT, FORMAT_VERSION, RECONVERT, REQUIRED_MEMBERS, SIGNATURE_MEMBER, message
from .signing import KeyPaths, check_signature, sign, trusted_key_paths
ALIGN = 64
TORCH_RECORDS = frozenset({"version", ".data/version", "byteorder", ".data/serialization_id"})
TORCHSCRIPT_RECORDS = ("constants.pkl", "data.pkl", "code/")  # what a torch.jit.save / torch.save archive holds


@dataclass
class PackageContents:
    manifest: dict[str, Any]  # with the plan's literals as Python values (decoded)
    weights: dict[str, torch.Tensor]  # on the CPU
    files: dict[str, bytes] = field(default_factory=dict)  # kernels/..., binaries/..., runtime/...
    signed: bool = False  # read from a file that carried a signature (checked only where keys were trusted)


def save_package(contents: PackageContents, path: str, signing_key: "str | os.PathLike | None" = None) -> None:
    """Write the package; `signing_key` (a PEM Ed25519 private key's path) adds a signature over its checksums."""
    path = os.fspath(path)
    weights_index, blob = _pack_weights(contents.weights)
    manifest = dict(contents.manifest, **written_fields(contents.manifest), format=FORMAT, format_version=FORMAT_VERSION,
                    weights=weights_index)
    manifest = map_manifest_plans(manifest, encode)
    members = {"manifest.json": json.dumps(manifest, indent=1).encode(), "weights.bin": blob, **contents.files}
    checksums = {name: hashlib.sha256(data).hexdigest() for name, data in members.items()}
    members["checksums.json"] = json.dumps(checksums, indent=1).encode()
    if signing_key is not None:
        members[SIGNATURE_MEMBER] = sign(members["checksums.json"], signing_key)
    target = save_target(path)
    folder, base = os.path.split(target)
    _remove_stale_temporaries(folder, base)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{base}.{os.getpid()}.", suffix=TEMPORARY_SUFFIX, dir=folder)
    except OSError as err:
        raise WriteError(f"cannot write {path}: its folder {folder} takes no new file ({_os_reason(err)})") from None
    try:
        with os.fdopen(fd, "wb") as raw:
            writer = torch._C.PyTorchFileWriter(raw)  # a file object: records go under "archive/", as torch.save's
            for name, data in members.items():
                writer.write_record(name, data, len(data))
            writer.write_end_of_file()
            del writer
            raw.flush()
            os.fsync(raw.fileno())  # the bytes are on disk before the name points at them
        os.chmod(tmp, 0o666 & ~_umask())  # as any file writer would (mkstemp made it 0600)
        save_target(path)  # still a file or nothing: the rename replaces whatever is there
        os.replace(tmp, target)
        _fsync_folder(folder)  # and the rename too
    except BaseException as err:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(err, OSError) and not isinstance(err, WriteError):  # a full disk, a quota
            raise WriteError(f"cannot write {path}: {_os_reason(err)}") from None
        raise


def save_target(path: "str | os.PathLike") -> str:
    """The file a save to `path` replaces: `path`, or the file a symbolic link there names. A link is written through,
    as torch.save and a shell's `>` write, so a `latest.j2t` link stays a link to the new package and nothing is
    written elsewhere than the user pointed at. A WriteError where that exists and is not a regular file (a device
    such as /dev/null, a FIFO, a folder: the rename would replace it with the package) or its folder does not exist."""
    path = os.fspath(path)
    target = os.path.realpath(path)
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as err:
        raise WriteError(f"cannot write {path}: {_os_reason(err)}") from None
    names = f" (which names {target})" if os.path.islink(path) else ""
    if mode is not None and not stat.S_ISREG(mode):
        raise WriteError(f"cannot write {path}{names}: it is {_file_kind(mode)}, not a regular file, and writing would "
                         "replace it; give the path of a file")
    if not os.path.isdir(os.path.dirname(target)):
        raise WriteError(f"cannot write {path}{names}: folder {os.path.dirname(target)} does not exist")
    return target


def check_target(path: "str | os.PathLike") -> None:
    """A WriteError now, before any work, where a save to `path` would fail: save_target's checks, and a file created
    and removed in its folder, as the save creates its temporary there (os.access would pass for root where the
    file system refuses: /proc, a read-only mount)."""
    target = save_target(path)
    folder, base = os.path.split(target)
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{base}.{os.getpid()}.", suffix=TEMPORARY_SUFFIX, dir=folder)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise WriteError(f"cannot write {os.fspath(path)}: its folder {folder} takes no new file ({_os_reason(err)})") \
            from None


def _file_kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "a special file")


def _os_reason(err: OSError) -> str:
    return err.strerror or str(err) or type(err).__name__


TEMPORARY_SUFFIX = ".j2t-partial"  # ".model.j2t.<pid>.<random>.j2t-partial": a save under way, or one killed


def _remove_stale_temporaries(folder: str, base: str) -> None:
    """Temporaries of saves to the same name whose process is gone (killed mid-save) are removed."""
    prefix = f".{base}."
    for name in os.listdir(folder):
        if not (name.startswith(prefix) and name.endswith(TEMPORARY_SUFFIX)):
            continue
        pid = name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            try:
                os.unlink(os.path.join(folder, name))
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _fsync_folder(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_package(path: str, mmap: bool = False, trusted_keys: KeyPaths = None,
                 keys_from_environment: bool = True) -> PackageContents:
    """The package's contents, read through one descriptor into memory this process owns before anything is
    checked: what the checksums and the signature cover is exactly what is parsed and run, whatever writes the file
    meanwhile (an in-place writer, a save renaming another file over the name). CPU weights are views of that
    memory, so a later change to the file (or its truncation) cannot reach a loaded module, as with torch.jit.load;
    `mmap=True` maps the file instead and keeps the weights views of the mapping (no copy, pages read as used; the
    file must then stay as it is), every other member still copied before its check. With trusted keys (given, or
    in JIT2TRITON_TRUSTED_KEYS, unless `keys_from_environment` is false: a caller that joined them already) the
    package must carry a signature by one of them, checked before anything is parsed."""
    path = os.fspath(path)
    members = _records(path, _read_file(path, mmap))
    keys = trusted_key_paths(trusted_keys) if keys_from_environment else list(trusted_keys or ())
    check_signature(path, members, keys)
    return _contents(path, members)


def package_from_members(path: str, members: dict[str, bytes], weights: dict[str, torch.Tensor]) -> PackageContents:
    """The contents of a package the C++ runtime read, checked and unpacked, from its members (all but weights.bin)
    and its weights (sharing its memory, not copied): the same file the runtime runs, never the path read again."""
    manifest = json.loads(members.pop("manifest.json"))
    manifest.pop("weights")
    manifest = map_manifest_plans(manifest, decode)
    members.pop("checksums.json")
    signed = members.pop(SIGNATURE_MEMBER, None) is not None
    return PackageContents(manifest, weights, members, signed)


def _read_file(path: str, mapped: bool):
    """The file's bytes: read into a private buffer, or mapped copy-on-write (`mapped`), from one descriptor."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise PackageError(message("not_found", path=repr(path))) from None
    except OSError as err:
        raise PackageError(f"cannot open {path!r}: {err.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CorruptPackageError(message("unreadable", path=repr(path), reason="not a regular file"))
        size = info.st_size
        if mapped:
            return mmap.mmap(fd, 0, access=mmap.ACCESS_COPY) if size else bytearray()
        # uninitialised memory (a bytearray would first write zeros over it all: half the time of a load)
        data = torch.empty(size, dtype=torch.uint8).numpy()
        done = 0
        while done < size:
            n = os.readv(fd, [data[done:]])
            if n == 0:  # shorter than it was a moment ago: what was read is the file
                break
            done += n
        return data[:done]
    except OSError as err:
        raise CorruptPackageError(message("unreadable", path=repr(path), reason=err.strerror or str(err))) from None
    finally:
        os.close(fd)


class _MemoryFile:
    """A read-only file over bytes in memory, for torch's archive reader and zipfile: the package is parsed from
    the bytes read once, never from the path again."""

    def __init__(self, data) -> None:
        self.view, self.position = memoryview(data), 0

    def seek(self, offset: int, whence: int = 0) -> int:
        base = (0, self.position, len(self.view))[whence]
        self.position = max(0, base + offset)
        return self.position

    def tell(self) -> int:
        return self.position

    def read(self, size: int = -1) -> bytes:
        end = len(self.view) if size is None or size < 0 else self.position + size
        data = bytes(self.view[self.position:end])
        self.position += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.view[self.position:self.position + len(buffer)]
        buffer[:len(data)] = data
        self.position += len(data)
        return len(data)

    def seekable(self) -> bool:
        return True


def _int64(text: str) -> int:
    """A manifest's integer, refused (as the C++ runtime's JSON reader refuses it) past int64."""
    value = int(text)
    if not -2**63 <= value < 2**63:
        raise ValueError(f"integer out of range: {text[:40]}")
    return value


def _contents(path: str, members: dict[str, memoryview]) -> PackageContents:
    _verify(path, members)
    try:
        manifest = json.loads(bytes(members.pop("manifest.json")), parse_int=_int64)
    except (ValueError, RecursionError):
        raise CorruptPackageError(message("manifest_unreadable", path=repr(path))) from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise CorruptPackageError(message("not_a_package", path=repr(path)))
    version = manifest.get("format_version")
    if type(version) is int and version > FORMAT_VERSION:
        raise PackageVersionError(message("newer_format", path=repr(path), found=version, version=FORMAT_VERSION))
    if type(version) is not int or version != FORMAT_VERSION:
        raise CorruptPackageError(message("unknown_format", path=repr(path), version=FORMAT_VERSION))
    read_manifest(manifest)  # each field present where required, of its type, known (deploy/format.py)
    try:
        index = manifest.pop("weights", None)
        if not isinstance(index, dict):  # (a package file holds one, {} where it has no weights)
            raise CorruptPackageError(message("no_weights_index"))
        weights = _unpack_weights(index, members.pop("weights.bin"))
        manifest = map_manifest_plans(manifest, decode)
    except (KeyError, TypeError, AttributeError, ValueError, IndexError) as err:  # a field missing or mistyped
        raise CorruptPackageError(f"{path!r}: the manifest is damaged "
                                  f"({type(err).__name__}: {err}); {RECONVERT}") from None
    members.pop("checksums.json")
    signed = members.pop(SIGNATURE_MEMBER, None) is not None  # it signs these bytes only: a re-save signs anew
    return PackageContents(manifest, weights, {name: bytes(data) for name, data in members.items()}, signed)


def _records(path: str, data) -> dict[str, memoryview]:
    """Every member of the archive, found by torch's reader in the file's bytes `data`. Each member but the
    weights is copied out of a mapping (an mmap'ed `data`) here, before anything checks it; in a private buffer,
    each is a view of it. Their bytes are checked against checksums.json afterwards."""
    try:
        reader = torch._C.PyTorchFileReader(_MemoryFile(data))
        names = [n for n in reader.get_all_records() if n not in TORCH_RECORDS]
        if "manifest.json" not in names and any(n.startswith(TORCHSCRIPT_RECORDS) for n in names):
            raise PackageError(message("torchscript_file", path=repr(path)))
        size_of = getattr(reader, "get_record_size", None) or _zip_sizes(data)  # torch < 2.12 lacks the binding
        spans = {n: (reader.get_record_offset(n), size_of(n)) for n in names}
        for name, (offset, size) in spans.items():
            if offset + size > len(data):
                raise ValueError(f"member {name!r} runs past the end of the file")
    except (RuntimeError, OSError, ValueError, KeyError, zipfile.BadZipFile) as err:
        if _is_format_1(data):
            raise PackageVersionError(message("format_1", path=repr(path), version=FORMAT_VERSION)) from None
        raise CorruptPackageError(message("unreadable", path=repr(path), reason=_reason(err))) from None
    view = memoryview(data)
    private = not isinstance(data, mmap.mmap)  # a mapping shows what another writer of the file writes
    return {name: view[offset:offset + size] if private or name == "weights.bin"
            else memoryview(bytes(view[offset:offset + size])) for name, (offset, size) in spans.items()}


def _zip_sizes(data):
    """Record sizes from the container's central directory (records are stored, so a size is its data's length)."""
    with zipfile.ZipFile(_MemoryFile(data)) as zf:
        sizes = {info.filename.split("/", 1)[-1]: info.file_size for info in zf.infolist()}
    return sizes.__getitem__


def _reason(err: Exception) -> str:
    """torch's reader error without its boilerplate: 'failed finding central directory'."""
    text = (str(err).strip().splitlines() or [type(err).__name__])[0]
    text = text.split("failed reading zip archive: ")[-1]
    return text.split(". This is an internal")[0][:200]


def _is_format_1(data) -> bool:
    try:
        with zipfile.ZipFile(_MemoryFile(data)) as zf:
            return "manifest.json" in zf.namelist()
    except Exception:  # a probe of a file already found unreadable: any failure means "no" (zipfile raises
        return False  # NotImplementedError for a damaged version field; found by tests/mutate_packages.py)


def _verify(path: str, members: dict[str, memoryview]) -> None:
    for required in REQUIRED_MEMBERS:
        if required not in members:
            raise CorruptPackageError(message("incomplete", path=repr(path), member=required))
    try:
        checksums = json.loads(bytes(members["checksums.json"]))
        if not isinstance(checksums, dict):
            raise ValueError("not a table")
    except (ValueError, RecursionError):
        raise CorruptPackageError(message("checksums_damaged", path=repr(path))) from None
    for name in sorted(members):  # in the C++ runtime's order (its std::map), so both name the same member first
        if name in ("checksums.json", SIGNATURE_MEMBER):  # the signature signs checksums.json (deploy/signing.py)
            continue
        expected = checksums.get(name)
        if expected is None or hashlib.sha256(members[name]).hexdigest() != expected:
            raise CorruptPackageError(message("checksum_fails", path=repr(path), member=repr(name)))
    for name in sorted(set(checksums) - set(members)):
        raise CorruptPackageError(message("member_missing", path=repr(path), member=repr(name)))


def memory_order(tensor: torch.Tensor) -> list[int]:
    """The dims from outermost to innermost in memory (channels-last conv weights are [0, 2, 3, 1]); kept in the
    package so that loaded weights have the layout the kernels were generated for. Identity for a tensor that is
    not a dense permutation of a contiguous one (those are stored contiguous)."""
    order = sorted(range(tensor.dim()), key=lambda d: (-tensor.stride(d), d))
    dense = tensor.permute(order).is_contiguous() if tensor.dim() else True
    return order if dense else list(range(tensor.dim()))


def _pack_weights(weights: dict[str, torch.Tensor]) -> tuple[dict, bytes]:
    index, out, offset = {}, io.BytesIO(), 0
    for name, tensor in weights.items():
        order = memory_order(tensor)
        stored = tensor.detach().to("cpu").permute(order).contiguous()
        data = stored.reshape(-1).view(torch.uint8).numpy().tobytes()
        pad = -offset % ALIGN
        out.write(b"\0" * pad)
        offset += pad
        index[name] = {"dtype": str(tensor.dtype).removeprefix("torch."), "shape": list(tensor.shape),
                       "offset": offset, "nbytes": len(data)}
        if order != sorted(order):
            index[name]["memory_order"] = order
        out.write(data)
        offset += len(data)
    return index, out.getvalue()


def _unpack_weights(index: dict, blob) -> dict[str, torch.Tensor]:
    # writable (a copy-on-write mapping, or a copy), so torch.frombuffer shares it without a warning
    buffer = blob if not blob.readonly else bytearray(blob)
    weights = {}
    for name, entry in index.items():
        check_fields(WEIGHT, entry)
        if entry.get("dtype") not in DTYPES:
            raise CorruptPackageError(message("unknown_dtype", name=repr(name), dtype=repr(entry.get("dtype"))))
        dtype = getattr(torch, entry["dtype"])
        shape, offset, nbytes = entry["shape"], entry["offset"], entry["nbytes"]
        if not all(type(v) is int and v >= 0 for v in [offset, nbytes, *shape]) or offset + nbytes > len(buffer):
            raise CorruptPackageError(message("weight_outside", name=repr(name)))
        if math.prod(shape) * dtype.itemsize != nbytes:  # else a tensor would reach past its bytes
            raise CorruptPackageError(message("weight_shape", name=repr(name)))
        if nbytes == 0:
            weights[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset)
        order = entry.get("memory_order", list(range(len(shape))))
        if sorted(order) != list(range(len(shape))):
            raise CorruptPackageError(message("weight_order", name=repr(name)))
        inverse = [order.index(d) for d in range(len(shape))]
        weights[name] = flat.view(dtype).reshape([shape[d] for d in order]).permute(inverse)
    return weights
