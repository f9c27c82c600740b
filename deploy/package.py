"""Package format v1: one `.j2t` file, a zip holding data only.

    manifest.json     format version, producer versions, device, signature, plan, weights index, kernels,
                      provenance and the conversion report
    weights.bin       every weight's raw bytes, 64-byte aligned, in its memory order
                      (channels-last stays channels-last); dtype/shape/offset/memory_order in the manifest
    kernels/          generated kernel sources (Triton, C++)
    binaries/         compiled kernels (cubins, shared libraries)
    checksums.json    sha256 of every other member

Every member is stored uncompressed and starts 64-byte aligned in the file, so both runtimes (Python and C++) read
them in place from the mapped file, with no inflate. Nothing in a package is pickled and loading never executes
code from it. Saving writes a temporary file beside the target and renames it, so a crash never leaves a
half-written package under the final name.
"""
from __future__ import annotations

import hashlib
import io
import json
import mmap
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from typing import Any

import torch

from jit2triton.errors import CorruptPackageError, PackageError, PackageVersionError

from .literals import decode, encode, map_plan_literals

FORMAT = "jit2triton-package"
FORMAT_VERSION = 1
ALIGN = 64


@dataclass
class PackageContents:
    manifest: dict[str, Any]  # with the plan's literals as Python values (decoded)
    weights: dict[str, torch.Tensor]  # on the CPU
    files: dict[str, bytes] = field(default_factory=dict)  # kernels/..., binaries/...


def save_package(contents: PackageContents, path: str) -> None:
    path = os.fspath(path)
    weights_index, blob = _pack_weights(contents.weights)
    manifest = dict(contents.manifest, format=FORMAT, format_version=FORMAT_VERSION, weights=weights_index)
    manifest["plan"] = map_plan_literals(manifest["plan"], encode)
    members = {"manifest.json": json.dumps(manifest, indent=1).encode(), "weights.bin": blob, **contents.files}
    checksums = {name: hashlib.sha256(data).hexdigest() for name, data in members.items()}
    members["checksums.json"] = json.dumps(checksums, indent=1).encode()
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".j2t-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as raw, zipfile.ZipFile(raw, "w") as zf:
            for name, data in members.items():
                zf.writestr(_aligned_entry(name, raw.tell()), data, compress_type=zipfile.ZIP_STORED)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


_ALIGN_EXTRA_ID = 0xA11C  # a private zip extra field that only pads


def _aligned_entry(name: str, header_offset: int) -> zipfile.ZipInfo:
    """A member's zip entry, padded so its data starts 64-byte aligned in the file: weights are used in place from
    the mapped file (by this runtime and the C++ one), and aligned tensors keep vector loads fast."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.external_attr = 0o644 << 16
    start = header_offset + 30 + len(name.encode())
    pad = -(start + 4) % ALIGN
    info.extra = _ALIGN_EXTRA_ID.to_bytes(2, "little") + pad.to_bytes(2, "little") + b"\0" * pad
    return info


def read_package(path: str) -> PackageContents:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise PackageError(f"package not found: {path!r}; check the path or convert the model first")
    try:
        with zipfile.ZipFile(path) as zf:
            members = {name: _stored_view(path, zf.getinfo(name)) or zf.read(name) for name in zf.namelist()}
    except (zipfile.BadZipFile, EOFError, OSError, zipfile.LargeZipFile, ValueError) as err:
        raise CorruptPackageError(
            f"{path!r} is not a readable jit2triton package ({err}); it may be truncated or corrupted. "
            "Copy it again or re-run `jit2triton convert`") from None
    _verify(path, members)
    manifest = json.loads(members.pop("manifest.json"))
    if manifest.get("format") != FORMAT:
        raise CorruptPackageError(f"{path!r} is a zip file but not a jit2triton package")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise PackageVersionError(
            f"{path!r} uses package format {version}, newer than this jit2triton reads ({FORMAT_VERSION}); "
            "upgrade jit2triton (pip install -U jit2triton)")
    weights = _unpack_weights(manifest.pop("weights"), members.pop("weights.bin"))
    manifest["plan"] = map_plan_literals(manifest["plan"], decode)
    members.pop("checksums.json")
    return PackageContents(manifest, weights, members)


def _stored_view(path: str, info: zipfile.ZipInfo):
    """The weights member, uncompressed in the zip, as a view of the file mapped into memory (copy-on-write):
    no copy, no second pass for the zip's CRC (its sha256 is checked), and pages are read as tensors use them."""
    if info.filename != "weights.bin" or info.compress_type != zipfile.ZIP_STORED or info.file_size == 0:
        return None
    with open(path, "rb") as f:
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
    header = mapped[info.header_offset:info.header_offset + 30]
    if header[:4] != b"PK\x03\x04":
        raise zipfile.BadZipFile("bad local header for weights.bin")
    start = info.header_offset + 30 + int.from_bytes(header[26:28], "little") + int.from_bytes(header[28:30], "little")
    if start + info.file_size > len(mapped):
        raise zipfile.BadZipFile("weights.bin runs past the end of the file")
    return memoryview(mapped)[start:start + info.file_size]


def _verify(path: str, members: dict[str, bytes]) -> None:
    for required in ("manifest.json", "weights.bin", "checksums.json"):
        if required not in members:
            raise CorruptPackageError(
                f"{path!r} has no {required}: it is not a complete jit2triton package; re-run `jit2triton convert`")
    try:
        checksums = json.loads(members["checksums.json"])
    except ValueError:
        raise CorruptPackageError(f"{path!r}: checksums.json is damaged; re-run `jit2triton convert`") from None
    for name in members:
        if name == "checksums.json":
            continue
        expected = checksums.get(name)
        if expected is None or hashlib.sha256(members[name]).hexdigest() != expected:
            raise CorruptPackageError(
                f"{path!r}: member {name!r} fails its checksum, so the package was modified or corrupted; "
                "copy it again or re-run `jit2triton convert`")
    missing = set(checksums) - set(members)
    if missing:
        raise CorruptPackageError(f"{path!r} lacks members {sorted(missing)}; re-run `jit2triton convert`")


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
    buffer = blob if isinstance(blob, memoryview) and not blob.readonly else bytearray(blob)
    weights = {}
    for name, entry in index.items():
        dtype = getattr(torch, entry["dtype"])
        shape, offset, nbytes = entry["shape"], entry["offset"], entry["nbytes"]
        if offset + nbytes > len(buffer):
            raise CorruptPackageError(f"weight {name!r} lies outside weights.bin; the package is corrupted")
        if nbytes == 0:
            weights[name] = torch.empty(shape, dtype=dtype)
            continue
        flat = torch.frombuffer(buffer, dtype=torch.uint8, count=nbytes, offset=offset)
        order = entry.get("memory_order", list(range(len(shape))))
        inverse = [order.index(d) for d in range(len(shape))]
        weights[name] = flat.view(dtype).reshape([shape[d] for d in order]).permute(inverse)
    return weights
