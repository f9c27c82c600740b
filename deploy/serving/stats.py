"""The KServe v2 statistics extension for a served model, in the Triton Inference Server's schema (what
`tritonclient`'s get_inference_statistics() reads): counts and nanoseconds kept exactly, per request and per batch
size. Plain code, tested without Ray; `StatisticsBoard` (a Ray actor) sums the replicas of a model, each replica's
`Publisher` keeping its counts there.

Per request (inference_stats): success and fail (arrival to answer; a refused body is a failure), queue (validated
to its model call's start), compute_input (reading and checking the body), compute_infer (its model call, the whole
batch's time, as Triton counts it), compute_output (writing the answer). Per batch size in rows (batch_stats): the
model calls of that size, with compute_input (joining the requests' rows), compute_infer (the model) and
compute_output (splitting the outputs back per request). inference_count counts rows answered, execution_count
model calls.
"""
from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

log = logging.getLogger("jit2triton.serving")
PUBLISH_EVERY_S = 0.5  # how stale a statistics request may find the counts of a model's other replicas
REQUEST_KINDS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output", "cache_hit",
                 "cache_miss")
BATCH_KINDS = ("compute_input", "compute_infer", "compute_output")


def _durations(kinds: tuple) -> dict:
    return {kind: {"count": 0, "ns": 0} for kind in kinds}


class ModelStatistics:
    """One replica's counts for one model, since it was loaded."""

    def __init__(self) -> None:
        self.requests = _durations(REQUEST_KINDS)
        self.batches: dict[int, dict] = {}
        self.inference_count = self.execution_count = self.last_inference = 0
        self.changes = 0  # bumped on every record: a replica publishes only when it changed

    def request(self, ok: bool, total_ns: int, input_ns: int = 0, output_ns: int = 0) -> None:
        self._add(self.requests, "success" if ok else "fail", total_ns)
        if input_ns:
            self._add(self.requests, "compute_input", input_ns)
        if ok:
            self._add(self.requests, "compute_output", output_ns)
        self.last_inference = time.time_ns() // 1_000_000
        self.changes += 1

    def call(self, queued_ns: list[int], rows: int, input_ns: int, infer_ns: int, output_ns: int) -> None:
        """A model call that answered len(queued_ns) requests with `rows` rows."""
        for wait in queued_ns:
            self._add(self.requests, "queue", wait)
            self._add(self.requests, "compute_infer", infer_ns)
        sizes = self.batches.setdefault(rows, _durations(BATCH_KINDS))
        for kind, ns in zip(BATCH_KINDS, (input_ns, infer_ns, output_ns)):
            self._add(sizes, kind, ns)
        self.inference_count += rows
        self.execution_count += 1
        self.changes += 1

    @staticmethod
    def _add(table: dict, kind: str, ns: int) -> None:
        table[kind]["count"] += 1
        table[kind]["ns"] += max(int(ns), 0)

    def snapshot(self) -> dict:
        return {"inference_count": self.inference_count, "execution_count": self.execution_count,
                "last_inference": self.last_inference, "inference_stats": self.requests,
                "batch_stats": {str(rows): kinds for rows, kinds in self.batches.items()}}


def merged(snapshots: list[dict]) -> dict:
    """The replicas' snapshots of one model as one: counts and nanoseconds summed, the last inference the latest."""
    total = ModelStatistics().snapshot()
    for snap in snapshots:
        total["inference_count"] += snap["inference_count"]
        total["execution_count"] += snap["execution_count"]
        total["last_inference"] = max(total["last_inference"], snap["last_inference"])
        _sum_into(total["inference_stats"], snap["inference_stats"])
        for rows, kinds in snap["batch_stats"].items():
            _sum_into(total["batch_stats"].setdefault(rows, _durations(BATCH_KINDS)), kinds)
    return total


def _sum_into(into: dict, more: dict) -> None:
    for kind, duration in more.items():
        into.setdefault(kind, {"count": 0, "ns": 0})
        into[kind]["count"] += duration["count"]
        into[kind]["ns"] += duration["ns"]


def as_triton(name: str, version: str, snap: dict) -> dict:
    """One entry of "model_stats", as Triton writes it."""
    return {"name": name, "version": version, "last_inference": snap["last_inference"],
            "inference_count": snap["inference_count"], "execution_count": snap["execution_count"],
            "inference_stats": snap["inference_stats"],
            "batch_stats": [{"batch_size": int(rows), **kinds}
                            for rows, kinds in sorted(snap["batch_stats"].items(), key=lambda item: int(item[0]))],
            "memory_usage": []}


class StatisticsBoard:
    """A Ray actor holding each replica's latest snapshot of each model (replicas publish theirs as they change),
    so a statistics request answered by any replica counts them all. A replica that died keeps its counts: they are
    the model's since it was loaded; unloading a model forgets them."""

    def __init__(self) -> None:
        self.snapshots: dict[str, dict[str, dict]] = {}

    def publish(self, model: str, replica: str, snapshot: dict) -> None:
        self.snapshots.setdefault(model, {})[replica] = snapshot

    def read(self, models: list[str]) -> dict[str, dict]:
        return {m: merged(list(self.snapshots.get(m, {}).values())) for m in models}

    def forget(self, model: str) -> None:
        self.snapshots.pop(model, None)


BOARD_NAME, BOARD_NAMESPACE = "jit2triton_statistics", "jit2triton"


def board() -> Any:
    """The cluster's statistics board, started by the first replica that asks for it."""
    import ray

    actor = ray.remote(num_cpus=0)(StatisticsBoard)
    return actor.options(name=BOARD_NAME, namespace=BOARD_NAMESPACE, get_if_exists=True,
                         lifetime="detached").remote()


class Publisher:
    """A replica's statistics of one model on the board: published every PUBLISH_EVERY_S while they change, and
    before each read, so a read answered by this replica has every request it answered."""

    def __init__(self, model: str, replica: str, statistics: ModelStatistics) -> None:
        self.model, self.replica, self.statistics = model, replica, statistics
        self.published, self.board, self.task = 0, None, None

    def changed(self) -> None:
        if self.task is None:  # started with the first request: the event loop is Serve's, running here
            self.task = asyncio.get_running_loop().create_task(self._every(PUBLISH_EVERY_S))

    async def _every(self, seconds: float) -> None:
        while True:
            await asyncio.sleep(seconds)
            await self.publish()

    async def publish(self) -> bool:
        """Publishes what changed since last time; False: the board did not answer."""
        changes = self.statistics.changes
        try:
            if self.board is None:
                self.board = board()
            if changes != self.published:
                await self.board.publish.remote(self.model, self.replica, self.statistics.snapshot())
        except Exception as err:  # noqa: BLE001 — statistics of this replica alone are still an answer
            log.warning("jit2triton serving: the statistics board did not answer (%s)", err)
            self.board = None
            return False
        self.published = changes
        return True

    async def read(self) -> dict:
        """The model's snapshot summed over its replicas; this replica's alone where the board does not answer."""
        if await self.publish():
            try:
                return (await self.board.read.remote([self.model]))[self.model]
            except Exception as err:  # noqa: BLE001
                log.warning("jit2triton serving: the statistics board did not answer (%s)", err)
        return self.statistics.snapshot()
