"""Passes share what they know about a node through `Node.attrs` keys declared once, in transpiler/ir.py's `Attr`: a
pass that spelt a key as a string literal could write one that no other pass reads (fuse_attention wrote
`fused_from`, which nothing read) or read one that nothing writes, and nothing would fail."""
from __future__ import annotations

import ast
import pathlib

from jit2triton.transpiler.ir import Attr

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("loaders", "transpiler", "emitters", "deploy", "jit2triton")


def _is_attrs(expr: ast.AST) -> bool:
    return (isinstance(expr, ast.Attribute) and expr.attr == "attrs") or (isinstance(expr, ast.Name)
                                                                         and expr.id == "attrs")


def literal_attr_keys(source: str) -> list[tuple[int, str]]:
    """(line, key) of every string literal used as a Node.attrs key: subscripts, get/pop/setdefault, `in`, and the
    dicts given as `attrs=`, as Node's fourth argument or assigned to a name `attrs`."""
    found: list[tuple[int, str]] = []

    def key(expr: ast.AST) -> None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, str):
            found.append((expr.lineno, expr.value))

    def dict_keys(expr: ast.AST) -> None:
        if isinstance(expr, ast.Dict):
            for k in expr.keys:
                if k is not None:
                    key(k)
        elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "dict":
            found.extend((kw.value.lineno, kw.arg) for kw in expr.keywords if kw.arg is not None)

    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and _is_attrs(node.value):
            key(node.slice)
        elif isinstance(node, ast.Call):
            f = node.func
            if isinstance(f, ast.Attribute) and f.attr in ("get", "pop", "setdefault") and _is_attrs(f.value) \
                    and node.args:
                key(node.args[0])
            for kw in node.keywords:
                if kw.arg == "attrs":
                    dict_keys(kw.value)
            if isinstance(f, ast.Name) and f.id == "Node" and len(node.args) >= 4:
                dict_keys(node.args[3])
        elif isinstance(node, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops) \
                and any(_is_attrs(c) for c in node.comparators):
            key(node.left)
        elif isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "attrs" for t in node.targets):
            dict_keys(node.value)
    return found


def test_every_node_attrs_key_is_a_declared_constant() -> None:
    literal = [f"{path.relative_to(ROOT)}:{line}: {key!r}"
               for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))
               for line, key in literal_attr_keys(path.read_text())]
    assert not literal, "Node.attrs keys spelt as literals (use transpiler/ir.py's Attr):\n" + "\n".join(literal)


def test_the_check_finds_each_way_of_spelling_a_key() -> None:
    """The test above cannot pass by finding nothing: each form a pass could use is caught."""
    source = '\n'.join([
        'node.attrs["a"] = 1', 'node.attrs.get("b")', 'x = "c" in node.attrs', 'y = "d" not in n.attrs',
        'Node(op, [], [], attrs={"e": 1})', 'Node(op, [], [], {"f": 1})', 'attrs = {"g": 1}',
        'Node(op, [], [], attrs=dict(base, h=1))', 'node.attrs.setdefault("i", [])', 'node.attrs.pop("j", None)',
        'node.attrs[Attr.VALUE] = 1'])
    assert sorted(key for _, key in literal_attr_keys(source)) == list("abcdefghij")


def test_the_declared_keys_are_distinct() -> None:
    keys = {name: value for name, value in vars(Attr).items() if name.isupper()}
    assert len(set(keys.values())) == len(keys)
    assert all(value == name.lower() for name, value in keys.items())
