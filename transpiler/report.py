"""The conversion report: what runs where, counted honestly, for `summary()` and `report()`."""
from __future__ import annotations

from collections import Counter
from typing import Any, Optional

from .op_table import EXTERN, FALLBACK, HOST, VIEW

NO_BACKEND = "no generated kernel for it yet: runs through ATen"
ALIAS = "alias"  # a view kept as an ATen alias because its consumer is an extern op: cheaper than a copy
NOT_IN_TABLE = "not in the op table: runs through ATen by its schema"
NO_LAUNCH = (HOST, VIEW, ALIAS)  # node categories that launch no device work


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
            # ops jit2triton added (an index check before a gather, a layout change) are listed apart: a kernel of
            # such ops only counts no TorchScript node, and its name, taken from its ops, is not the model's
            kernels.append({"name": entry["kernel"], "nodes": len(fused), "ops": [f["op"] for f in fused],
                            "added_ops": [f["op"] for f in entry["fused"] if f.get("synthetic")]})
        elif category in (HOST, EXTERN, ALIAS):
            counts[category] += len(entry.get("from_ops", [None]))  # a linear with its activation: two nodes
        else:
            counts["fallback"] += 1
            counts["unreached"] += bool(entry.get("unreached"))
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
        # of those, the nodes in branches conversion never saw run, on the example or its other draws (code for other
        # inputs: types, sizes, modes), which run through ATen if a call takes them; a call meets the rest
        "unreached_fallback_nodes": counts["unreached"],
        "fallback_ops": dict(fallback_ops.most_common()),
        "fallback_reasons": reasons,
        "kernels": kernels,
        "launches": launches(node_table),
    }


def launches(node_table: list[dict[str, Any]]) -> dict[str, int]:
    """The plan's steps that launch device work (a generated kernel, an ATen op: one or more of its kernels), a loop's
    body counted once; and, where the model repeats a layer (a transformer's), how many times and how many of those
    launches one layer makes: the steps made from the same source lines, repeated the most common number of times."""
    repeats: Counter = Counter()
    for entry in node_table:
        if entry["category"] in NO_LAUNCH:
            continue
        fused = entry.get("fused")
        repeats[tuple((f["op"], f["source"]) for f in fused) if fused else ((entry["op"], entry["source"]),)] += 1
    found = {"per_call": sum(repeats.values())}
    with_sources = {key: n for key, n in repeats.items() if n > 1 and all(source for _, source in key)}
    layers = Counter(with_sources.values()).most_common()
    if layers and layers[0][1] > 1:  # (two or more step kinds repeated alike: a layer, not one op in a loop)
        count = max(n for n, kinds in layers if kinds == layers[0][1])
        found.update(layers=count, per_layer=sum(n for n in with_sources.values() if n == count) // count)
    return found


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
        f"{summary['fallback_nodes']} fallback through ATen" + (
            f" ({summary['unreached_fallback_nodes']} of them in branches conversion never saw run)"
            if summary.get("unreached_fallback_nodes") else ""),
    ]
    lines += [f"  kernel {kernel['name']}: {_kernel_line(kernel)}" for kernel in summary["kernels"]]
    lines += _format_launches(summary.get("launches"))
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
    lines += _format_choices(summary.get("timed_choices", []))
    lines += _format_verification(summary.get("verification"))
    lines += _format_precision(summary.get("precision"))
    lines += _format_pass_seconds(summary.get("pass_seconds"))
    return "\n".join(lines)


def _format_launches(launches: Optional[dict[str, int]]) -> list[str]:
    if not launches:
        return []
    line = f"launches per call: {launches['per_call']} (kernels and ATen calls, a loop's body once)"
    if "layers" in launches:
        line += f"; {launches['layers']} repeated layers, {launches['per_layer']} launches each"
    return [line]


def _format_precision(precision: Optional[dict[str, Any]]) -> list[str]:
    """The reduced precision: each output's measured error, the float32 nodes by rule (counted) and those accuracy
    moved back (each with its source line)."""
    if not precision:
        return []
    accuracy = precision["accuracy"]
    lines = [f"precision {precision['dtype']}, held to rtol {accuracy['rtol']:g}, atol {accuracy['atol']:g} against "
             "the float32 model:"]
    for out in precision["outputs"]:
        top1 = f", top-1 agreement {out['top1_agreement']:.1%}" if "top1_agreement" in out else ""
        lines.append(f"  {out['output']}: max abs error {out['max_abs']:.3g}, relative {out['max_rel']:.3g}{top1}")
    by_rule = Counter((n["op"], n["why"].removeprefix("rule: ")) for n in precision["fp32_nodes"]
                      if n["why"].startswith("rule: "))
    if by_rule:
        lines.append("float32 by rule: " + ", ".join(f"{op} x{n} ({why})" for (op, why), n in by_rule.items()))
    lines += [f"float32 for accuracy: {n['op']} at {n['source'] or 'an unknown line'}: {n['why']}"
              for n in precision["fp32_nodes"] if not n["why"].startswith("rule: ")]
    return lines


def _format_choices(choices: list[dict[str, Any]]) -> list[str]:
    """Each choice once, with how many times it came up (a layer's GEMMs, once per layer)."""
    if not choices:
        return []
    counted = Counter(_choice_line(c) for c in choices)
    fixed = all(c["fixed"] and not c.get("busy") for c in choices)
    head = ("choices fixed (choices='fixed': nothing timed):" if fixed else
            "timed choices (median per call; another replaces the model's own where it takes at most the margin "
            "of its time):")
    return [head] + [f"  {line}" + (f" x{n}" if n > 1 else "") for line, n in counted.items()]


def _choice_line(choice: dict[str, Any]) -> str:
    if choice.get("busy"):  # no time kept: the timing was not steady (transpiler/timing.py)
        share = f", on a core {choice['cpu_share']:.0%} of a call" if choice.get("cpu_share") is not None else ""
        return f"{choice['what']}: {choice['chosen']} (machine busy: spread {choice['spread']:.0%}{share}, fixed choice " \
               "taken)"
    if choice["fixed"]:
        return f"{choice['what']}: {choice['chosen']}"
    times = ", ".join(f"{label} {us:.1f} us" for label, us in choice["times_us"].items()) or "not timed"
    noise = (f"; machine busy: spread {choice['spread']:.0%}, its median under the model's own fastest call"
             if choice.get("through_noise") else "")
    return f"{choice['what']}: {times} -> {choice['chosen']} (margin {choice['margin']:.2f}{noise})"


def _kernel_line(kernel: dict[str, Any]) -> str:
    """`3 nodes (aten::relu, ...)`, then the ops jit2triton added to it, or only those where it fused no node."""
    added = kernel.get("added_ops", [])
    model = (f"{_count(kernel['nodes'], 'TorchScript node')} ({', '.join(kernel['ops'])})" if kernel["nodes"] else
             "no TorchScript node")
    if not added:
        return model
    return f"{model}{' +' if kernel['nodes'] else ';'} {_count(len(added), 'op')} jit2triton added ({', '.join(added)})"


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _format_pass_seconds(seconds: Any) -> list[str]:
    """Where converting took its time: the total, and the stages that took a tenth of it or more."""
    if not seconds:
        return []
    total = sum(seconds.values())
    slow = sorted(((s, name) for name, s in seconds.items() if s >= 0.1 * total), reverse=True)
    return [f"conversion took {total:.1f}s, most in: " + ", ".join(f"{name} {s:.1f}s" for s, name in slow)]


def _format_verification(verification: Any) -> list[str]:
    if not verification:
        return []
    status = verification["status"]
    runtime = verification.get("runtime")
    where = f" in the {runtime} runtime" if runtime else ""  # (the runtime load() runs it in)
    if status == "passed":
        lines = [f"verified against TorchScript on {verification['input_sets']} input sets{where} "
                 f"({verification['seconds']:.2f}s)"]
    else:
        lines = [f"verification: {status}"]
    for kernel in verification["kernels_removed"]:
        what = ("every kernel (no single one was to blame)" if kernel["kernel"] == "*" else
                f"kernel {kernel['kernel']} ({', '.join(kernel['ops'])})")
        lines.append(f"  taken out: {what}, max rel. error {kernel['error']:.3g} against ATen")
    lines += [f"  note: {note}" for note in verification["notes"]]
    return lines
