"""A plan step calling one of TorchScript's interpreter's own prim:: ops, which no runtime can call as a step (its
operation is made from the graph node, or for the interpreter's stack: prim::ChunkSizes, prim::rpc_sync, a fusion
group), is refused at load by the runtime with a CorruptPackageError naming the op (issue 43: such a package
passed the "registered op" check and crashed the runtimes and j2t-run on its first call). The runtime loads
every planted package in a child process (tests/planted_ops.py), so a crash fails the test instead of killing it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

from jit2triton.deploy.host_ops import HOST_OPS
from jit2triton.deploy.resolve import NODE_ATTRIBUTE_OPS

HERE = os.path.dirname(os.path.abspath(__file__))
INTERPRETER_ONLY = "runs only inside its interpreter"  # the refusal's words (other refusals: other damage)


def _prim_ops() -> dict[str, tuple[int, bool]]:
    """Every registered prim:: op: the number of arguments its step passes (one for a variadic schema) and whether
    its schema is variadic; and prim::fork, an interpreter instruction with no registered op."""
    ops = {"prim::fork": (1, True)}
    for schema in torch._C._jit_get_all_schemas():
        if schema.name.startswith("prim::"):
            variadic = str(schema).partition(" -> ")[0].endswith("...)")
            name = schema.name + (f".{schema.overload_name}" if schema.overload_name else "")
            ops[name] = (1 if variadic else len(schema.arguments), variadic)
    return ops


def _load_each(ops: dict, folder) -> dict[str, dict]:
    child = subprocess.run([sys.executable, os.path.join(HERE, "planted_ops.py"), "cpp", str(folder)],
                           input="".join(f"{op} {n}\n" for op, (n, _) in sorted(ops.items())), capture_output=True,
                           text=True, cwd=HERE, timeout=600, env={**os.environ, "PYTHONPATH": HERE})
    lines = [json.loads(line) for line in child.stdout.splitlines() if line.startswith("{")]
    results = {r["op"]: r for r in lines if "started" not in r}
    crashed = lines[-1]["op"] if lines and "started" in lines[-1] else None
    assert child.returncode == 0, f"the runtime died (exit {child.returncode}) on {crashed}: {child.stderr[-2000:]}"
    assert set(results) == set(ops)
    return results


def test_interpreter_only_prim_ops_are_refused_at_load(cpp_runtime, tmp_path) -> None:
    ops = _prim_ops()
    results = _load_each(ops, tmp_path)
    # what the runtime does not run: a variadic prim:: op (or none registered) that it does not implement itself, or
    # one whose operation reads its graph node
    expected = {op for op, (_, variadic) in ops.items() if variadic and op not in HOST_OPS} | NODE_ATTRIBUTE_OPS
    assert {"prim::ChunkSizes", "prim::rpc_sync", "prim::fork", "prim::FusionGroup"} <= expected
    refused = {op for op, r in results.items() if INTERPRETER_ONLY in r.get("refused", ["", ""])[1]}
    assert refused == expected, sorted(refused ^ expected)
    assert all(results[op]["refused"][0] == "CorruptPackageError" and op in results[op]["refused"][1]
               for op in refused)
    assert all("called" in results[op] or "refused" in results[op] for op in ops)  # each loaded, ran or raised
