"""The conversion report: what runs where, counted honestly, for `summary()` and `report()`."""
from __future__ import annotations

from collections import Counter
from typing import Any

from .op_table import EXTERN, FALLBACK, HOST

NO_BACKEND = "no generated kernel for it yet: runs through ATen"
ALIAS = "alias"  # a view kept as an ATen alias because its consumer is an extern op: cheaper than a copy
NOT_IN_TABLE = "not in the op table: runs through ATen by its schema"


def summarize(node_table: list[dict[str, Any]]) -> dict[str, Any]:
    counts: Counter = Counter()
    fallback_ops: Counter = Counter()
    reasons: dict[str, str] = {}
    native: set[int] = set()
    kernels = []
    for entry in node_table:
        category = entry["category"]
        if entry.get("synthetic"):  # made by jit2triton (a runtime scalar's 0-d tensor), not by TorchScript
            continue
        if category == "kernel":
            fused = [f for f in entry["fused"] if not f.get("synthetic")]
            native.update(f["uid"] for f in fused)
            # a kernel of jit2triton's nodes only (a convolution's bias add, when no TorchScript op follows it)
            ops = [f["op"] for f in fused] or [f"{f['op']} (added by jit2triton)" for f in entry["fused"]]
            kernels.append({"name": entry["kernel"], "nodes": len(fused), "ops": ops})
        elif category in (HOST, EXTERN, ALIAS):
            counts[category] += len(entry.get("from_ops", [None]))  # a linear with its activation: two nodes
        else:
            counts["fallback"] += 1
            fallback_ops[entry["op"]] += 1
            why = entry.get("why")
            reasons[entry["op"]] = (NOT_IN_TABLE if category == FALLBACK else
                                    f"not lowered: {why}" if why else NO_BACKEND)
    counts["native"] = len(native)
    return {
        "nodes": counts["native"] + counts[EXTERN] + counts[HOST] + counts[ALIAS] + counts["fallback"],
        "native_nodes": counts["native"],
        "extern_nodes": counts[EXTERN],
        "host_nodes": counts[HOST],
        "alias_nodes": counts[ALIAS],
        "fallback_nodes": counts["fallback"],
        "fallback_ops": dict(fallback_ops.most_common()),
        "fallback_reasons": reasons,
        "kernels": kernels,
    }


def packed_summary(plan: dict[str, Any]) -> dict[str, Any]:
    """The packed parameters a plan builds at load (a quantized op's weights) and the quantized engine they are
    packed for; nothing for a plan without them."""
    engines = sorted({entry["engine"] for entry in plan.get("packed", ()) if "engine" in entry})
    if not engines:
        return {}
    count = sum(1 for entry in plan["packed"] if "engine" in entry)
    return {"packed_params": count, "quantized_engine": ", ".join(engines)}


def format_report(summary: dict[str, Any], node_table: list[dict[str, Any]]) -> str:
    lines = [
        f"{summary['nodes']} TorchScript nodes: {summary['native_nodes']} in {len(summary['kernels'])} generated "
        f"kernels, {summary['extern_nodes']} extern (vendor library), {summary['alias_nodes']} ATen views "
        f"(aliases, free), {summary['host_nodes']} host (control flow, scalars, lists), "
        f"{summary['fallback_nodes']} fallback through ATen",
    ]
    for kernel in summary["kernels"]:
        lines.append(f"  kernel {kernel['name']}: {kernel['nodes']} nodes ({', '.join(kernel['ops'])})")
    if summary["fallback_ops"]:
        lines.append("fallback ops:")
        for op, count in summary["fallback_ops"].items():
            lines.append(f"  {count:5d}  {op}  ({summary['fallback_reasons'][op]})")
    externs = Counter(e["op"] + (f" ({'+'.join(e['from_ops'])})" if "from_ops" in e else "")
                      for e in node_table if e["category"] == EXTERN)
    if externs:
        lines.append("extern ops: " + ", ".join(f"{op} x{n}" for op, n in externs.most_common()))
    if summary.get("packed_params"):
        lines.append(f"packed parameters: {summary['packed_params']}, stored as their integers, scales and zero "
                     f"points and packed at load for the {summary['quantized_engine']} quantized engine")
    if summary.get("generation_failed"):
        lines.append(summary["generation_failed"])
    for name, d in summary.get("dynamic_dims", {}).items():
        lines.append(f"dynamic dim {name}: {d['min']}..{d['max'] if d['max'] is not None else 'inf'} "
                     f"(converted at {d['example']})")
    for name, why in summary.get("static_dims", {}).items():
        lines.append(f"dim {name} kept static (dynamic_shapes='auto'): {why}")
    lines += _format_verification(summary.get("verification"))
    return "\n".join(lines)


def _format_verification(verification: Any) -> list[str]:
    if not verification:
        return []
    status = verification["status"]
    if status == "passed":
        lines = [f"verified against TorchScript on {verification['input_sets']} input sets "
                 f"({verification['seconds']:.2f}s)"]
    else:
        lines = [f"verification: {status}"]
    for kernel in verification["kernels_removed"]:
        what = ("every kernel (no single one was to blame)" if kernel["kernel"] == "*" else
                f"kernel {kernel['kernel']} ({', '.join(kernel['ops'])})")
        lines.append(f"  taken out: {what}, max rel. error {kernel['error']:.3g} against ATen")
    lines += [f"  note: {note}" for note in verification["notes"]]
    return lines
