"""A served package's Prometheus metrics: requests, latency, queue time, model time and batch sizes, recorded with
Ray's metrics API (so they join Ray Serve's own in Ray's Prometheus export, summed over replicas, with a "ray_"
prefix), and answered on GET /metrics from the export of the node that answers.

A histogram's _sum and _count are exact: Ray's export rebuilds a histogram's sum from its bucket counts (each
observation as its bucket's midpoint: seven one-row calls summed to 3.5 rows), so each histogram is paired with two
counters of its own, and /metrics shows their values as the histogram's _sum and _count.

Ray exports what replicas record every `metrics_report_interval_ms` (10 s by default; `start_local` sets 1 s).
On a cluster of several nodes, scrape each node's Ray metrics export as Ray's documentation says: /metrics shows the
replicas of one node.
"""
from __future__ import annotations

import re
import urllib.request
from typing import Optional

SECONDS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10]
ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
EXPORTED_PREFIXES = ("ray_jit2triton_", "ray_serve_")  # ours, and Ray Serve's own (per deployment and replica)


EXACT_SUM, EXACT_COUNT = "_exact_sum", "_exact_count"  # the paired counters' suffixes, renamed in /metrics
EXPORTED_SUM, EXPORTED_COUNT = EXACT_SUM + "_total", EXACT_COUNT + "_total"  # as Ray exports a counter


class ExactHistogram:
    """A Ray histogram for the buckets, with its sum and count kept exactly by two counters."""

    def __init__(self, metrics, tagged, name: str, description: str, boundaries: list, tag_keys: tuple) -> None:
        self.buckets = tagged(metrics.Histogram(name, description, boundaries=boundaries, tag_keys=tag_keys))
        self.sum = tagged(metrics.Counter(name + EXACT_SUM, f"{name}'s exact sum", tag_keys=tag_keys))
        self.count = tagged(metrics.Counter(name + EXACT_COUNT, f"{name}'s exact count", tag_keys=tag_keys))

    def observe(self, value: float, tags: Optional[dict] = None) -> None:
        self.buckets.observe(value, tags=tags)
        self.sum.inc(value, tags=tags)
        self.count.inc(1, tags=tags)


class ServingMetrics:
    """A replica's metrics, tagged with the model's name."""

    def __init__(self, model: str) -> None:
        from ray.util import metrics

        def tagged(metric):
            metric.set_default_tags({"model": model})
            return metric

        def histogram(name: str, description: str, boundaries: list, tag_keys: tuple) -> ExactHistogram:
            return ExactHistogram(metrics, tagged, name, description, boundaries, tag_keys)

        self.requests = tagged(metrics.Counter(
            "jit2triton_requests_total", "Requests answered, by protocol (v2, json, handle) and HTTP status",
            tag_keys=("model", "protocol", "code")))
        self.latency = histogram("jit2triton_request_seconds", "Seconds from a request's arrival to its answer "
                                 "(queue and model)", SECONDS, ("model", "protocol"))
        self.queue = histogram("jit2triton_queue_seconds", "Seconds a validated request waited for its model call "
                               "to start", SECONDS, ("model",))
        self.model = histogram("jit2triton_model_seconds", "Seconds of one model call (a batch)", SECONDS,
                               ("model",))
        self.batch_rows = histogram("jit2triton_batch_rows", "Rows of the batch dim in one model call", ROWS,
                                    ("model",))
        self.batch_requests = histogram("jit2triton_batch_requests", "Requests sharing one model call", ROWS,
                                        ("model",))

    def answered(self, protocol: str, code: int, seconds: float) -> None:
        self.requests.inc(1, tags={"protocol": protocol, "code": str(code)})
        self.latency.observe(seconds, tags={"protocol": protocol})

    def called(self, queued: list[float], rows: int, seconds: float) -> None:
        for wait in queued:
            self.queue.observe(wait)
        self.model.observe(seconds)
        self.batch_rows.observe(rows)
        self.batch_requests.observe(len(queued))


class NodeExport:
    """The Prometheus text of this node's Ray metrics export, kept to the metric families of serving."""

    def __init__(self) -> None:
        self.url: Optional[str] = None

    def text(self) -> str:
        if self.url is None:
            self.url = _export_url()
        with urllib.request.urlopen(self.url, timeout=10) as response:
            return serving_families(response.read().decode())


def _export_url() -> str:
    import ray

    node_id = ray.get_runtime_context().get_node_id()
    node = next(n for n in ray.nodes() if n["NodeID"] == node_id)
    return f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"


def serving_families(text: str) -> str:
    """The lines of metric families named with EXPORTED_PREFIXES, their # HELP and # TYPE lines included; a
    histogram's _sum and _count lines replaced by its exact counters' (renamed, in the histogram's family)."""
    families: dict[str, list[str]] = {}
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith("# ") and line.count(" ") >= 2 else re.split(r"[{ ]", line)[0]
        if name.startswith(EXPORTED_PREFIXES):
            families.setdefault(_family(name), []).append(line)
    kept = []
    for family, lines in families.items():
        if family.endswith((EXPORTED_SUM, EXPORTED_COUNT)):
            continue
        exact = [line for suffix in (EXPORTED_SUM, EXPORTED_COUNT) for line in families.get(family + suffix, ())
                 if not line.startswith("#")]
        if exact:
            lines = [line for line in lines if not line.startswith((family + "_sum", family + "_count"))]
            lines += [line.replace(EXPORTED_SUM, "_sum", 1).replace(EXPORTED_COUNT, "_count", 1) for line in exact]
        kept += lines
    return "\n".join(kept) + "\n"


def _family(name: str) -> str:
    """The family a sample belongs to: a histogram's _bucket, _sum and _count lines belong to its name."""
    if name.endswith((EXPORTED_SUM, EXPORTED_COUNT)):
        return name
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name
