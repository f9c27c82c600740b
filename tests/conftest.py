import hashlib
import json
import zipfile

import pytest
import torch


def rewrite_package(src, dst, edit_manifest=None, edit_member=None):
    """Copy a package, changing its manifest or a member, and re-sign it so only the intended change shows."""
    with zipfile.ZipFile(src) as zf:
        members = {n: zf.read(n) for n in zf.namelist()}
    if edit_manifest:
        manifest = json.loads(members["manifest.json"])
        edit_manifest(manifest)
        members["manifest.json"] = json.dumps(manifest).encode()
    if edit_member:
        name, data = edit_member(members)
        members[name] = data
    checksums = {n: hashlib.sha256(d).hexdigest() for n, d in members.items() if n != "checksums.json"}
    members["checksums.json"] = json.dumps(checksums).encode()
    with zipfile.ZipFile(dst, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)


@pytest.fixture
def small_package(tmp_path):
    """A traced two-input model, converted and saved; returns (path, torchscript model)."""
    import jit2triton

    class Small(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(4, 3)

        def forward(self, x, y):
            return torch.relu(self.linear(x)) + y

    torch.manual_seed(0)
    example = (torch.randn(2, 4), torch.randn(2, 3))
    traced = torch.jit.trace(Small().eval(), example)
    path = tmp_path / "small.j2t"
    jit2triton.convert(traced, example_inputs=example).save(path)
    return path, traced
