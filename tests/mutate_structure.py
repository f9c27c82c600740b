"""Structure-aware manifest edits for the mutation fuzz (tests/mutate_packages.py): each one changes a single thing
a package's plan relies on in a way that still parses and passes a naive check, where random JSON edits rarely
land. Found by hand before this existed (issue 34, item 4): a weight of shape [0, 32] with 0 bytes, an output's
strides [32, 0], a kernel input's strides `1` or `"complex128"`, an `if` step with one output more than its
branches give, a dict stored into itself.

`structural_edit(manifest, rng)` edits the manifest in place and names what it did."""
from __future__ import annotations

import random
from typing import Callable, Iterator, Optional

Edit = Callable[[dict, random.Random], Optional[str]]  # None: nothing of its kind in this manifest

ODD_LISTS = [1, "complex128", [], [0], [1, 0], [32, 0], [0, 0], [-1, 1], [2 ** 40, 1], [[[1, ["nope"]]], 1]]
OTHER_DTYPE = {"float32": ["int32", "float16", "float64", "bool"], "int64": ["float64", "int32", "uint8"],
               "float16": ["bfloat16", "float32"], "bool": ["uint8", "float32"]}


def steps_of(plan: dict) -> Iterator[dict]:
    """Every step of the plan, nested ones (branches, loop bodies, graph regions) included."""
    pending = list(plan["steps"])
    while pending:
        step = pending.pop()
        yield step
        pending += step.get("steps", [])
        for block in step.get("blocks", []):
            pending += block["steps"]


def _kind(manifest: dict, kind: str) -> list[dict]:
    return [s for s in steps_of(manifest["plan"]) if s.get("kind") == kind]


def _slots(manifest: dict) -> list[int]:
    return sorted({r[1] for s in steps_of(manifest["plan"]) for r in s.get("args", []) if r[0] == "s"}
                  | {o for s in steps_of(manifest["plan"]) for o in s.get("outs", [])})


def zero_size_weight(manifest: dict, rng: random.Random) -> Optional[str]:
    named = [n for n, e in manifest["weights"].items() if e["shape"]]
    if not named:
        return None
    name = rng.choice(named)
    entry = manifest["weights"][name]
    entry["shape"][rng.randrange(len(entry["shape"]))] = 0
    entry["nbytes"] = 0
    return f"weight {name} of shape {entry['shape']} and 0 bytes"


def retyped_weight(manifest: dict, rng: random.Random) -> Optional[str]:
    """Another dtype, its shape's last dim scaled so its bytes still match (the size check passes)."""
    sizes = {"float32": 4, "int32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "bool": 1, "uint8": 1}
    named = [n for n, e in manifest["weights"].items() if e["shape"] and e["dtype"] in OTHER_DTYPE]
    if not named:
        return None
    name = rng.choice(named)
    entry = manifest["weights"][name]
    dtype = rng.choice(OTHER_DTYPE[entry["dtype"]])
    scaled = entry["shape"][-1] * sizes[entry["dtype"]]
    if scaled % sizes[dtype]:
        return None
    entry["shape"][-1], entry["dtype"] = scaled // sizes[dtype], dtype
    return f"weight {name} as {dtype} {entry['shape']}"


def kernel_output_layout(manifest: dict, rng: random.Random) -> Optional[str]:
    steps = [s for s in _kind(manifest, "kernel") if s["out_types"]]
    if not steps:
        return None
    step = rng.choice(steps)
    out = step["out_types"][rng.randrange(len(step["out_types"]))]
    part = rng.choice([0, 2])
    if out[part] and rng.random() < 0.5:
        out[part][rng.randrange(len(out[part]))] = rng.choice([0, 1, 2 ** 40])
    else:
        out[part] = rng.choice(ODD_LISTS)
    return f"kernel step {step['kernel']}: an output's {'shape' if part == 0 else 'strides'} {out[part]}"


def kernel_input_layout(manifest: dict, rng: random.Random) -> Optional[str]:
    steps = [s for s in _kind(manifest, "kernel") if s.get("in_strides")]
    if not steps:
        return None
    step = rng.choice(steps)
    key = rng.choice(["in_strides", "in_shapes"])
    values = step.setdefault(key, [None] * len(step["args"]))
    if not values or rng.random() < 0.15:
        step[key] = rng.choice(ODD_LISTS)
        return f"kernel step {step['kernel']}: {key} {step[key]}"
    values[rng.randrange(len(values))] = rng.choice(ODD_LISTS)
    return f"kernel step {step['kernel']}: {key} {values}"


def kernel_argument(manifest: dict, rng: random.Random) -> Optional[str]:
    """A kernel reads another value than it was built for: another slot, another weight, a constant."""
    steps = [s for s in _kind(manifest, "kernel") if s["args"]]
    if not steps:
        return None
    step = rng.choice(steps)
    i = rng.randrange(len(step["args"]))
    choices = [["s", slot] for slot in _slots(manifest)] + [["w", name] for name in manifest["weights"]]
    step["args"][i] = rng.choice(choices + [["c", 1.5], ["c", [1, 2]]])
    return f"kernel step {step['kernel']}: argument {i} is {step['args'][i]}"


def aliased_argument(manifest: dict, rng: random.Random) -> Optional[str]:
    """A call step reads one of its slots where another was: a container stored into itself, an output as input."""
    steps = [s for s in _kind(manifest, "call") if sum(r[0] == "s" for r in s["args"]) + len(s["outs"]) >= 2]
    if not steps:
        return None
    step = rng.choice(steps)
    slots = [r[1] for r in step["args"] if r[0] == "s"] + step["outs"]
    positions = [i for i, r in enumerate(step["args"]) if r[0] in ("s", "c")]
    if not positions:
        return None
    i = rng.choice(positions)
    step["args"][i] = ["s", rng.choice(slots)]
    return f"{step['op']}: argument {i} is {step['args'][i]}"


def control_flow_arity(manifest: dict, rng: random.Random) -> Optional[str]:
    steps = _kind(manifest, "if") + _kind(manifest, "loop")
    if not steps:
        return None
    step = rng.choice(steps)
    block = rng.choice(step["blocks"])
    target, name = rng.choice([(step["outs"], "outs"), (block["outputs"], "block outputs"),
                               (block["inputs"], "block inputs"), (step["args"], "args")])
    if target and rng.random() < 0.5:
        del target[rng.randrange(len(target))]
    else:
        slot = rng.choice(_slots(manifest) or [0])
        target.append(["s", slot] if name in ("block outputs", "args") else slot)
    return f"{step['kind']} step: {name} {target}"


def arena_size(manifest: dict, rng: random.Random) -> Optional[str]:
    if "arena" not in manifest["plan"]:
        return None
    manifest["plan"]["arena"]["bytes"] = rng.choice([1 << 36, 1 << 40, 64, 0, 1 << 20])
    return f"arena of {manifest['plan']['arena']['bytes']} bytes"


def dynamic_dim_range(manifest: dict, rng: random.Random) -> Optional[str]:
    dims = manifest["signature"].get("dims")
    if not dims:
        return None
    name = rng.choice(sorted(dims))
    key = rng.choice(["min", "max", "example"])
    dims[name][key] = rng.choice([[0, 0], 0, -1, 2 ** 62, None, "b", 1.5])
    return f"dim {name}: {key} {dims[name][key]}"


def kernel_index(manifest: dict, rng: random.Random) -> Optional[str]:
    """The kernel table says another buffer than the step passes: a shape, a dtype, a count."""
    kernels = [k for k in manifest["kernels"] if k.get("inputs") or k.get("outputs")]
    if not kernels:
        return None
    kernel = rng.choice(kernels)
    key = rng.choice([k for k in ("inputs", "outputs") if kernel.get(k)])
    buffer = kernel[key][rng.randrange(len(kernel[key]))]
    part = rng.randrange(len(buffer))
    buffer[part] = rng.choice(ODD_LISTS + ["float64", "int8"])
    return f"kernel {kernel['name']}: {key} buffer {buffer}"


EDITS: list[Edit] = [zero_size_weight, retyped_weight, kernel_output_layout, kernel_input_layout, kernel_argument,
                     aliased_argument, control_flow_arity, arena_size, dynamic_dim_range, kernel_index]


def structural_edit(manifest: dict, rng: random.Random) -> str:
    for edit in rng.sample(EDITS, len(EDITS)):  # the first kind this manifest has
        what = edit(manifest, rng)
        if what is not None:
            return what
    return "no structural edit applies"
