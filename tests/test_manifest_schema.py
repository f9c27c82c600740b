"""One manifest schema (deploy/format.py) for the runtime and the Python reader: the C++ checks are generated from
it, a field missing or of the wrong type is refused with a message naming it, and a package using a format feature
the runtime does not know (the schema's `requires` field) is refused, where it would otherwise run wrongly."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import jit2triton

from package_tools import manifest_of, rewrite_package

ROOT = Path(__file__).resolve().parent.parent


def test_the_cpp_schema_header_is_generated_from_the_python_schema() -> None:
    from jit2triton.deploy import format
    header = (ROOT / "deploy" / "cpp" / "src" / "manifest_schema.h").read_text()
    assert header == format.cpp_header(), (
        "deploy/cpp/src/manifest_schema.h is stale: run "
        "`python -m jit2triton.deploy.format > deploy/cpp/src/manifest_schema.h`")


def test_every_field_a_package_holds_is_in_the_schema(small_package) -> None:
    """A field written without a schema entry would be read by none of the runtime's checks."""
    from jit2triton.deploy.format import KERNEL, MANIFEST, PLAN, SIGNATURE
    manifest = manifest_of(small_package[0])
    saved_by_the_file_writer = {"format", "format_version", "weights"}  # checked where the file is read
    assert set(manifest) - saved_by_the_file_writer <= {f.name for f in MANIFEST.fields}
    assert {"inputs", "outputs"} <= {f.name for f in SIGNATURE.fields}
    assert set(manifest["plan"]) <= {f.name for f in PLAN.fields}
    assert {"name", "num_buffers"} <= {f.name for f in KERNEL.fields}


def _load_and_call(path):
    module = jit2triton.load(path)
    return module(torch.randn(2, 4), torch.randn(2, 3))


def _edited(small_package, tmp_path, edit):
    edited = tmp_path / "edited.j2t"
    rewrite_package(small_package[0], edited, edit_manifest=edit)
    return edited


DAMAGE = {  # name: (edit, error, what the message says)
    "no_plan": (lambda m: m.pop("plan"), jit2triton.CorruptPackageError,
                r"the package's manifest is damaged \(no 'plan'\)"),
    "a_device_that_is_a_list": (lambda m: m.update(device=["cpu"]), jit2triton.CorruptPackageError,
                                r"manifest is damaged \('device' is not a string\)"),
    "a_torch_version_that_is_a_number": (lambda m: m["producer"].update(torch=2.13), jit2triton.CorruptPackageError,
                                         r"manifest is damaged \('torch' is not a string\)"),
    "a_kernel_without_its_buffer_count": (lambda m: m["kernels"][0].pop("num_buffers"),
                                          jit2triton.CorruptPackageError, r"manifest is damaged \(no 'num_buffers'\)"),
    "signature_inputs_that_are_an_object": (lambda m: m["signature"].update(inputs={}),
                                            jit2triton.CorruptPackageError,
                                            r"signature is damaged \('inputs' is not a list\)"),
    "a_step_kind_from_the_future": (lambda m: m["plan"]["steps"][0].update(kind="teleport"),
                                    jit2triton.PackageVersionError, "a step of kind 'teleport'.*upgrade jit2triton"),
    "a_step_type_that_is_no_type": (lambda m: m["plan"]["steps"][0].update(type=["Dict", ["str"]]),
                                    jit2triton.CorruptPackageError, r"'type' is not a TorchScript type"),
    "a_freed_slot_past_the_end": (lambda m: m["plan"]["steps"][0].update(free=[10 ** 6]),
                                  jit2triton.CorruptPackageError, "a slot outside 0.."),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_field_missing_or_mistyped_is_refused_by_the_runtime(case, small_package, tmp_path, cpp_runtime) -> None:
    edit, error, message = DAMAGE[case]
    with pytest.raises(error, match=message):
        _load_and_call(_edited(small_package, tmp_path, edit))


def test_a_package_needing_a_feature_this_runtime_lacks_is_refused(small_package, tmp_path, cpp_runtime) -> None:
    """The `requires` field: a package from a newer jit2triton whose plan relies on a field this one would ignore
    (and so run wrongly) says so, and the runtime refuses it, naming the feature, before running anything."""
    edited = _edited(small_package, tmp_path, lambda m: m["requires"].append("int4_weights"))
    with pytest.raises(jit2triton.PackageVersionError, match="uses 'int4_weights', a feature of the package format "
                                                             "this jit2triton does not know.*upgrade jit2triton"):
        _load_and_call(edited)
    mistyped = _edited(small_package, tmp_path, lambda m: m.update(requires="state"))
    with pytest.raises(jit2triton.CorruptPackageError, match=r"'requires' is not a list of strings"):
        _load_and_call(mistyped)


class Counts(torch.nn.Module):  # module state: a runtime ignoring it would return the first call's answer forever
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


def test_the_features_a_package_uses_are_recorded_and_run(small_package, tmp_path, cpp_runtime) -> None:
    assert manifest_of(small_package[0])["requires"] == []
    path = tmp_path / "counts.j2t"
    jit2triton.convert(torch.jit.script(Counts().eval()), (torch.randn(3),)).save(path)
    assert manifest_of(path)["requires"] == ["state"]
    scripted, module = torch.jit.script(Counts().eval()), jit2triton.load(path)
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(module(x), scripted(x))


def test_a_package_written_before_the_field_still_loads(small_package, tmp_path, cpp_runtime) -> None:
    """Packages of format 2 written before `requires` existed need nothing beyond it: absent means none."""
    path, traced = small_package
    older = _edited(small_package, tmp_path, lambda m: m.pop("requires"))
    module = jit2triton.load(older)
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    torch.testing.assert_close(module(x, y), traced(x, y))


# What reads packages: the C++ runtime's sources, and the Python modules beside it (the package reader, the kernel
# callbacks of the runtime's extension)
RUNTIME_PY = ("signature", "package", "literals", "host_ops", "triton_kernels", "cpp_kernels")
NOT_KEYS = {"_CapturedRegion": "a class named in a string annotation",
            "synchroniz": "a piece of CUDA's error message, matched in it"}


def _keys_read() -> dict[str, set[str]]:
    """Every string key the runtime or Python reads: C++ `at("k")` / `find("k")`, Python `x["k"]` / `.get("k")`."""
    import re
    patterns = [(ROOT / "deploy" / "cpp" / "src", "*.cpp", r'(?:\.|->)(?:at|find)\("([A-Za-z_]\w*)"\)'),
                (ROOT / "deploy", "*.py", r'\[\s*"([A-Za-z_]\w*)"\s*\]|\.get\("([A-Za-z_]\w*)"')]
    found: dict[str, set[str]] = {}
    for folder, glob, pattern in patterns:
        for path in sorted(folder.glob(glob)):
            if path.suffix == ".py" and path.stem not in RUNTIME_PY:
                continue
            for match in re.finditer(pattern, path.read_text()):
                key = next(g for g in match.groups() if g)
                found.setdefault(key, set()).add(path.name)
    return found


def test_every_key_a_runtime_reads_is_declared_in_the_schema() -> None:
    """The package is described in one place (deploy/format.py): a key the runtime reads, in C++ or in the Python
    beside it, is a field of a checked section or declared in its DECLARED table, so a key added to the readers
    alone fails here."""
    from jit2triton.deploy import format
    declared = {f.name for section in vars(format).values() if isinstance(section, format.Section)
                for f in section.fields}
    declared |= {key for part in format.DECLARED.values() for key in part}
    read = _keys_read()
    assert len(read) > 60 and "grid" in read and "num_slots" in read  # (the scan reads both languages)
    undeclared = {key: sorted(files) for key, files in read.items() if key not in declared and key not in NOT_KEYS}
    assert not undeclared, f"keys read but declared in no section or DECLARED of deploy/format.py: {undeclared}"
