"""On the GPU machine: the shifted-window mask chain that faulted on an H200 (torchvision swin_v2_t, issue #35) and
what was fixed for it (tests/test_scatter_chains.py says the cause). Each case is made on CUDA as a user makes it
(so `mask[...] = count` traces `count` as a CPU tensor, as it did there), converted for CUDA, and compared with
TorchScript on fresh inputs. Each case runs in its own process: an illegal memory access spoils the CUDA context
for whatever runs after it in the same process. Prints one line per case; exit status 0 when all pass. Not
collected by pytest (torchvision installs only on the GPU machine; the case is skipped without it).

    python tests/gpu_swin_mask.py [--cases mask_traced,...] [--device cpu]   (cpu: a dry run of the same checks)
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import traceback
import warnings

import torch

DEVICE = "cuda"


def _quiet(make):
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        return make()


def _made(module: torch.nn.Module, draw, how: str):
    module = module.eval().to(DEVICE)
    if how == "scripted":
        return _quiet(lambda: torch.jit.script(module)), draw
    return _quiet(lambda: torch.jit.trace(module, draw(), check_trace=False)), draw


def mask(how: str):
    from fallback_models import ShiftedWindowMask
    return _made(ShiftedWindowMask(), lambda: (torch.randn(64, 64, device=DEVICE),), how)


def region_read_back():
    from fallback_models import region_read_back as fn
    return torch.jit.script(fn), lambda: (torch.randn(64, 64, device=DEVICE), torch.randn(4, 56, device=DEVICE))


def swin_structure(how: str):
    from fallback_models import SwinV2
    torch.manual_seed(0)
    return _made(SwinV2(), lambda: (torch.randn(2, 3, 32, 32, device=DEVICE),), how)


def swin_v2_t():
    import torchvision
    model = torchvision.models.get_model("swin_v2_t", weights=None)
    return _made(model, lambda: (torch.randn(2, 3, 256, 256, device=DEVICE),), "traced")


CASES = {
    "mask_traced": lambda: mask("traced"),
    "mask_scripted": lambda: mask("scripted"),
    "region_read_back": region_read_back,
    "swin_structure_traced": lambda: swin_structure("traced"),
    "swin_structure_scripted": lambda: swin_structure("scripted"),
    "swin_v2_t": swin_v2_t,
}


def worst_error(actual, expected) -> float:
    e, a = expected.double().cpu(), actual.double().cpu()
    return float((a - e).abs().max() / e.abs().max().clamp_min(1e-6))


def run_case(name: str) -> str:
    import jit2triton
    try:
        model, draw = CASES[name]()
    except ImportError as err:
        return f"SKIP {name}: {err}"
    started = time.perf_counter()
    converted = _quiet(lambda: jit2triton.convert(model, draw(), device=DEVICE))
    convert_s = time.perf_counter() - started
    worst = 0.0
    for _ in range(2):
        inputs = draw()
        expected = _quiet(lambda: model(*inputs))
        worst = max(worst, worst_error(converted(*inputs), expected))
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    summary = converted.summary()
    removed = [k["kernel"] for k in summary["verification"]["kernels_removed"]]
    ok = worst < 1e-3 and not removed
    ops = ", ".join(f"{op} x{n}" for op, n in summary["fallback_ops"].items()) or "none"
    return (f"{'PASS' if ok else 'FAIL'} {name}: {summary['fallback_nodes']} fallback [{ops}], "
            f"{len(summary['kernels'])} kernels, removed {removed}, max rel. error {worst:.2e}, "
            f"convert {convert_s:.1f}s")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--case", help=argparse.SUPPRESS)  # one case, in this process (what each child runs)
    parser.add_argument("--limit-s", type=int, default=300, help="give up on a case after this many seconds")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    if args.case:
        try:
            print(run_case(args.case), flush=True)
        except Exception as err:  # noqa: BLE001 - reported as this case's line
            tail = " | ".join(traceback.format_exc().strip().splitlines()[-3:])
            print(f"ERROR {args.case}: {type(err).__name__}: {str(err)[:300]} [{tail[:400]}]", flush=True)
            return 1
        return 0
    results = []
    for name in [n for n in args.cases.split(",") if n]:
        command = [sys.executable, __file__, "--case", name, "--device", DEVICE]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=args.limit_s, env=os.environ)
            lines = [x for x in done.stdout.splitlines() if x.split(" ", 1)[0] in ("PASS", "FAIL", "ERROR", "SKIP")]
            result = lines[-1] if lines else f"ERROR {name}: exit {done.returncode}: {done.stderr.strip()[-400:]}"
        except subprocess.TimeoutExpired:
            result = f"ERROR {name}: over {args.limit_s}s"
        print(result, flush=True)
        results.append(result)
    failed = [r for r in results if not r.startswith(("PASS", "SKIP"))]
    print(f"{len(results) - len(failed)}/{len(results)} passed or skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
