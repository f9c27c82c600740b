"""Reduced-precision packages: which precision, the accuracy it must meet, enforcing it, and measuring it.

A float32 model converted with `precision="fp16"` or `"bf16"` computes in that type but where the op table keeps
float32 (transpiler/precision.py). Its accuracy is then measured against the float32 TorchScript model on the
verification inputs (the example and fresh draws); while it misses `accuracy` (rtol, atol: an output's largest
error may be at most atol + rtol times its largest magnitude), the search in transpiler/precision_search.py moves
nodes back to float32, one at a time, each run through ATen alone (no kernels to build). The report names every
node that stayed float32 and why, by source line.
"""
from __future__ import annotations

import math
import time
import warnings
from typing import Any, Callable, Optional

import torch

from jit2triton.transpiler.precision import PRECISIONS, PrecisionPlan, cast_floats
from jit2triton.transpiler.precision_search import keep_float32_until_accurate
from jit2triton.transpiler.build_plan import build_plan

from .errors import ConversionError
from .verify import Verifier, compare

# What a reduced package must meet against the float32 model by default, as (relative to an output's largest
# magnitude, absolute): float16 keeps 11 bits, bfloat16 8, and a deep model's rounding adds up over its layers
DEFAULT_ACCURACY = {"float16": {"rtol": 1e-2, "atol": 1e-3}, "bfloat16": {"rtol": 5e-2, "atol": 1e-2}}
# The CPU features that make a reduced type fast in ATen's and oneDNN's CPU kernels (/proc/cpuinfo flags)
CPU_FEATURES = {"bfloat16": ("avx512_bf16", "amx_bf16"), "float16": ("avx512_fp16", "amx_fp16")}

_ALIASES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32", "float16": "fp16",
            "bfloat16": "bf16", "float32": "fp32"}
PrepareAten = Callable[[PrecisionPlan], tuple[Any, Any]]  # plan -> (graph, context), every op through ATen


class PrecisionWarning(UserWarning):
    """A reduced precision that this machine runs by emulation: correct, but slower than float32."""


class SlowerPrecisionWarning(UserWarning):
    """A reduced-precision package measured slower than its float32 model on this CPU (the times are in it)."""


def plan_for(precision: Optional[str], accuracy: Optional[dict], io_precision: Optional[str], target: torch.device,
             say: Callable[[str], None]) -> tuple[Optional[PrecisionPlan], Optional[tuple[float, float]]]:
    """(the precision plan, the (rtol, atol) to meet) for `precision`; (None, None) for the model's own.
    `io_precision`: None or "model" (inputs and outputs keep the model's dtypes), or `precision` itself. Each may be
    named as torch names it too (torch.float16, "float16")."""
    precision, io_precision = _alias(precision), _alias(io_precision)
    if precision is None or precision == "fp32":
        if accuracy is not None or io_precision not in (None, "model"):
            raise ConversionError(f"{'accuracy=' if accuracy is not None else 'io_precision='} applies to a "
                                  "reduced-precision package: pass precision='fp16' or 'bf16' with it")
        return None, None
    if io_precision not in (None, "model", precision):
        raise ConversionError(f"io_precision={io_precision!r}: inputs and outputs either keep the model's dtypes "
                              f"('model', the default) or take the package's precision ({precision!r})")
    if not isinstance(precision, str) or precision not in PRECISIONS:
        raise ConversionError(f"precision={precision!r} is not known; choose one of {', '.join(PRECISIONS)}")
    dtype = PRECISIONS[precision]
    if target.type == "cpu" and not cpu_supports(dtype):
        message = (f"precision={precision!r} on a CPU without {' or '.join(CPU_FEATURES[dtype])}: ATen and the "
                   f"generated kernels emulate {dtype} there (converting every value to float32 and back), so "
                   "the package is correct but slower than the float32 one; convert with precision='fp32' (CLI: "
                   "--precision fp32) for speed")
        warnings.warn(message, PrecisionWarning, stacklevel=5)  # (the caller of jit2triton.convert)
        say(message)
    return PrecisionPlan(dtype, io_reduced=io_precision == precision), _tolerance(dtype, accuracy)


def _alias(name):
    return _ALIASES.get(name, name) if isinstance(name, (str, torch.dtype)) else name


def package_inputs(plan: Optional[PrecisionPlan], inputs: list) -> list:
    """The example inputs as the package takes them: in the reduced type where its inputs are."""
    return cast_floats(list(inputs), "float32", plan.dtype) if plan is not None and plan.io_reduced else inputs


def reference(plan: Optional[PrecisionPlan], function: Callable) -> Callable:
    """The float32 model as verification calls it: with reduced inputs and outputs, it takes the package's inputs
    upcast and gives its outputs rounded to the reduced type (what the package's outputs are compared with)."""
    if plan is None or not plan.io_reduced:
        return function

    def run(*inputs):
        return cast_floats(function(*cast_floats(inputs, plan.dtype, "float32")), "float32", plan.dtype)
    return run


def _tolerance(dtype: str, accuracy: Optional[dict]) -> tuple[float, float]:
    given = dict(accuracy or {})
    unknown = set(given) - {"rtol", "atol"}
    if unknown:
        raise ConversionError(f"accuracy takes 'rtol' and 'atol', not {', '.join(sorted(map(str, unknown)))}")
    merged = {**DEFAULT_ACCURACY[dtype], **given}
    for key, value in merged.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not 0 <= value < math.inf:
            raise ConversionError(f"accuracy[{key!r}] must be a non-negative number, got {value!r}")
    return float(merged["rtol"]), float(merged["atol"])


def cpu_supports(dtype: str) -> bool:
    """Whether this CPU has the instructions that run `dtype` natively (Linux: its /proc/cpuinfo flags)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next((line for line in f if line.startswith("flags")), "").split())
    except OSError:
        return False
    return any(feature in flags for feature in CPU_FEATURES[dtype])


# --- enforcing the accuracy -------------------------------------------------------------------------------------

def enforce(plan: PrecisionPlan, graph, ctx, verifier: Verifier, written: int, prepare_aten: PrepareAten,
            say: Callable[[str], None]) -> bool:
    """Move nodes of `plan` back to float32 until the prepared graph (run through ATen) meets the verifier's
    tolerance against the float32 model (transpiler/precision_search.py); whether any moved (then the caller
    prepares the graph again)."""
    if not verifier.compared or written:
        return False  # (a model that writes its state: the package's verification alone checks it)
    accuracy = f"rtol={verifier.tolerance[0]:g}, atol={verifier.tolerance[1]:g}"
    return keep_float32_until_accurate(plan, _misses(graph, ctx, verifier, written),
                                       lambda trial: _misses(*prepare_aten(trial), verifier, written), accuracy, say)


def _misses(graph, ctx, verifier: Verifier, written: int) -> float:
    """The largest error by which the graph, every op through ATen, misses the tolerance over the verification
    cases (0 when it meets it)."""
    sched = build_plan(graph)
    worst = 0.0
    for _, inputs, expected in verifier.cases:
        with verifier.exact():
            outputs = ctx.run_plan(sched, [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs], None)
        outputs = list(outputs[:len(outputs) - written])  # (the module state it wrote comes after)
        actual = outputs[0] if len(outputs) == 1 else tuple(outputs)
        worst = max([worst] + [m.error for m in compare(actual, expected, slack=verifier.slack,
                                                          tolerance=verifier.tolerance)])
    return worst


# --- measuring it -----------------------------------------------------------------------------------------------

def measure(run: Callable, verifier: Verifier) -> list[dict[str, Any]]:
    """Per floating output of the package: max-abs and relative error (to the output's largest magnitude) against
    the float32 model over the verification cases, and for 2-D logits (a class per row) the share of rows whose
    top-1 class agrees."""
    found: dict[str, dict[str, Any]] = {}
    for _, inputs, expected in verifier.cases:
        with verifier.exact():  # (as the float32 model ran for the cases)
            actual = run(*[x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
        for where, a, e in _leaves(actual, expected, "output"):
            entry = found.setdefault(where, {"output": where, "max_abs": 0.0, "max_rel": 0.0})
            a, e = a.detach().double().cpu(), e.detach().double().cpu()
            finite = torch.isfinite(e)
            if not torch.equal(torch.isfinite(a), finite):  # (verification refuses this; kept JSON-safe)
                entry["non_finite"] = "non-finite values where the float32 model has finite ones, or the reverse"
                continue
            a, e = a[finite], e[finite]
            error = (a - e).abs().max().item() if e.numel() else 0.0
            scale = max(e.abs().max().item(), 1e-30) if e.numel() else 1.0
            entry["max_abs"] = max(entry["max_abs"], error)
            entry["max_rel"] = max(entry["max_rel"], error / scale)
        for where, a, e in _leaves(actual, expected, "output"):
            if e.dim() == 2 and e.shape[-1] >= 2 and e.shape[0]:
                agree = (a.argmax(-1).cpu() == e.argmax(-1).cpu()).double().mean().item()
                found[where]["top1_agreement"] = min(found[where].get("top1_agreement", 1.0), agree)
    _warn_if_slower(run, verifier)
    return [{k: (float(f"{v:.4g}") if isinstance(v, float) else v) for k, v in entry.items()}
            for entry in found.values()]


def _warn_if_slower(run: Callable, verifier: Verifier, budget_s: float = 0.5, rounds: int = 15) -> None:
    """A SlowerPrecisionWarning with the times where the reduced package, on the CPU, takes longer a call than the float32
    TorchScript model it came from: small models can be, even where the CPU has the instructions (a tiny BERT in
    bfloat16 0.405 ms against 0.169 in float32), and then reduced precision buys nothing. The two take turns on the
    example inputs, under inference mode, within `budget_s` (at least 3 rounds); medians are compared."""
    float32_model = getattr(verifier.reference, "function", None)  # TorchScript itself, not its child-process probe
    _, inputs, _ = verifier.cases[0] if verifier.cases else (None, None, None)
    if float32_model is None or inputs is None or any(
            isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in inputs) or hasattr(run, "state"):
        return  # (the GPU has its own units for reduced types; a model with state: calls change what they do)
    paths = {"package": run, "float32": float32_model}
    times: dict[str, list[float]] = {label: [] for label in paths}
    started = time.perf_counter()
    with torch.inference_mode():
        for label, call in paths.items():  # warm: TorchScript's profiling executor optimises on its second call
            call(*inputs), call(*inputs)
        while len(times["package"]) < rounds and (len(times["package"]) < 3 or
                                                  time.perf_counter() - started < budget_s):
            for label, call in paths.items():
                start = time.perf_counter()
                call(*inputs)
                times[label].append(time.perf_counter() - start)
    reduced, full = (sorted(t)[len(t) // 2] * 1e3 for t in (times["package"], times["float32"]))
    if reduced > full:
        warnings.warn(f"on this CPU the reduced-precision package took {reduced:.3f} ms a call and the float32 "
                      f"TorchScript model {full:.3f} ms (medians of {len(times['package'])}, taking turns): reduced "
                      "precision is slower here; convert with precision='fp32' (CLI: --precision fp32) for speed",
                      SlowerPrecisionWarning, stacklevel=2)


def _leaves(actual: Any, expected: Any, where: str):
    """(where, actual, expected) for each floating tensor of the outputs, by the reference's structure."""
    if isinstance(expected, torch.Tensor):
        if isinstance(actual, torch.Tensor) and expected.is_floating_point() and actual.shape == expected.shape:
            yield where, actual, expected
    elif isinstance(expected, (tuple, list)) and isinstance(actual, (tuple, list)):
        for i, (a, e) in enumerate(zip(actual, expected)):
            yield from _leaves(a, e, f"{where}[{i}]")
    elif isinstance(expected, dict) and isinstance(actual, dict):
        for key in expected:
            if key in actual:
                yield from _leaves(actual[key], expected[key], f"{where}[{key!r}]")


def report_section(plan: PrecisionPlan, tolerance: tuple[float, float], outputs: list[dict]) -> dict[str, Any]:
    """The report's `precision`: the type, the accuracy met, each output's measured error, and the float32 nodes."""
    return {"dtype": plan.dtype, "accuracy": {"rtol": tolerance[0], "atol": tolerance[1]}, "outputs": outputs,
            "fp32_nodes": [{k: v for k, v in node.items() if k != "position"} for node in plan.fp32_nodes]}
