"""Hand-edited packages (checksums recomputed, as anyone who edits one can) are refused at load by the runtime
with a CorruptPackageError, never read out of bounds: the findings of an adversarial pass over the readers."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import jit2triton

from package_tools import rewrite_package


def _first_kernel_step(manifest: dict) -> dict:
    return next(s for s in manifest["plan"]["steps"] if s["kind"] == "kernel")


def _set_slot(value):
    def edit(manifest):
        _first_kernel_step(manifest)["args"][0] = ["s", value]
    return edit


def _weights(change):
    def edit(manifest):
        entry = next(iter(manifest["weights"].values()))
        change(entry)
    return edit


EDITS = {
    "weight_shape_larger_than_its_bytes": (_weights(lambda e: e.update(shape=[e["shape"][0] * 1000, *e["shape"][1:]])),
                                           "shape does not match its bytes"),
    "weight_bytes_past_the_blob": (_weights(lambda e: e.update(offset=1 << 40)), "lies outside weights.bin"),
    "memory_order_not_a_permutation": (_weights(lambda e: e.update(memory_order=[0] * len(e["shape"]))),
                                       "not a permutation"),
    "slot_past_the_end": (_set_slot(1_000_000), "a slot outside"),
    "negative_slot": (_set_slot(-5), "a slot outside"),
    "kernel_step_with_40_arguments": (lambda m: _first_kernel_step(m).update(args=[["s", 0]] * 40),
                                      "passes another number of buffers"),
    "node_index_past_the_table": (lambda m: _first_kernel_step(m).update(node=10 ** 6), "not in the node table"),
    # a slot the call never sets: Python's runtime ran on None where the C++ one refused (issue 45)
    "input_dropped_from_the_signature": (lambda m: m["signature"]["inputs"].pop(),
                                         "2 input slots where its signature and module state give 1"),
    "plan_input_past_the_signature": (lambda m: m["plan"]["inputs"].append(0),
                                      "3 input slots where its signature and module state give 2"),
}


@pytest.mark.parametrize("case", sorted(EDITS))
def test_a_hand_edited_manifest_is_refused(case, small_package, tmp_path, cpp_runtime) -> None:
    edit, message = EDITS[case]
    edited = tmp_path / "edited.j2t"
    rewrite_package(small_package[0], edited, edit_manifest=edit)
    with pytest.raises(jit2triton.CorruptPackageError, match=message):
        module = jit2triton.load(edited)
        module(torch.randn(2, 4), torch.randn(2, 3))


def test_a_deeply_nested_checksum_table_is_refused_not_a_stack_overflow(small_package, tmp_path, cpp_runtime) -> None:
    edited = tmp_path / "nested.j2t"
    rewrite_package(small_package[0], edited, recompute_checksums=False,
                    edit_member=lambda members: ("checksums.json", b"[" * 200_000 + b"]" * 200_000))
    with pytest.raises(jit2triton.CorruptPackageError, match="checksums.json is damaged"):
        jit2triton.load(edited)


def test_a_loaded_module_owns_its_weights(tmp_path, cpp_runtime) -> None:
    """Overwriting or truncating the file under a loaded module changes nothing for it (as with torch.jit.load)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(64, 64)
    model = torch.jit.trace(linear.eval(), torch.randn(2, 64))
    path, other = tmp_path / "model.j2t", tmp_path / "other.j2t"
    jit2triton.convert(model, (torch.randn(2, 64),)).save(path)
    negated = torch.nn.Linear(64, 64)
    with torch.no_grad():
        negated.weight.copy_(-linear.weight)
        negated.bias.copy_(-linear.bias)
    jit2triton.convert(torch.jit.trace(negated.eval(), torch.randn(2, 64)), (torch.randn(2, 64),)).save(other)
    module = jit2triton.load(path)
    x = torch.randn(2, 64)
    expected = model(x)
    with open(path, "r+b") as f:  # in place, as `cp other.j2t model.j2t` writes
        f.write(other.read_bytes())
    torch.testing.assert_close(module(x), expected)
    with open(path, "r+b") as f:
        f.truncate(100)
    torch.testing.assert_close(module(x), expected)


@pytest.mark.parametrize("op", ["aten::save", "aten::manual_seed"])
def test_a_plan_cannot_reach_outside_the_model(op, small_package, tmp_path, cpp_runtime) -> None:
    """An injected step that would write files (or reseed the process) is refused at load, before any call."""
    node = {"op": op, "category": "fallback", "source": ""}

    def inject(manifest):
        manifest["nodes"].append(node)
        args = [["s", 0], ["c", str(tmp_path / "leak.pt")]] if op == "aten::save" else [["c", 0]]
        manifest["plan"]["steps"].insert(0, {"kind": "call", "op": op, "args": args, "outs": [],
                                             "node": len(manifest["nodes"]) - 1, "kwnames": []})

    edited = tmp_path / "edited.j2t"
    rewrite_package(small_package[0], edited, edit_manifest=inject)
    with pytest.raises(jit2triton.CorruptPackageError, match=f"plan calls {op}"):
        jit2triton.load(edited)(torch.randn(2, 4), torch.randn(2, 3))
    assert not (tmp_path / "leak.pt").exists()


@pytest.mark.parametrize("signed", [False, True])
def test_mutated_packages_are_refused_cleanly_never_a_crash_or_a_raw_exception(signed, small_package, tmp_path,
                                                                              cpp_runtime):
    """tests/mutate_packages.py in a subprocess (a crash must not take pytest down): zip metadata bytes, random
    bytes and manifest edits with recomputed checksums; each package is refused with a jit2triton error, or loads
    and runs; signed, with the key trusted, one that loads holds exactly the signed members. Longer runs:
    `python tests/mutate_packages.py --package P --count 5000`."""
    package, extra = str(small_package[0]), []
    if signed:
        from jit2triton.deploy.signing import generate_keys
        private, public = generate_keys(tmp_path / "keys")
        package = str(tmp_path / "signed.j2t")
        jit2triton.load(small_package[0]).save(package, signing_key=private)
        extra = ["--trusted-key", public]
    script = os.path.join(os.path.dirname(__file__), "mutate_packages.py")
    result = subprocess.run([sys.executable, script, "--package", package, "--count", "300" if signed else "500",
                             *extra], capture_output=True, text=True, timeout=900)
    lines = result.stdout.splitlines()
    failures = [line for line in lines if line.startswith("FAIL")]
    last = [line for line in lines if line.startswith("seed ")][-1:]
    assert result.returncode == 0, (result.returncode, failures[:5], "last mutation tried:", last,
                                    result.stderr[-1500:])


@pytest.mark.parametrize("op", ["load_library::__call__.__call__", "import_module::__call__.__call__",
                                "aten::__call__", "ops::load_library"])
def test_a_plan_calls_only_registered_ops(op, small_package, tmp_path, monkeypatch, cpp_runtime) -> None:
    """A call step's op is resolved through torch's operator registry (and the runtime's own host ops), never
    through other attributes of torch.ops: `torch.ops.load_library(path)` would run a library's constructor,
    `torch.ops.import_module(name)` a module's code."""
    from planted import planted_library
    mark = tmp_path / "planted-ran"
    monkeypatch.setenv("J2T_PLANTED_MARK", str(mark))
    (tmp_path / "planted.so").write_bytes(planted_library(tmp_path))
    (tmp_path / "planted_module.py").write_text(f"open({str(mark)!r}, 'a').write('ran')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    target = str(tmp_path / "planted.so") if "library" in op else "planted_module"

    def inject(manifest):
        manifest["nodes"].append({"op": op, "category": "fallback", "source": ""})
        manifest["plan"]["steps"].insert(0, {"kind": "call", "op": op, "args": [["c", target]], "outs": [],
                                             "node": len(manifest["nodes"]) - 1, "kwnames": []})

    edited = tmp_path / "edited.j2t"
    rewrite_package(small_package[0], edited, edit_manifest=inject)
    # (an op outside torch's namespaces is named as a library's the process has not loaded)
    with pytest.raises(jit2triton.PackageError,
                       match="does not exist in this torch" if op.startswith("aten::") else "is not registered in this "
                       f"process: it belongs to the library {op.partition('::')[0]}"):
        jit2triton.load(edited)(torch.randn(2, 4), torch.randn(2, 3))
    assert not mark.exists()
