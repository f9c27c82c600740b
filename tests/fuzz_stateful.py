"""A differential fuzzer for programs with module state: random scripted modules whose forward reads and writes
their own attributes (caches grown by `cat` and trimmed to a maximum, counters, buffers updated in place, running
means, lists appended and trimmed, lists and dicts changed in place) beside random pointwise work, with a `reset`
method. Each is converted (forward and reset), saved, loaded and called over a sequence (forward x3, reset, forward
x3) of fresh inputs beside the TorchScript module called the same way; the outputs after every call must match. A
kernel that convert-time verification had to take out is a failure too (it names a kernel that was wrong over
calls).

    python tests/fuzz_stateful.py --seeds 200 [--first 0] [--backend cpp|triton] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import random
import sys
import tempfile
import traceback
from typing import Optional

import torch

FEATURES = 8  # the inputs' last dim, and every state row's
POINTWISE = ["torch.relu({a})", "torch.sigmoid({a})", "torch.tanh({a})", "{a} * 1.5 + 0.25", "{a}.sin()",
             "{a} - {a}.mean(1, keepdim=True)", "torch.softmax({a}, 1)"]

# Each kind of state: (attribute declaration in __init__, its reset, the lines of forward that update it, what it
# adds to the output). {i}: the attribute's number, {m}: a maximum, {h}: the value the update reads, {f}: FEATURES.
STATE_KINDS = {  # (tensors are buffers, so that the module moves to the GPU whole, and resets make them there)
    "cat_cache": ('self.register_buffer("c{i}", torch.zeros(0, {f}))', "self.c{i} = self.c{i}[:0]",
                  ["self.c{i} = torch.cat([self.c{i}, {h}.mean(0, keepdim=True)], 0)",
                   "if self.c{i}.size(0) > {m}:", "    self.c{i} = self.c{i}[1:]"],
                  "torch.softmax({h} @ self.c{i}.t(), 1) @ self.c{i}"),
    "counter": ("self.n{i} = 0", "self.n{i} = 0", ["self.n{i} += 1"], "{h} * float(self.n{i})"),
    "in_place": ('self.register_buffer("b{i}", torch.zeros({f}))', "self.b{i}.zero_()",
                 ["self.b{i}.mul_(0.5).add_({h}.mean(0))"], "{h} + self.b{i}"),
    "running_mean": ('self.register_buffer("e{i}", torch.zeros({f}))', "self.e{i} = torch.zeros_like(self.e{i})",
                     ["self.e{i} = 0.75 * self.e{i} + 0.25 * {h}.amax(0)"], "{h} * self.e{i}.sigmoid()"),
    "list": ("self.l{i} = []", "self.l{i} = []",
             ["self.l{i} = self.l{i} + [{h}.sum(0)]", "if len(self.l{i}) > {m}:", "    self.l{i} = self.l{i}[1:]"],
             "{h} + torch.stack(self.l{i}).mean(0)"),
    # containers changed in place: no assignment says they are state that changes (their sizes grow call by call)
    "list_in_place": ("self.a{i} = []", "self.a{i}.clear()",
                      ["self.a{i}.append({h}.sum(0))", "if len(self.a{i}) > {m}:", "    self.a{i}.pop(0)"],
                      "{h} + torch.stack(self.a{i}).mean(0)"),
    "dict_in_place": ("self.d{i} = {{}}", "self.d{i}.clear()",
                      ["self.d{i}['k' + str(len(self.d{i}) % {m})] = {h}.amax(0)"],
                      "{h} * torch.stack(list(self.d{i}.values())).sum(0).sigmoid()"),
}
CALLS = ["forward", "forward", "forward", "reset", "forward", "forward", "forward"]


def draw_module(seed: int) -> str:
    """The source of a random stateful module `Program`."""
    rnd = random.Random(seed)
    kinds = rnd.sample(sorted(STATE_KINDS), rnd.randint(1, 3))
    init, reset, body, annotations = [], [], ["h0 = x"], []
    value = "h0"
    for i, kind in enumerate(kinds):
        declare, clear, update, use = STATE_KINDS[kind]
        fresh = f"h{i + 1}"
        body.append(f"{fresh} = " + rnd.choice(POINTWISE).format(a=value))
        init.append(declare.format(i=i, f=FEATURES))
        if kind in ("list", "list_in_place"):  # (TorchScript types an empty container from its annotation)
            annotations.append(f"{'l' if kind == 'list' else 'a'}{i}: List[torch.Tensor]")
        if kind == "dict_in_place":
            annotations.append(f"d{i}: Dict[str, torch.Tensor]")
        reset.append(clear.format(i=i, f=FEATURES))
        body += [line.format(i=i, m=rnd.randint(2, 4), h=fresh) for line in update]
        value = f"u{i}"
        body.append(f"{value} = " + use.format(i=i, h=fresh))
    body.append("return " + rnd.choice(POINTWISE).format(a=value))
    lines = ["from typing import Dict, List", "import torch", "",
             "class Program(torch.nn.Module):"] + [f"    {line}" for line in annotations] + [
             "    def __init__(self):", "        super().__init__()"]
    lines += [f"        {line}" for line in init]
    lines += ["", "    def forward(self, x):"] + [f"        {line}" for line in body]
    lines += ["", "    @torch.jit.export", "    def reset(self):"] + [f"        {line}" for line in reset]
    return "\n".join(lines) + "\n"


def _module_class(source: str, folder: str):
    path = os.path.join(folder, "program.py")  # scripting reads the class's source from its file
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location(f"stateful_program_{abs(hash(source))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.Program


def failure_of(seed: int, backend: str = "cpp", device: str = "cpu") -> Optional[str]:
    """Why seed's program fails (conversion, a kernel verification took out, a call that differs), or None."""
    import jit2triton
    from jit2triton.verify import compare

    source = draw_module(seed)
    with tempfile.TemporaryDirectory() as folder:
        program = _module_class(source, folder)
        torch.manual_seed(seed)
        scripted = torch.jit.script(program().to(device))
        generator = torch.Generator().manual_seed(seed)
        example = torch.randn(4, FEATURES, generator=generator).to(device)
        try:
            converted = jit2triton.convert(scripted, {"forward": (example,), "reset": ()}, device=device,
                                           backend=backend)
        except Exception as err:  # noqa: BLE001 - any conversion failure is the finding
            return f"conversion failed: {type(err).__name__}: {err}\n{source}"
        removed = converted.summary()["verification"]["kernels_removed"]
        if removed:
            return f"verification took kernels out: {removed}\n{source}"
        path = os.path.join(folder, "m.j2t")
        converted.save(path)
        loaded = jit2triton.load(path)
        reference = torch.jit.script(program().to(device))
        reference.reset()
        for number, method in enumerate(CALLS, 1):
            if method == "reset":
                loaded.reset(), reference.reset()
                continue
            x = torch.randn(4, FEATURES, generator=generator).to(device)
            try:
                mismatches = compare(loaded(x), reference(x))
            except Exception as err:  # noqa: BLE001
                return f"call {number}: {type(err).__name__}: {err}\n{source}"
            if mismatches:
                return f"call {number} of {CALLS}: {mismatches[0]}\n{source}"
    return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=50)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--backend", default="cpp")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)
    failed = 0
    for seed in range(args.first, args.first + args.seeds):
        try:
            report = failure_of(seed, args.backend, args.device)
        except Exception:  # noqa: BLE001 - a crash of the fuzzer's own is reported like a failure
            report = traceback.format_exc()
        if report:
            failed += 1
            print(f"seed {seed}: {report}", flush=True)
    print(f"{failed} of {args.seeds} stateful programs failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
