"""Conversion time of real models on the GPU machine: torchvision/timm classifiers and BERT-base, traced at
batch 1 and converted for CUDA, first with empty kernel caches (jit2triton's and Triton's: what a new machine
pays) and then again with them filled (a second conversion of the same or a similar model).

    python benchmarks/convert_time.py [--models resnet18,densenet121] [--no-warm] [--deadline-s 540]

Prints one row per model: cold and warm seconds, kernels and distinct binaries, kernels taken out by
verification, and the cold conversion's slowest stages (the report's `pass_seconds`). Models that do not fit before
the deadline are listed as skipped. `--json` writes every row with all its stages.
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


def torchvision_model(name: str):
    def build():
        import torchvision
        return getattr(torchvision.models, name)().eval(), (torch.randn(1, 3, 224, 224),)
    return build


def bert_base():
    from dynamic_bench import bert_base as build, bert_inputs
    return build("cpu"), bert_inputs((1, 128), "cpu")


MODELS = {name: torchvision_model(name) for name in
          ("resnet18", "resnet50", "densenet121", "densenet201", "convnext_tiny", "regnet_y_1_6gf",
           "mobilenet_v3_large", "efficientnet_b0", "vit_b_16", "regnet_y_32gf", "efficientnet_b7", "convnext_large",
           "vit_h_14")}
MODELS["bert-base"] = bert_base


def convert_once(traced, example) -> tuple[float, dict]:
    started = time.perf_counter()
    converted = jit2triton.convert(traced, example_inputs=example, device="cuda")
    seconds = time.perf_counter() - started
    kernels = converted.manifest.get("triton", {}).get("kernels", {})
    summary = converted.summary()
    return seconds, {"kernels": len(kernels), "binaries": sum(1 for e in kernels.values() if "same_as" not in e),
                     "removed": len(summary["verification"]["kernels_removed"]),
                     "fallback_nodes": summary["fallback_nodes"], "passes": summary.get("pass_seconds", {})}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--no-warm", action="store_true", help="only the conversion with empty caches")
    parser.add_argument("--deadline-s", type=float, default=540, help="skip models that would start after this")
    parser.add_argument("--json", help="write every row here")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    started = time.perf_counter()
    caches = tempfile.mkdtemp()
    os.environ["JIT2TRITON_CACHE"] = os.path.join(caches, "jit2triton")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(caches, "triton")  # read by Triton when it first compiles
    print(f"{'model':20s} {'cold s':>8s} {'warm s':>8s} {'kernels':>8s} {'binaries':>9s} {'removed':>8s}  slowest "
          "stages (cold)", flush=True)
    rows = {}
    for name in args.models.split(","):
        if time.perf_counter() - started > args.deadline_s:
            print(f"{name:20s} skipped (deadline)", flush=True)
            continue
        model, example = MODELS[name]()
        example = tuple(x.cuda() for x in example)
        with torch.no_grad():
            traced = torch.jit.trace(model.cuda(), example, check_trace=False)
        cold, info = convert_once(traced, example)
        warm = convert_once(traced, example)[0] if not args.no_warm else float("nan")
        slowest = sorted(info["passes"].items(), key=lambda kv: -kv[1])[:4]
        print(f"{name:20s} {cold:8.1f} {warm:8.1f} {info['kernels']:8d} {info['binaries']:9d} {info['removed']:8d}  "
              + ", ".join(f"{stage} {s:.1f}" for stage, s in slowest), flush=True)
        rows[name] = dict(info, cold=cold, warm=warm)
        del model, traced
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
