"""GPU benchmark of reduced precision (#33): float32 models converted to float16/bfloat16 packages, speed and accuracy
side by side, against the float32 package, torch.jit (float32) and torch.compile under autocast (the user's best
effort at reduced precision without rewriting the model).

Every model is built in float32 with random weights (speed does not depend on them). Per row and path: the error
against the float32 eager model on the example inputs and on a fresh draw (max abs, relative to the largest
magnitude, and top-1 agreement for 2-D logits), then CUDA-event time per call, the paths taking turns call by
call after warm-up (median of --runs), all under torch.inference_mode(), in one process. Each row and each path is
guarded: one that fails is reported as failed and the others still run. Writes JSON to --json, or to
$OUT/precision_bench.json where $OUT is set, after every row.

    python benchmarks/precision_bench.py [--only "BERT base 1x9"] [--runs 100] [--skip-compile] [--json out.json]

Each row converts three or two packages and compiles one torch.compile model: about a minute or two per row on an
H100; `--only` runs one row (repeat it to run several).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
import jit2triton  # noqa: E402
from gpu_bench import extra_workloads, interleaved_us  # noqa: E402

# (workload, the reduced precisions its packages are built in); the workloads are gpu_bench's, built in float32
ROWS = [("BERT base 1x9", ("fp16", "bf16")), ("BERT base 8x128", ("fp16", "bf16")),
        ("resnet50 NCHW 16x224", ("fp16",)), ("ViT-B/16 8x224", ("bf16",))]
AUTOCAST = {"fp16": torch.float16, "bf16": torch.bfloat16}


def accuracy(got, expected) -> dict:
    """Max abs error, error relative to the reference's largest magnitude, and top-1 agreement of 2-D logits."""
    got, expected = got.detach().double(), expected.detach().double()
    error = (got - expected).abs().max().item()
    result = {"max_abs": error, "max_rel": error / max(expected.abs().max().item(), 1e-30)}
    if expected.dim() == 2 and expected.shape[-1] >= 2:
        result["top1"] = (got.argmax(-1) == expected.argmax(-1)).double().mean().item()
    return result


def worst(measures: list[dict]) -> dict:
    merged = {k: max(m[k] for m in measures) for k in ("max_abs", "max_rel")}
    if all("top1" in m for m in measures):
        merged["top1"] = min(m["top1"] for m in measures)
    return merged


def fresh_like(inputs: tuple) -> tuple:
    """Another draw of the inputs: floats from randn, integer ids from the example's range."""
    generator = torch.Generator().manual_seed(1234)
    out = []
    for x in inputs:
        if x.dtype.is_floating_point:
            out.append(torch.randn(x.shape, dtype=x.dtype, generator=generator).to(x.device))
        else:
            out.append(torch.randint(0, int(x.max()) + 1, x.shape, dtype=x.dtype, generator=generator).to(x.device))
    return tuple(out)


def package(pt_path: str, inputs: tuple, folder: str, precision, row: dict):
    """Convert (timed), save and load a package; its report's precision section goes into the row."""
    label = f"jit2triton {precision or 'fp32'}"
    t0 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        converted = jit2triton.convert(pt_path, example_inputs=inputs, device=inputs[0].device,
                                       precision=precision)
    row[f"{label} convert_s"] = round(time.perf_counter() - t0, 1)
    path = os.path.join(folder, f"model_{precision or 'fp32'}.j2t")
    converted.save(path)
    section = converted.manifest["report"].get("precision")
    if section:
        moved = [n for n in section["fp32_nodes"] if not n["why"].startswith("rule: ")]
        row[f"{label} report"] = {"outputs": section["outputs"],
                                  "fp32_by_rule": sum(1 for n in section["fp32_nodes"] if n["why"].startswith("rule")),
                                  "fp32_for_accuracy": [f"{n['op']} at {n['source']}" for n in moved]}
    return label, jit2triton.load(path)


def autocast_compiled(model, precision: str):
    compiled = torch.compile(model)

    def run(*inputs):
        with torch.autocast("cuda", dtype=AUTOCAST[precision]):
            return compiled(*inputs)
    return run


def run_row(name: str, precisions: tuple, workloads: dict, args) -> dict:
    torch.manual_seed(0)
    model, inputs = workloads[name].build("cuda", torch.float32)
    row = {"workload": name, "model dtype": "float32", "failed": {}}
    folder = tempfile.mkdtemp()
    pt_path = os.path.join(folder, "model.pt")
    cases = [inputs, fresh_like(inputs)]
    with torch.no_grad():  # (as gpu_bench traces: inference tensors would end up in the trace's constants)
        expected = [model(*x) for x in cases]
        torch.jit.save(torch.jit.trace(model, inputs, check_trace=False), pt_path)
    builders = {"torch.jit fp32": lambda: torch.jit.freeze(torch.jit.load(pt_path).eval())}
    for precision in (None,) + precisions:
        builders[f"jit2triton {precision or 'fp32'}"] = lambda p=precision: package(pt_path, inputs, folder, p, row)[1]
    if not args.skip_compile:  # in the row's first precision only: compiling is most of a row's time
        builders[f"compile+autocast {precisions[0]}"] = lambda: autocast_compiled(model, precisions[0])
    paths = {}
    for label, build in builders.items():
        try:
            fn = build()
            with torch.inference_mode():
                row[f"{label} accuracy"] = worst([accuracy(fn(*x), e) for x, e in zip(cases, expected)])
            paths[label] = fn
        except Exception as err:  # noqa: BLE001 - one path that fails must not hide the others' numbers
            row["failed"][label] = f"{type(err).__name__}: {err}"[:600]
            print(f"{name} / {label}: FAILED {row['failed'][label]}")
    with torch.inference_mode():
        row["us"] = interleaved_us(paths, inputs, args.runs)
    base = row["us"].get("jit2triton fp32")
    if base:
        row["speed-up vs fp32 package"] = {label: round(base / us, 2) for label, us in row["us"].items()}
    return row


def print_table(rows: list[dict]) -> None:
    props = torch.cuda.get_device_properties(0)
    import triton
    print(f"\nGPU: {props.name}; torch {torch.__version__}; triton {triton.__version__}; {time.strftime('%Y-%m-%d')}; "
          "CUDA events, median, paths interleaved; errors against the float32 eager model (example + fresh draw)")
    print("| workload | path | µs | vs fp32 package | max abs | max rel | top-1 |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['workload']} | failed: {r['error'][:120]} | | | | | |")
            continue
        for label, us in r["us"].items():
            acc = r.get(f"{label} accuracy", {})
            top1 = f"{acc['top1']:.1%}" if "top1" in acc else "-"
            print(f"| {r['workload']} | {label} | {us:.1f} | {r.get('speed-up vs fp32 package', {}).get(label, '-')}x "
                  f"| {acc.get('max_abs', float('nan')):.3g} | {acc.get('max_rel', float('nan')):.3g} | {top1} |")
        for label, why in r["failed"].items():
            print(f"| {r['workload']} | {label} | failed: {why[:100]} | | | | |")
    for r in rows:
        for key, value in r.items():
            if key.endswith(" report"):
                print(f"{r['workload']} / {key}: {json.dumps(value, default=str)[:600]}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--only", action="append")
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    out = args.json or (os.path.join(os.environ["OUT"], "precision_bench.json") if os.environ.get("OUT") else None)
    workloads = extra_workloads()
    rows = []
    for name, precisions in ROWS:
        if args.only and name not in args.only:
            continue
        if name not in workloads:
            print(f"skipping {name}: not available here (torchvision or transformers missing)")
            continue
        started = time.perf_counter()
        try:
            rows.append(run_row(name, precisions, workloads, args))
        except Exception as err:  # noqa: BLE001 - one broken workload must not hide the others' numbers
            rows.append({"workload": name, "error": f"{type(err).__name__}: {err}"[:2000]})
            print(f"{name}: FAILED {rows[-1]['error']}")
        rows[-1]["row_s"] = round(time.perf_counter() - started, 1)
        print(f"{name}: done in {rows[-1]['row_s']}s", flush=True)
        torch.cuda.empty_cache()
        if out:
            with open(out, "w") as f:
                json.dump(rows, f, indent=1, default=str)
    print_table(rows)


if __name__ == "__main__":
    main()
