"""The op facts the runtimes need, written out of the op table for them: the runtimes may not import the transpiler
(a package loads without it), so both read generated files instead of sets of their own:

    python -m jit2triton.transpiler.export_facts    # writes deploy/op_facts.py and deploy/cpp/src/op_facts.h

tests/test_op_facts.py fails while either file differs from what the table generates, so a fact changed in the table
reaches both runtimes or the tests say so.
"""
from __future__ import annotations

from pathlib import Path

from .op_table import ops_where

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
PYTHON_FILE = DEPLOY / "op_facts.py"
CPP_FILE = DEPLOY / "cpp" / "src" / "op_facts.h"
WRAP = 116

# (OpInfo field, Python name, what a runtime does with it); a field the C++ runtime reads has its C++ function name
PYTHON_FACTS = [
    ("syncs_host", "SYNCS_HOST", "a CUDA graph cannot hold them: the host waits for the device, or acts each call"),
    ("builds_container", "CONTAINERS", "build a list, tuple or dict from their inputs"),
    ("unpacks", "UNPACKS", "give one output per item of a list or tuple"),
    ("forbidden", "FORBIDDEN", "reach outside the model (files, global state): a plan calling one is refused"),
    ("packs_weights", "PACKING_OPS", "the only ops a plan's \"packed\" list may run (quantized weights, at load)"),
    ("reads_node", "NODE_ATTRIBUTE_OPS", "TorchScript's operation reads their graph node: no plan step can call them"),
]
CPP_FACTS = [("forbidden", "forbidden"), ("packs_weights", "packs_weights")]


def _wrapped(words: list[str], indent: str) -> list[str]:
    lines, line = [], indent
    for word in words:
        if len(line) + len(word) + 1 > WRAP and line.strip():
            lines.append(line.rstrip())
            line = indent
        line += word + " "
    return lines + [line.rstrip()] if line.strip() else lines


def python_module() -> str:
    lines = ['"""What the runtimes know about ops: generated from transpiler/op_table.py by',
             "`python -m jit2triton.transpiler.export_facts`; edit the op table, never this file.\"\"\"", ""]
    for field, name, why in PYTHON_FACTS:
        ops = sorted(ops_where(field))
        lines += [f"# OpInfo.{field}: {why}", f"{name} = frozenset({{"] + _wrapped([f'"{op}",' for op in ops], "    ") \
            + ["})"]
    return "\n".join(lines) + "\n"


def cpp_header() -> str:
    lines = ["// What the C++ runtime knows about ops: generated from transpiler/op_table.py by",
             "// `python -m jit2triton.transpiler.export_facts`; edit the op table, never this file.",
             "#pragma once", "", "#include <set>", "#include <string>", "", "namespace jit2triton::op_facts {", ""]
    why = {field: text for field, _, text in PYTHON_FACTS}
    for field, function in CPP_FACTS:
        names = [f'"{op}",' for op in sorted(ops_where(field))]
        lines += [f"// OpInfo.{field}: {why[field]}", f"inline bool {function}(const std::string& op) {{",
                  "  static const std::set<std::string> ops = {"] + _wrapped(names, "      ") + \
                 ["  };", "  return ops.count(op) > 0;", "}", ""]
    return "\n".join(lines + ["}  // namespace jit2triton::op_facts"]) + "\n"


def write() -> None:
    PYTHON_FILE.write_text(python_module())
    CPP_FILE.write_text(cpp_header())


if __name__ == "__main__":
    write()
