"""Packages whose plan calls a planted op: for the tests that check every op a runtime cannot run is refused at
load. Run as a script (`python planted_ops.py RUNTIME FOLDER`, one op and its argument count a line on stdin), it
loads each planted package in this process and calls it once, printing one JSON line per op, so a parent process
learns which op a crash stopped at."""
from __future__ import annotations

import json
import os
import sys

import torch

import jit2triton

from package_tools import rewrite_package


class AddOne(torch.nn.Module):
    def forward(self, x):
        return x + 1


def base_package(folder) -> str:
    path = os.path.join(folder, "base.j2t")
    jit2triton.convert(torch.jit.script(AddOne()), (torch.randn(2, 3),), backend="aten").save(path)
    return path


def plant(src: str, dst: str, op: str, num_args: int) -> None:
    """A copy of `src` whose plan first calls `op` on `num_args` references to its input, into a slot of its own."""
    def edit(manifest):
        plan = manifest["plan"]
        out = plan["num_slots"]
        plan["num_slots"] += 1
        plan["steps"].insert(0, {"kind": "call", "op": op, "args": [["s", plan["inputs"][0]]] * num_args,
                                 "outs": [out], "node": 0})
    rewrite_package(src, dst, edit_manifest=edit)


def main(runtime: str, folder: str) -> None:
    base = base_package(folder)
    for line in sys.stdin:
        op, num_args = line.split()
        path = os.path.join(folder, op.replace("::", "_") + ".j2t")
        plant(base, path, op, int(num_args))
        print(json.dumps({"op": op, "started": True}), flush=True)
        result = {"op": op}
        try:
            module = jit2triton.load(path, runtime=runtime)
        except jit2triton.errors.Jit2TritonError as err:
            result["refused"] = [type(err).__name__, str(err)]
        else:
            try:
                module(torch.randn(2, 3))
                result["called"] = None
            except Exception as err:  # noqa: BLE001 - what the call raised is the result
                result["called"] = type(err).__name__
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
