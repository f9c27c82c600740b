"""On the GPU machine: the TorchScript programs that exist because of TorchScript — scripted torchvision detection
models (module state, data-dependent sizes, lists of dicts as outputs) and a timm model torch's freeze pass crashes
on — converted for CUDA and checked against TorchScript on fresh images. One line per model; not collected by
pytest (torchvision and timm install only on the GPU machine).

    python tests/gpu_torchscript_programs.py [--models fasterrcnn_mobilenet_v3_large_320_fpn,...] [--device cuda]
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings

import torch

DETECTION = ["ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn", "retinanet_resnet50_fpn",
             "maskrcnn_resnet50_fpn", "keypointrcnn_resnet50_fpn"]
TIMM = ["fastvit_t8"]
# Random weights score every box low: thresholds of 0 keep the post-processing (NMS, top-k, masks) busy
OPTIONS = {"fasterrcnn_mobilenet_v3_large_320_fpn": {"box_score_thresh": 0.0},
           "maskrcnn_resnet50_fpn": {"box_score_thresh": 0.0}, "keypointrcnn_resnet50_fpn": {"box_score_thresh": 0.0},
           "retinanet_resnet50_fpn": {"score_thresh": 0.0}}


def images(seed: int, device: str, size: int = 320) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.rand(3, size, size, generator=g).to(device), torch.rand(3, size - 32, size, generator=g).to(device)]


def worst_error(actual, expected) -> float:
    """Largest error relative to each tensor's scale over a nested structure; inf where the structure differs."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor) or actual.shape != expected.shape or actual.dtype != expected.dtype:
            return float("inf")
        if not expected.is_floating_point():
            return float((actual.cpu() != expected.cpu()).float().mean()) if expected.numel() else 0.0
        if not expected.numel():
            return 0.0
        return float((actual.cpu().double() - expected.cpu().double()).abs().max()
                     / expected.cpu().double().abs().max().clamp_min(1e-6))
    if isinstance(expected, (list, tuple)):
        if not isinstance(actual, (list, tuple)) or len(actual) != len(expected):
            return float("inf")
        return max([worst_error(a, e) for a, e in zip(actual, expected)] or [0.0])
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or list(actual) != list(expected):
            return float("inf")
        return max([worst_error(actual[k], expected[k]) for k in expected] or [0.0])
    return 0.0 if actual == expected else float("inf")


def shapes(x) -> str:
    if isinstance(x, torch.Tensor):
        return "x".join(map(str, x.shape))
    if isinstance(x, (list, tuple)):
        return "[" + ",".join(shapes(v) for v in x) + "]"
    if isinstance(x, dict):
        return "{" + ",".join(f"{k}:{shapes(v)}" for k, v in x.items()) + "}"
    return type(x).__name__


def spread_scores(model: torch.nn.Module, only: tuple[str, ...] = ()) -> None:
    """Random heads score every box nearly alike, and boxes whose scores tie within rounding come out in either
    order (TorchScript against itself on the GPU too): spread the heads' weights so that scores are far apart.
    `only`: spread just the layers whose names hold one of these (("cls",): the classifiers, so that box regression
    keeps its small deltas and boxes keep their size: Mask R-CNN's spread regressors collapsed every box)."""
    generator = torch.Generator().manual_seed(1)
    for name, module in model.named_modules():
        if isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)) and ("head" in name or "predictor" in name) \
                and (not only or any(part in name for part in only)):
            with torch.no_grad():
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.3)
                if module.bias is not None:
                    module.bias.copy_(torch.randn(module.bias.shape, generator=generator))


def build(name: str, device: str):
    if name in TIMM:
        import timm
        model = timm.create_model(name, pretrained=False).eval().to(device)
        example = torch.randn(2, 3, 256, 256, device=device)
        with torch.no_grad():
            return torch.jit.trace(model, example, check_trace=False), (example,), lambda s: (torch.randn_like(example),)
    import torchvision
    model = torchvision.models.get_model(name, weights=None, weights_backbone=None, **OPTIONS.get(name, {}))
    spread_scores(model)
    model = model.eval().to(device)
    scripted = torch.jit.script(model)
    return scripted, (images(0, device),), lambda s: (images(s, device),)


def check(name: str, device: str) -> str:
    import jit2triton
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, example, fresh = build(name, device)
        started = time.perf_counter()
        converted = jit2triton.convert(model, example, device=device)
        seconds = time.perf_counter() - started
        summary = converted.summary()
        # jit2triton converts the frozen model (torch.jit.freeze folds BatchNorm into convolutions: rounding-level
        # changes), and a detector's thresholds, top-k and NMS turn those into other boxes: compare with the
        # frozen model, and say how far it is from the unfrozen one
        frozen = torch.jit.freeze(model.eval()) if name not in TIMM else model
        worst, itself, seen = 0.0, 0.0, []
        for seed in (1, 2):
            inputs = fresh(seed)
            with torch.no_grad(), torch.jit.optimized_execution(False):  # (the profiling executor's fuser
                expected = model(*inputs)  # raised "Global alloc not supported yet" on Faster R-CNN)
                frozen_expected = frozen(*inputs)
            actual = converted(*inputs)
            worst = max(worst, worst_error(actual, frozen_expected))
            itself = max(itself, worst_error(frozen_expected, expected))
            seen.append(shapes(expected)[:120])
    v = summary["verification"]
    status = "PASS" if worst < 1e-3 and v["status"] == "passed" else "FAIL"
    return (f"{status} {name}: convert {seconds:.1f}s, verification {v['status']} ({v['input_sets']} sets, removed "
            f"{[k['kernel'] for k in v['kernels_removed']]}), {len(summary['kernels'])} kernels, "
            f"{summary['fallback_nodes']} fallback, max rel. error {worst:.2e} against the frozen model (frozen "
            f"against unfrozen {itself:.2e}); notes {v['notes'][:3]}; outputs {seen}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default=",".join(DETECTION + TIMM))
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    passed = 0
    names = [m for m in args.models.split(",") if m]
    for name in names:
        try:
            line = check(name, args.device)
        except Exception as err:  # noqa: BLE001 - a sweep reports every model
            line = f"ERROR {name}: {type(err).__name__}: {str(err)[:600]}\n" + "".join(
                traceback.format_exc().splitlines(True)[-8:])
        passed += line.startswith("PASS")
        print(line, flush=True)
    print(f"{passed}/{len(names)} passed")
    return 0 if passed == len(names) else 1


if __name__ == "__main__":
    sys.exit(main())
