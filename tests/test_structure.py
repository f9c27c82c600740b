"""The data flows one way: loaders -> transpiler -> emitters -> deploy. A stage imports only itself, earlier stages
and the leaf modules every stage may use (errors, version); no stage imports the public face (api, cli,
conversion). Within deploy/, folders say when code runs: the runtime (deploy/*.py) imports neither convert-time
packaging (deploy/packaging/) nor serving (deploy/serving/). Checked on the source, lazy imports inside functions
included, so a violation cannot hide."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STAGES = ["loaders", "transpiler", "emitters", "deploy"]


def _imports(path: Path, package: str) -> set[str]:
    """Every jit2triton module a file imports, resolved to absolute names."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{a.name}" for a in node.names)
    return {m for m in found if m.startswith("jit2triton")}


def _violation(module: str, allowed: set[str]) -> str:
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in ("errors", "version"):
        return ""
    if module == "jit2triton":
        return "the package root (the public face)"
    if parts[1] not in STAGES:
        return f"{module} (the public face)"
    if parts[1] not in allowed:
        return f"{module} (a later stage)"
    return ""


def _modules(folder: str, package: str) -> list[tuple[str, Path, str]]:
    """(module, file, the package its relative imports start from) for a folder and its subpackages."""
    found = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        inside = ".".join((package, *path.relative_to(ROOT / folder).parent.parts))
        found.append((inside if path.stem == "__init__" else f"{inside}.{path.stem}", path, inside))
    return found


@pytest.mark.parametrize("stage", STAGES)
def test_a_stage_imports_only_earlier_stages(stage: str) -> None:
    allowed = set(STAGES[:STAGES.index(stage) + 1])
    wrong = [f"{path.relative_to(ROOT / stage)} imports {why}"
             for _, path, package in _modules(stage, f"jit2triton.{stage}")
             for why in (_violation(m, allowed) for m in sorted(_imports(path, package))) if why]
    assert not wrong, f"{stage}: " + "; ".join(wrong)


# deploy/ by when its code runs: the runtime (deploy/*.py, what `jit2triton.load` imports), convert-time packaging
# (deploy/packaging/) and serving (deploy/serving/). Each later time may import the runtime; the runtime imports
# neither, nor the converter's stages.
CONVERT_TIME = ("jit2triton.deploy.packaging", "jit2triton.transpiler", "jit2triton.loaders", "jit2triton.emitters")
# What the runtime still takes from emitters/, each for a reason of load time. Moving these below the runtime is
# the next step (compile_triton and triton import the transpiler's kernel IR); this list may only shrink.
RUNTIME_USES_FROM_EMITTERS = {
    "jit2triton.emitters.cache": "the private cache folder the C++ runtime's extension is built in",
    "jit2triton.emitters.compile_cpp": "a package's C++ kernels rebuilt for this CPU's instruction set",
    "jit2triton.emitters.compile_triton": "Triton's interpreter on the CPU; GPU kernels rebuilt for another GPU",
    "jit2triton.emitters.triton": "the kernel record such a rebuild compiles",
}


def _within(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


def _imports_from(package: str, forbidden: tuple[str, ...],
                  excepted: dict[str, str]) -> tuple[list[str], set[str]]:
    """-> (each import of `forbidden` by a file directly in `package`, the `excepted` modules it imports)."""
    files = [path for _, path, inside in _modules("deploy", "jit2triton.deploy") if inside == package]
    assert len(files) > 4, package  # (the scan finds the folder)
    wrong, used = [], set()
    for path in files:
        for module in sorted(_imports(path, package)):
            exception = next((e for e in excepted if _within(module, (e,))), None)
            if exception:
                used.add(exception)
            elif _within(module, forbidden):
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
    return wrong, used


def test_the_runtime_imports_nothing_convert_time() -> None:
    """A loaded package needs neither the converter nor the server (lazy imports inside functions count), so the
    runtime can be read, tested and started alone."""
    wrong, used = _imports_from("jit2triton.deploy", CONVERT_TIME + ("jit2triton.deploy.serving",),
                                RUNTIME_USES_FROM_EMITTERS)
    assert not wrong, "the runtime imports convert- or serve-time code: " + "; ".join(wrong)
    assert used == set(RUNTIME_USES_FROM_EMITTERS), (
        f"no runtime module imports {sorted(set(RUNTIME_USES_FROM_EMITTERS) - used)} now: take it off the list")


def test_serving_imports_nothing_convert_time() -> None:
    """A server loads packages through the runtime; converting is not its business."""
    wrong, _ = _imports_from("jit2triton.deploy.serving", CONVERT_TIME, {})
    assert not wrong, "serving imports convert-time code: " + "; ".join(wrong)


def test_importing_errors_loads_no_stage_and_no_torch() -> None:
    code = ("import sys, jit2triton.errors; "
            "print(sorted(m for m in sys.modules if m.startswith('jit2triton')), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['jit2triton', 'jit2triton.errors', 'jit2triton.version'] False", out


def test_loading_a_package_needs_no_converter_stage(small_package) -> None:
    path, _ = small_package
    code = (f"import sys, torch, jit2triton; m = jit2triton.load({str(path)!r}); m(torch.randn(2, 4), torch.randn(2, 3)); "
            "print(sorted({m.split('.')[1] for m in sys.modules if m.startswith('jit2triton.')}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    stages = set(eval(out.strip()))
    assert not stages & {"loaders", "transpiler"}, f"loading imported {sorted(stages)}"


def test_a_test_module_imports_no_other_test_module() -> None:
    """Shared helpers live in tests/helpers.py (data in models.py, op_samples, ...): importing a test module would
    run its module-level code and collect its skips, and ties one test file's edits to another's."""
    tests = Path(__file__).resolve().parent
    wrong = []
    for path in sorted(tests.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            wrong += [f"{path.name} imports {name}" for name in names if name.split(".")[0].startswith("test_")]
    assert not wrong, "; ".join(wrong)


def test_the_cpp_policy_header_is_generated_from_the_python_policy() -> None:
    """Both runtimes refuse packages with the same words and run by the same numbers because the C++ side's
    policy.h is generated from deploy/policy.py; a hand edit to either side shows here."""
    from jit2triton.deploy import policy
    header = (ROOT / "deploy" / "cpp" / "src" / "policy.h").read_text()
    assert header == policy.cpp_header(), (
        "deploy/cpp/src/policy.h is stale: run `python -m jit2triton.deploy.policy > deploy/cpp/src/policy.h`")


def test_the_reconvert_advice_is_written_once_for_both_runtimes() -> None:
    """The advice to re-run the conversion is policy.RECONVERT, and policy.h's kReconvert generated from it (the
    test above holds the two equal): a message that types it again drifts when the advice changes (issue 45 found
    it typed 47 times in 17 files, in three wordings)."""
    typed = re.compile(r"re-run (`jit2triton convert`|convert\b|the conversion)")
    definitions = {ROOT / "deploy" / "policy.py", ROOT / "deploy" / "cpp" / "src" / "policy.h"}
    copies = [f"{path.relative_to(ROOT)}:{number}"
              for folder in ("jit2triton", *STAGES) for path in sorted((ROOT / folder).rglob("*"))
              if path.suffix in (".py", ".cpp", ".h") and path not in definitions
              for number, line in enumerate(path.read_text().splitlines(), 1) if typed.search(line)]
    assert not copies, f"use policy.RECONVERT (Python) or policy::kReconvert (C++) at: {', '.join(copies)}"


def test_a_pass_imports_no_other_pass() -> None:
    """The pipeline's order is read in one file (transpiler/pipeline.py's PASSES): a pass that imported another
    would hide a second order (and the transpiler stood ten imports deep). What passes share lives in ir, kernel_ir
    or a module of shapes and forms; a rewrite that tries a candidate graph runs it through the context."""
    from jit2triton.transpiler import pipeline
    folder = ROOT / "transpiler"
    passes = {p.name for p in pipeline.PASSES} & {path.stem for path in folder.glob("*.py")}
    assert len(passes) > 15, passes  # the records name their modules
    wrong = [f"{name} imports {module}" for name in sorted(passes)
             for module in sorted(_imports(folder / f"{name}.py", "jit2triton.transpiler"))
             if module.split(".")[2:3] and module.split(".")[2] in passes - {name}]
    assert not wrong, "; ".join(wrong)


FOLDERS = {"jit2triton": "jit2triton", **{stage: f"jit2triton.{stage}" for stage in STAGES}}


def _module_imports() -> dict[str, set[str]]:
    """module -> the package's modules it imports (lazy imports inside functions included)."""
    files = {module: (path, package) for folder, root in FOLDERS.items() for module, path, package in
             _modules(folder, root)}
    return {module: {m for m in _imports(path, package)
                     if m in files and m != module and not module.startswith(m + ".")}  # (a package's own root)
            for module, (path, package) in files.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm, iteratively)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(root: str) -> None:
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter[0]
                    counter[0] += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        group.append(member)
                        if member == node:
                            break
                    if len(group) > 1:
                        found.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def test_no_import_circle_anywhere() -> None:
    """Two modules that import each other (even lazily, inside a function) are one module in two files: neither
    can be read, tested or moved alone. What both need goes below them; a dispatcher goes above."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the finder finds
    circles = _circles(_module_imports())
    assert not circles, "import circles: " + "; ".join(" <-> ".join(c) for c in circles)


def test_every_subpackage_ships() -> None:
    """An editable install finds any folder; a wheel holds only the packages pyproject.toml lists."""
    tomllib = pytest.importorskip("tomllib")
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {module for folder, package in FOLDERS.items() for module, path, _ in _modules(folder, package)
             if path.stem == "__init__"}
    assert found == listed, f"packages not in pyproject.toml: {sorted(found - listed)}; listed, not found: " \
                            f"{sorted(listed - found)}"


def test_the_manifest_is_written_in_one_place() -> None:
    """A field of the manifest (deploy/format.py's MANIFEST) is set in deploy/packaging/build_manifest.py alone: what
    conversion decides after a build goes through its functions, so a field's writers are read in one file. The
    report, which no runtime reads, is each stage's own section. (The runtime's readers, deploy/*.py, build the
    dicts they read from a file, a method's manifest from the package's: there only a loaded package's `.manifest`
    counts.)"""
    from jit2triton.deploy.format import MANIFEST
    fields = {f.name for f in MANIFEST.fields} - {"report"}
    write = (r'manifest\[\s*"(\w+)"\s*\](?:\[[^\]]*\])*\s*=(?!=)|manifest\.setdefault\(\s*"(\w+)"'
             r'|manifest\.(?:update|pop)\(|manifest\[\s*"(\w+)"\s*\]\.(?:update|append|setdefault)\(')
    anywhere, loaded = re.compile(write), re.compile(r"\." + write.replace("|", r"|\."))
    sources = [p for folder in STAGES + ["jit2triton"] for p in sorted((ROOT / folder).rglob("*.py"))]
    wrong = []
    for path in sources:
        if path == ROOT / "deploy" / "packaging" / "build_manifest.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            runtime = path.parent == ROOT / "deploy"
            for match in (loaded if runtime else anywhere).finditer(line):
                field = next((g for g in match.groups() if g), None)
                if field is None or field in fields:
                    wrong.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    assert len(sources) > 100
    assert not wrong, "manifest fields written outside deploy/packaging/build_manifest.py:\n" + "\n".join(wrong)
