"""Reading and writing package members the way an attacker or a broken disk would: for the tests that check every
bad package is refused. Packages are torch archives (deploy/package.py); these helpers use torch's own reader and
writer, so only the intended change shows."""
from __future__ import annotations

import hashlib
import json
import zipfile

import torch

TORCH_RECORDS = {"version", ".data/version", "byteorder", ".data/serialization_id"}


def read_members(path) -> dict[str, bytes]:
    reader = torch._C.PyTorchFileReader(str(path))
    return {name: bytes(reader.get_record(name)) for name in reader.get_all_records() if name not in TORCH_RECORDS}


def write_members(path, members: dict[str, bytes]) -> None:
    with open(path, "wb") as f:
        writer = torch._C.PyTorchFileWriter(f)
        for name, data in members.items():
            writer.write_record(name, data, len(data))
        writer.write_end_of_file()
        del writer


def torchscript_file(folder):
    """A TorchScript archive, as a user who mixes up the two files would pass it to `load`."""
    path = folder / "model.pt"
    torch.jit.save(torch.jit.trace(torch.nn.Linear(2, 2), torch.randn(1, 2)), str(path))
    return path


def format_1_package(src, folder):
    """The same members in the hand-written zip of package format 1 (members at the zip's root)."""
    path = folder / "format1.j2t"
    with zipfile.ZipFile(path, "w") as zf:
        for name, data in read_members(src).items():
            zf.writestr(name, data)
    return path


def manifest_of(path) -> dict:
    return json.loads(read_members(path)["manifest.json"])


def rewrite_package(src, dst, edit_manifest=None, edit_member=None, recompute_checksums: bool = True) -> None:
    """Copy a package, changing its manifest or a member, and recompute its checksums (as anyone who edits a
    package can) so only the intended change shows."""
    members = read_members(src)
    if edit_manifest:
        manifest = json.loads(members["manifest.json"])
        edit_manifest(manifest)
        members["manifest.json"] = json.dumps(manifest).encode()
    if edit_member:
        name, data = edit_member(members)
        members[name] = data
    if recompute_checksums:
        checksums = {n: hashlib.sha256(d).hexdigest() for n, d in members.items() if n != "checksums.json"}
        members["checksums.json"] = json.dumps(checksums).encode()
    write_members(dst, members)
