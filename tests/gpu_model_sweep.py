"""On the GPU machine: convert torchvision and timm classification models (random weights, traced) for CUDA, with
convert-time verification on, and check each package against TorchScript on fresh inputs. Prints one line per model
and a pass count; not collected by pytest (it needs torchvision/timm, which only the GPU machine has).

    python tests/gpu_model_sweep.py [--models resnet18,vit_b_16,...] [--limit N] [--batch 2] [--out sweep.txt]
"""
from __future__ import annotations

import argparse
import sys
import time
import traceback
import warnings

import torch

TORCHVISION = ["resnet18", "resnet50", "mobilenet_v2", "mobilenet_v3_small", "efficientnet_b0", "densenet121",
               "regnet_y_400mf", "convnext_tiny", "vit_b_16", "swin_t", "squeezenet1_0", "shufflenet_v2_x1_0",
               "mnasnet0_5", "googlenet", "alexnet", "vgg11_bn", "resnext50_32x4d", "wide_resnet50_2"]
TIMM = ["resnet26d", "efficientnet_b0", "mixer_b16_224", "deit_tiny_patch16_224", "convnext_atto", "regnety_004",
        "mobilevit_xs", "levit_128s", "poolformer_s12", "resmlp_12_224", "cait_xxs24_224", "coat_lite_tiny"]


def build(source: str, name: str) -> torch.nn.Module:
    if source == "torchvision":
        import torchvision
        return torchvision.models.get_model(name, weights=None)
    import timm
    return timm.create_model(name, pretrained=False)


def check(source: str, name: str, batch: int) -> str:
    import jit2triton
    torch.manual_seed(0)
    model = build(source, name).eval().cuda()
    size = 299 if name == "inception_v3" else 224
    example = torch.randn(batch, 3, size, size, device="cuda")
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model, example, check_trace=False)
    started = time.perf_counter()
    converted = jit2triton.convert(traced, (example,), device="cuda")
    seconds = time.perf_counter() - started
    summary = converted.summary()
    verification = summary["verification"]
    worst = 0.0
    for _ in range(2):
        x = torch.randn_like(example)
        expected, actual = traced(x), converted(x)
        expected = expected if isinstance(expected, torch.Tensor) else expected[0]
        actual = actual if isinstance(actual, torch.Tensor) else actual[0]
        worst = max(worst, ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-6)).item())
    status = "PASS" if worst < 1e-3 and not verification["kernels_removed"] else "FAIL"
    return (f"{status} {source}/{name}: convert {seconds:.1f}s (verify {verification['seconds']:.2f}s), "
            f"{len(summary['kernels'])} kernels, {summary['fallback_nodes']} fallback, "
            f"removed {[k['kernel'] for k in verification['kernels_removed']]}, max rel. error {worst:.2e}")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="")
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    wanted = [("torchvision", n) for n in TORCHVISION] + [("timm", n) for n in TIMM]
    if args.models:
        names = set(args.models.split(","))
        wanted = [(s, n) for s, n in wanted if n in names]
    if args.limit:
        wanted = wanted[:args.limit]
    lines, passed = [], 0
    for source, name in wanted:
        try:
            line = check(source, name, args.batch)
        except Exception as err:
            line = f"FAIL {source}/{name}: {type(err).__name__}: {str(err)[:300]}"
            traceback.print_exc()
        passed += line.startswith("PASS")
        lines.append(line)
        print(line, flush=True)
        torch.cuda.empty_cache()
    total = f"{passed} of {len(wanted)} models pass"
    print(total, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write("\n".join(lines + [total]) + "\n")
    return 0 if passed == len(wanted) else 1


if __name__ == "__main__":
    sys.exit(main())
