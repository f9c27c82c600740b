"""The two runtimes agree on every package: a mutated one (tests/mutate_packages.py: damaged bytes, hand-edited
manifests, structural edits) is refused by both, or runs in both with the same outputs. Where one ran what the other
refused, a user's package worked or failed by the runtime `load()` picked (2.9-5.5% of mutations did, issue 45):
a `weights` index that was not an object, an integer past int64 that Python's JSON reader took, an input's name
that was not a string, an input dropped from the signature (the plan's slot for it read as None), a freed slot
passed to aten::Bool.Tensor (Python's `bool(None)` ran), a damaged type on a step building a dict (typed by it in
C++, ignored in Python), a dict keyed by None (C++ cannot hash it), a kernel's null `sizes` (absent in C++, refused in
Python), a weight's offset `true` (1 in C++), a kernel input's strides
shorter than its shape (Python compared the dims both had), a weights index null or absent (none in C++, refused in Python; now
refused by both), plan steps that were an object (Python's literal decoding read them as no steps), a step without arguments, a signature
input's shape that was a number (C++ loaded it and refused every call), a loop whose condition was NaN (Python ran it as
true), a dynamic dim's source with a fourth item (C++ read the first three), a tensor input whose shape was null (C++
read no sizes and loaded it, expecting a 0-d tensor)."""
from __future__ import annotations

import itertools
from typing import List, Tuple

import pytest
import torch

import jit2triton
from jit2triton.errors import Jit2TritonError
from jit2triton.inputs import random_inputs

import fuzz_packages
from mutate_packages import mutate
from package_tools import read_members, rewrite_package

SWEEP = 48  # mutations from seed 0 per package ...
# ... and the seeds where the runtimes once disagreed
FOUND = (18, 82, 126, 135, 138, 142, 198, 235, 242, 274, 646, 819, 1299, 1870, 3630, 4735, 6658, 7214, 8806, 13682,
         15682, 17726, 23406, 30962, 48106)


def _outcome(path: str, runtime: str):
    """("refused", error type) where a jit2triton error refused it, at load or call; ("ran", outputs)."""
    try:
        module = jit2triton.load(path, runtime=runtime)
        signature = module.manifest["signature"]
        sizes = {name: d["example"] if type((d or {}).get("example")) is int and 1 <= d["example"] <= 64 else 2
                 for name, d in (signature.get("dims") or {}).items()}
    except Jit2TritonError as err:
        return "refused", type(err).__name__
    try:
        torch.manual_seed(0)
        inputs = [3 if type(x) is int and abs(x) > 64 else x
                  for x in random_inputs(signature["inputs"], module.device, sizes=sizes)]
    except Exception:  # noqa: BLE001 - a damaged input description: the harness cannot call it
        return "uncallable", ""
    try:
        return "ran", module(*inputs)
    except Jit2TritonError as err:
        return "refused", type(err).__name__


def _difference(cpp, python, where: str = "output") -> str:
    """'' where the outputs are the same: tensors bit for bit, containers item by item (a dict by its items in
    order: an edited plan may key one by tensors, and each runtime returns its own key objects, which compare by
    identity), anything else equal and of one type; else where they differ."""
    if isinstance(cpp, torch.Tensor) and isinstance(python, torch.Tensor):
        try:
            torch.testing.assert_close(cpp, python, rtol=0, atol=0, equal_nan=True)  # (garbage weights: NaN alike)
        except AssertionError as err:
            return f"{where}: {str(err)[:120]}"
        return ""
    if type(cpp) is not type(python):
        return f"{where}: {type(cpp).__name__} in C++, {type(python).__name__} in Python"
    if isinstance(python, dict):
        cpp, python = list(cpp.items()), list(python.items())
    if isinstance(python, (list, tuple)):
        if len(cpp) != len(python):
            return f"{where}: {len(cpp)} items in C++, {len(python)} in Python"
        return next((found for i, (c, p) in enumerate(zip(cpp, python))
                     if (found := _difference(c, p, f"{where}[{i}]"))), "")
    same = cpp == python or (cpp != cpp and python != python)  # (NaN: both)
    return "" if same else f"{where}: {cpp!r} in C++, {python!r} in Python"


@pytest.mark.parametrize("name", ["small", "containers", "looped", "damageable"])
def test_the_runtimes_refuse_or_run_every_mutated_package_alike(name, tmp_path) -> None:
    source = getattr(fuzz_packages, f"{name}_package")(tmp_path)
    data, members = open(source, "rb").read(), read_members(source)
    path, disagreements = str(tmp_path / "mutated.j2t"), []
    for seed in [*range(SWEEP), *FOUND]:
        what, damaged = mutate(data, members, seed)
        with open(path, "wb") as f:
            f.write(damaged)
        (python, out_python), (cpp, out_cpp) = _outcome(path, "python"), _outcome(path, "cpp")
        if python != cpp:
            disagreements.append(f"seed {seed} ({what}): python {python} {out_python if python != 'ran' else ''}, "
                                 f"cpp {cpp} {out_cpp if cpp != 'ran' else ''}")
        elif python == "ran" and (difference := _difference(out_cpp, out_python)):
            disagreements.append(f"seed {seed} ({what}): both ran, outputs differ at {difference}")
    assert not disagreements, f"{len(disagreements)} disagreements:\n" + "\n".join(disagreements)


# The type a list- or dict-building step records (the C++ runtime types the container by it): the schema's form
# (TAG_ARITY) and the op's kind, read alike; a well-formed one with other item types runs in both.
TYPE_TAGS = [None, 5, [], [5], ["Tensor"], ["Dict"], ["Dict", ["str"]], ["Dict", 1, 2], ["Dict", ["str"], ["Tensor"], 7],
             ["Tuple", ["str"], ["Tensor"]], ["List", ["Tensor"]], ["Optional", ["Dict", ["str"], ["Tensor"]]],
             ["Dict", ["str", 3], ["Tensor"]], ["Dict", ["Optional"], ["Tensor"]], ["Dict", ["int"], ["Tensor"]],
             ["Dict", ["str"], ["Any"]]]


def test_a_container_steps_type_is_read_alike(tmp_path) -> None:
    source = fuzz_packages.containers_package(tmp_path)
    path, disagreements = str(tmp_path / "edited.j2t"), []
    for tag in TYPE_TAGS:
        for op in ("prim::DictConstruct", "prim::ListConstruct"):
            def edit(manifest, op=op):  # (a list's step gets the same forms for its kind: Dict read as List, one item)
                step = next(s for s in manifest["plan"]["steps"] if s.get("op") == op)
                step["type"] = tag if op == "prim::DictConstruct" or not isinstance(tag, list) or not tag \
                    else ["List" if tag[0] == "Dict" else tag[0], *tag[1:2]]
            rewrite_package(source, path, edit_manifest=edit)
            (python, out_python), (cpp, out_cpp) = _outcome(path, "python"), _outcome(path, "cpp")
            if python != cpp or (python == "ran" and _difference(out_cpp, out_python)):
                disagreements.append(f"{op} typed {tag}: python {python}, cpp {cpp}")
    assert not disagreements, "\n".join(disagreements)


class Counter(torch.nn.Module):
    """Module state: a count the plan writes and a list of tensors it keeps (deploy/state.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0
        self.history: List[torch.Tensor] = [torch.zeros(3)]

    def forward(self, x):
        self.calls += 1
        self.history.append(x.sum(0))
        return x * self.calls + self.history[0]


STATE_EDITS = [("written", 1), ("written", None), ("name", 5), ("compared", "x"), ("compared", None),
               ("weight", 5), ("weight", None), ("weights", [1]), ("weights", None), ("type", []), ("type", None),
               ("type", ["List", ["Tensor"]]), ("type", ["Dict", ["str"]])]


def test_a_module_state_entry_is_read_alike(tmp_path) -> None:
    source = str(tmp_path / "counter.j2t")
    jit2triton.convert(torch.jit.script(Counter()), (torch.randn(2, 3),)).save(source)
    path, disagreements = str(tmp_path / "edited.j2t"), []
    for index, (key, value) in itertools.product((0, 1), STATE_EDITS):
        def edit(manifest):
            manifest["state"][index][key] = value
        rewrite_package(source, path, edit_manifest=edit)
        (python, out_python), (cpp, out_cpp) = _outcome(path, "python"), _outcome(path, "cpp")
        if python != cpp or (python == "ran" and _difference(out_cpp, out_python)):
            disagreements.append(f"state[{index}].{key} = {value!r}: python {python} {out_python if python != 'ran' else ''}, "
                                 f"cpp {cpp} {out_cpp if cpp != 'ran' else ''}")
    assert not disagreements, "\n".join(disagreements)


def test_a_null_optional_field_is_absent_in_both_runtimes(tmp_path) -> None:
    """The schema's optional manifest fields, each null: both runtimes read it as absent (module state and methods
    null were refused in C++ and ran in Python; a null report made summary() raise KeyError), and the package's
    summary and report still answer."""
    from jit2triton.deploy.format import MANIFEST
    source = fuzz_packages.small_package(tmp_path)
    path, wrong = str(tmp_path / "edited.j2t"), []
    optional = [f.name for f in MANIFEST.fields if not f.required and f.name != "weights"]  # (a file holds weights)
    assert {"state", "methods", "report", "cpp"} <= set(optional)
    for name in optional:
        rewrite_package(source, path, edit_manifest=lambda manifest: manifest.update({name: None}))
        outcomes = {runtime: _outcome(path, runtime) for runtime in ("python", "cpp")}
        if outcomes["python"][0] != outcomes["cpp"][0]:
            wrong.append(f"{name}: python {outcomes['python'][0]}, cpp {outcomes['cpp'][0]}")
        for runtime in ("python", "cpp"):
            try:
                module = jit2triton.load(path, runtime=runtime)
            except Jit2TritonError:
                continue
            module.summary(), module.report()
    assert not wrong, "\n".join(wrong)


class Loop(torch.nn.Module):
    def forward(self, xs: List[torch.Tensor], pair: Tuple[torch.Tensor, int]) -> torch.Tensor:
        out = xs[0] * pair[1]
        for x in xs[1:]:
            out = out + x.sin()
        return out + pair[0]


TENSOR = {"type": "Tensor", "dtype": "float32", "shape": [2, 3]}
# (input, key, value): a container input's element and item types, damaged or changed
CONTAINER_EDITS = [
    (0, "element", None), (0, "element", 5), (0, "element", {}), (0, "element", {"type": 5}),
    (0, "element", {**TENSOR, "shape": "x"}), (0, "element", {**TENSOR, "shape": [True]}),
    (0, "element", {**TENSOR, "shape": ["n"]}), (0, "element", {**TENSOR, "dtype": "nope"}), (0, "element", {**TENSOR, "dtype": 5}),
    (0, "element", {**TENSOR, "shape": [3, 2]}), (0, "element", {"type": "int"}), (0, "element", {"type": "List"}),
    (0, "element", {"type": "Tuple", "items": 5}), (0, "element", {"type": "List", "element": TENSOR}),
    (0, "type", "Tuple"), (0, "type", "Dict"),
    (1, "items", None), (1, "items", 5), (1, "items", [5]), (1, "items", []), (1, "items", [TENSOR, {"type": "str"}]),
    (1, "items", [TENSOR, {"type": "int", "element": 5}]), (1, "element", TENSOR), (1, "type", "List"),
]


def _called(path: str, runtime: str, inputs: tuple):
    """("refused", error type) where a jit2triton error refused the package or the call; ("ran", outputs)."""
    try:
        return "ran", jit2triton.load(path, runtime=runtime)(*inputs)
    except Jit2TritonError as err:
        return "refused", type(err).__name__


def test_a_container_inputs_item_types_are_read_alike(tmp_path) -> None:
    """Both runtimes check a container input's items and elements by the signature (deploy/signature.py's
    _container_check, signature.cpp's container_check): a damaged type is refused alike, another one checked alike."""
    source = str(tmp_path / "loop.j2t")
    torch.manual_seed(0)
    example = ([torch.randn(2, 3) for _ in range(3)], (torch.randn(2, 3), 2))
    jit2triton.convert(torch.jit.script(Loop()), example).save(source)
    path, disagreements, outcomes = str(tmp_path / "edited.j2t"), [], set()
    for index, key, value in CONTAINER_EDITS:
        def edit(manifest):
            manifest["signature"]["inputs"][index][key] = value
        rewrite_package(source, path, edit_manifest=edit)
        (python, out_python), (cpp, out_cpp) = (_called(path, runtime, example) for runtime in ("python", "cpp"))
        outcomes.add(out_python if python == "refused" else python)
        if python != cpp or _difference(out_cpp, out_python):
            disagreements.append(f"inputs[{index}].{key} = {value!r}: python {python} {out_python if python != 'ran' else ''}, "
                                 f"cpp {cpp} {out_cpp if cpp != 'ran' else ''}")
    assert not disagreements, "\n".join(disagreements)
    assert outcomes == {"ran", "CorruptPackageError", "PackageVersionError", "InputError"}  # (the edits reach each)
