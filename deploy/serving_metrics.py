"""A served package's Prometheus metrics: requests, latency, queue time, model time and batch sizes, recorded with
Ray's metrics API (so they join Ray Serve's own in Ray's Prometheus export, summed over replicas, with a "ray_"
prefix), and answered on GET /metrics from the export of the node that answers.

Ray exports what replicas record every `metrics_report_interval_ms` (10 s by default; `start_local` sets 1 s).
On a cluster of several nodes, scrape each node's Ray metrics export as Ray's documentation says: /metrics shows the
replicas of one node.
"""
from __future__ import annotations

import urllib.request
from typing import Optional

SECONDS = [0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10]
ROWS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]
EXPORTED_PREFIXES = ("ray_jit2triton_", "ray_serve_")  # ours, and Ray Serve's own (per deployment and replica)


class ServingMetrics:
    """A replica's metrics, tagged with the model's name."""

    def __init__(self, model: str) -> None:
        from ray.util import metrics

        def tagged(metric):
            metric.set_default_tags({"model": model})
            return metric

        self.requests = tagged(metrics.Counter(
            "jit2triton_requests_total", "Requests answered, by protocol (v2, json, handle) and HTTP status",
            tag_keys=("model", "protocol", "code")))
        self.latency = tagged(metrics.Histogram(
            "jit2triton_request_seconds", "Seconds from a request's arrival to its answer (queue and model)",
            boundaries=SECONDS, tag_keys=("model", "protocol")))
        self.queue = tagged(metrics.Histogram(
            "jit2triton_queue_seconds", "Seconds a validated request waited for its model call to start",
            boundaries=SECONDS, tag_keys=("model",)))
        self.model = tagged(metrics.Histogram(
            "jit2triton_model_seconds", "Seconds of one model call (a batch)", boundaries=SECONDS,
            tag_keys=("model",)))
        self.batch_rows = tagged(metrics.Histogram(
            "jit2triton_batch_rows", "Rows of the batch dim in one model call", boundaries=ROWS, tag_keys=("model",)))
        self.batch_requests = tagged(metrics.Histogram(
            "jit2triton_batch_requests", "Requests sharing one model call", boundaries=ROWS, tag_keys=("model",)))

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
    """The lines of metric families named with EXPORTED_PREFIXES, their # HELP and # TYPE lines included."""
    kept = []
    for line in text.splitlines():
        name = line.split(" ", 3)[2] if line.startswith("# ") and line.count(" ") >= 2 else line
        if name.startswith(EXPORTED_PREFIXES):
            kept.append(line)
    return "\n".join(kept) + "\n"
