"""On the GPU machine (issue 46, item 3): scripted torchvision detectors with random weights, their score thresholds
lowered and their heads' weights spread so that boxes survive, converted for CUDA and compared with the model as the
user loads it (the UNFROZEN TorchScript module, run in TorchScript's plain interpreter) on fresh images: box counts,
labels, boxes and scores. The frozen (conv-BatchNorm folded) model's distance from the unfrozen one is printed
beside it: where that is large, folding would have picked other boxes. Also prints generated-kernel and ATen node
counts (`--counts-only` for models only counted). One JSON line per model on stdout; not collected by pytest
(torchvision installs only on the GPU machine).

The answers compared here are the C++ runtime's, which verification runs.

    python tests/gpu_detectors_unfrozen.py --models fcos_resnet50_fpn,maskrcnn_resnet50_fpn_v2 [--images 3]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_torchscript_programs import images, spread_scores, worst_error  # noqa: E402

OPTIONS = {"fcos_resnet50_fpn": {"score_thresh": 0.05}, "maskrcnn_resnet50_fpn_v2": {"box_score_thresh": 0.0},
           "ssd300_vgg16": {}, "ssdlite320_mobilenet_v3_large": {}}


def compare(actual, expected) -> dict:
    """Per image: box counts, whether labels agree, and the largest relative error of boxes and scores."""
    out = []
    for got, want in zip(actual[1] if isinstance(actual, tuple) else actual,
                         expected[1] if isinstance(expected, tuple) else expected):
        entry = {"boxes": [int(got["boxes"].shape[0]), int(want["boxes"].shape[0])]}
        same = got["boxes"].shape == want["boxes"].shape
        entry["labels_equal"] = bool(same and torch.equal(got["labels"].cpu(), want["labels"].cpu()))
        entry["boxes_err"] = worst_error(got["boxes"], want["boxes"]) if same else float("inf")
        entry["scores_err"] = worst_error(got["scores"], want["scores"]) if same else float("inf")
        out.append(entry)
    return out


def check(name: str, device: str, count: int, counts_only: bool, timeout: float) -> dict:
    import torchvision

    import jit2triton
    from jit2triton.deploy import cpp_runtime
    cpp_runtime.unavailable = lambda: "skipped by this check (the extension's first build takes minutes)"
    torch.manual_seed(0)
    result: dict = {"model": name, "device": torch.cuda.get_device_name() if device == "cuda" else "cpu"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = torchvision.models.get_model(name, weights=None, weights_backbone=None, **OPTIONS.get(name, {}))
        spread_scores(model, only=("cls",) if name.startswith("maskrcnn") else ())
        model = torch.jit.script(model.eval().to(device))
        started = time.perf_counter()
        converted = jit2triton.convert(model, (images(0, device),), device=device, timeout=timeout)
        result["convert_s"] = round(time.perf_counter() - started, 1)
        summary = converted.summary()
        verification = summary["verification"]
        result.update(generated_nodes=summary["native_nodes"], aten_nodes=summary["fallback_nodes"],
                      extern_nodes=summary["extern_nodes"], kernels=len(summary["kernels"]),
                      verification=verification["status"],
                      removed=[k["kernel"] for k in verification["kernels_removed"]],
                      notes=[n[:300] for n in verification["notes"]])
        if counts_only:
            return result
        frozen = torch.jit.freeze(model)
        result["images"] = []
        for seed in range(1, count + 1):
            inputs = (images(seed, device),)
            with torch.no_grad(), torch.jit.optimized_execution(False):
                expected = model(*inputs)
                folded = frozen(*inputs)
            actual = converted(*inputs)
            result["images"].append({"package_vs_unfrozen": compare(actual, expected),
                                     "frozen_vs_unfrozen": compare(folded, expected)})
    mine = [e for image in result["images"] for e in image["package_vs_unfrozen"]]
    result["match"] = all(e["boxes"][0] == e["boxes"][1] and e["labels_equal"] and e["boxes_err"] < 1e-3
                          and e["scores_err"] < 1e-3 for e in mine)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="fcos_resnet50_fpn,maskrcnn_resnet50_fpn_v2")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--images", type=int, default=3)
    parser.add_argument("--counts-only", action="store_true")
    parser.add_argument("--timeout", type=float, default=150.0)
    args = parser.parse_args()
    failed = 0
    for name in [m for m in args.models.split(",") if m]:
        try:
            result = check(name, args.device, args.images, args.counts_only, args.timeout)
        except Exception as err:  # noqa: BLE001 - each model reports
            result = {"model": name, "error": f"{type(err).__name__}: {str(err)[:800]}",
                      "trace": traceback.format_exc().splitlines()[-8:]}
        failed += not result.get("match", args.counts_only and "error" not in result)
        print(json.dumps(result), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
