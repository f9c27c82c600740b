"""The public face's modules (jit2triton/*.py) import each other one way: no two of them, through any chain, import
each other, lazy imports inside functions included (dims.py and inputs.py once did, through a lazy import)."""
from __future__ import annotations

import ast
from pathlib import Path

FACE = Path(__file__).resolve().parent.parent / "jit2triton"


def face_imports(source: str, modules: set[str]) -> set[str]:
    """The face modules a face module's source imports: `from .x import`, `from . import x`, `jit2triton.x`."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module.split(".")[0]] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and node.module == "jit2triton":
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("jit2triton."):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("jit2triton."))
    return found & modules


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Each (a, b) where a imports b and b reaches a again."""
    def reach(start: str) -> set[str]:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        return seen
    return [(a, b) for a in sorted(graph) for b in sorted(graph[a]) if a in reach(b)]


def test_no_two_face_modules_import_each_other() -> None:
    modules = {p.stem for p in FACE.glob("*.py")}
    graph = {p.stem: face_imports(p.read_text(), modules) - {p.stem} for p in FACE.glob("*.py")}
    assert graph["inputs"] >= {"dims"}, "the check must see the face's imports, or it proves nothing"
    assert not cycles(graph), cycles(graph)


def test_the_check_sees_a_lazy_import_circle() -> None:
    modules = {"dims", "inputs"}
    graph = {"dims": face_imports("def f():\n    from .inputs import inputs_at\n", modules),
             "inputs": face_imports("from .dims import Dim\n", modules)}
    assert cycles(graph) == [("dims", "inputs"), ("inputs", "dims")]
