"""Serving a package with Ray Serve: replicas that load it once, batch concurrent requests along its batch dim, and
answer HTTP and Python handle calls.

Ray is imported only by what needs it (`ModelServer`, `app`, `start_local`): reading requests, grouping them into
batches and handing outputs back are plain functions, tested without Ray.

HTTP, under the app's route prefix:
- the KServe v2 / Triton Inference Server protocol (v2.py): GET /v2/health/live, /v2/health/ready, /v2,
  /v2/models/NAME[/versions/1], its /ready, /config and /stats (the statistics extension, stats.py), and
  /v2/models/stats; POST /v2/models/NAME[/versions/1]/infer with typed tensors, as JSON or binary data.
- a simple JSON form: POST / {"inputs": {name: tensor, ...} or [tensor, ...] or the only input's tensor,
  "outputs": "list" | "base64"}, where a tensor is a nested list or {"dtype": "float32", "shape": [2, 16], "data":
  base64 of its little-endian bytes}; the answer is {"outputs": ...} in the same structure as the model's (encoded
  the way the inputs came unless "outputs" says otherwise). GET / answers the signature and batching.
- GET /metrics: Prometheus metrics (metrics.py); GET /stats: the answering replica's counters.
A bad body gets 400 with the InputError's message, a body over the limit 413, an unknown path 404.

Served from a model repository (repository.py), each model is an application of its own at
/v2/models/NAME (`mount`), and the repository's server answers the paths above it. The gRPC endpoint
(grpc_endpoint.py) hands a model's calls to its application as the HTTP requests they stand for (`forwarded`).
"""
from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import logging
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Optional, Sequence

import torch

from jit2triton.errors import InputError, Jit2TritonError

from ..signature import format_input, format_type
from ..signing import trusted_key_paths
from . import messages, v2
from .batching import Batching, concat_inputs, plan_batching, plan_chunks, split_rows  # noqa: F401
from .json_form import Request, RequestReader, encode
from .local_ray import is_loopback, ray_serve as _ray_serve
from .stats import ModelStatistics, Publisher, as_triton

DEFAULT_MAX_BODY_BYTES = 64 << 20  # a batch of 32 224x224 RGB images is 25 MB as base64, ~60 MB as JSON lists
log = logging.getLogger("jit2triton.serving")


class BodyTooLarge(Exception):
    """A request body over the replica's limit (answered 413)."""


def request_check(model) -> Callable[[list], list]:
    """The runtime's own check of a call's inputs (the loaded package's `check_inputs`), for each request before it
    joins a batch, its tensors moved to the model's device first, where the check expects them (a GPU model's batch
    is then concatenated there)."""
    check, device = model.module.check_inputs, model.device
    return lambda values: check([v.to(device) if isinstance(v, torch.Tensor) else v for v in values])


def load_for_serving(path: str, runtime: str = "auto", num_threads: Optional[int] = None,
                     trusted_keys: Sequence[str] = ()) -> tuple[Any, dict]:
    """The package loaded as jit2triton.load loads it (runtime_choice.load_runtime, the C++ runtime), and its
    manifest."""
    from ..runtime_choice import load_runtime
    loaded = load_runtime(path, runtime, num_threads=num_threads, trusted_keys=trusted_keys)
    return loaded.runtime, loaded.manifest


@dataclasses.dataclass
class Counts:
    """A replica's counters: how many requests it answered and refused, and the batches it formed."""
    answered: int = 0
    refused: int = 0  # 4xx: bad bodies and inputs
    failed: int = 0  # 5xx: the model raised
    model_calls: int = 0
    rows: int = 0
    batched_requests: int = 0
    largest_call_rows: int = 0
    replica: str = ""

    def called(self, requests: int, rows: int) -> None:
        self.model_calls += 1
        self.batched_requests += requests
        self.rows += rows
        self.largest_call_rows = max(self.largest_call_rows, rows)

    def as_dict(self) -> dict:
        calls = max(self.model_calls, 1)
        return {**dataclasses.asdict(self), "mean_rows_per_call": self.rows / calls,
                "mean_requests_per_call": self.batched_requests / calls}


class ModelServer:
    """One Ray Serve replica: loads the package once, answers HTTP (`__call__`) and handle calls (`predict`),
    batching concurrent requests with Serve's `@serve.batch`. Every request is validated alone before it joins a
    batch, so a bad one is refused without touching the others."""

    def __init__(self, package: str, runtime: str = "auto", max_batch_size: int = 32,
                 batch_wait_timeout_s: float = 0.005, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 num_threads: Optional[int] = None, trusted_keys: Sequence[str] = (),
                 model_name: Optional[str] = None, replicas: Optional[int] = None, mount: str = "",
                 imports: Sequence[str] = ()) -> None:
        serve = _ray_serve()
        from .metrics import NodeExport, ServingMetrics
        _replica_grpc_on_loopback()
        from starlette.responses import Response  # a dependency of Ray Serve

        if num_threads:
            torch.set_num_threads(num_threads)  # ATen's ops too, not only the generated kernels
        for module in imports:  # libraries whose ops the package calls (torchvision::nms), in this replica's process
            importlib.import_module(module)
        self.model, manifest = load_for_serving(package, runtime, num_threads, trusted_keys)
        signature = manifest["signature"]
        self.batching = plan_batching(signature, max_batch_size)
        self.reader = RequestReader(signature, self.batching.dim is not None, request_check(self.model))
        self.max_body_bytes = max_body_bytes
        self._response = Response
        # one model call at a time, off the event loop: requests keep arriving and forming the next batch while the
        # model runs (the C++ runtime releases the GIL), and the module never sees two calls at once
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="jit2triton-model")
        self._batched = serve.batch(**_batch_options(self.batching.max_rows, batch_wait_timeout_s))(self._run_batch)
        context = serve.get_replica_context()
        replica = getattr(context, "replica_id", None) or getattr(context, "replica_tag", "")
        self.counts = Counts(replica=str(getattr(replica, "unique_id", replica)))
        args = ", ".join(f"{d['name']}: {format_input(d)}" for d in signature["inputs"])
        self.info = {"package": os.path.basename(package), "signature": f"({args}) -> "
                     f"{format_type(signature['outputs'])}", "runtime": self.model.name,
                     "device": str(self.model.device), "batch_dim": self.batching.dim,
                     "max_rows_per_call": self.batching.max_rows, "not_batched_because": self.batching.why_not or None}
        self.model_name = model_name or default_model_name(package)
        self.metadata = v2.model_metadata(self.model_name, signature)
        self.config = v2.model_config(self.metadata, self.batching.max_rows if self.batching.dim else 0,
                                      batch_wait_timeout_s, replicas, self.model.device.type)
        self.output_names = [o["name"] for o in self.metadata["outputs"]]
        self.input_names = [d["name"] for d in signature["inputs"]]
        self.metrics, self._export = ServingMetrics(self.model_name), NodeExport()
        self.statistics = ModelStatistics()
        self._publisher = Publisher(self.model_name, self.counts.replica, self.statistics)
        self.mount = mount  # "": paths are read under the app's route; else the app is mounted at this model path

    async def __call__(self, http) -> Any:
        path = self.mount + _path_under_route(http)
        if http.method == "POST" and path in ("", "/"):
            return await self._infer(http, "json")
        infer = MODEL_PATH.fullmatch(path)
        if http.method == "POST" and infer and infer["action"] == "/infer":
            return (self._unknown_model(infer["name"]) or self._unknown_version(infer["version"]) or
                    await self._infer(http, "v2"))
        if http.method in ("GET", "HEAD"):
            return await self._get(path)
        if path in ("", "/") or (infer and infer["action"] == "/infer"):
            return self._json(405, {"error": f"{http.method} is not served here: POST runs the model, GET {ENDPOINTS}"})
        return self._json(404, {"error": f"nothing is served at {http.method} {path}; this server answers {ENDPOINTS}"})

    async def _get(self, path: str) -> Any:
        """The GET endpoints: health, metadata, the signature, counters and metrics; 404 for any other path."""
        path = path.rstrip("/")
        if path in ("/v2/health/live", "/v2/health/ready"):
            return self._response(status_code=200)  # a replica answering is loaded: ready
        if path == "/v2":
            return self._json(200, {"name": "jit2triton", "version": jit2triton_version(),
                                    "extensions": ["binary_tensor_data", "model_configuration", "statistics"]})
        if path == "/v2/models/stats":  # this server's one model (a repository's server answers it for several)
            return self._json(200, {"model_stats": [await self.model_statistics()]})
        model = MODEL_PATH.fullmatch(path)
        if model and model["action"] != "/infer":
            unknown = self._unknown_model(model["name"]) or self._unknown_version(model["version"])
            if unknown:
                return unknown
            if model["action"] == "/ready":
                return self._response(status_code=200)
            if model["action"] == "/stats":
                return self._json(200, {"model_stats": [await self.model_statistics()]})
            return self._json(200, self.config if model["action"] == "/config" else self.metadata)
        if path == "":
            return self._json(200, self.info)
        if path == "/stats":
            return self._json(200, self.stats())
        if path == "/metrics":
            try:
                text = await asyncio.get_running_loop().run_in_executor(None, self._export.text)
            except OSError as err:  # the node's metrics export is not up (yet), or not reachable from here
                return self._json(503, {"error": f"Ray's metrics export of this node did not answer ({err})"})
            return self._response(text, status_code=200, media_type="text/plain; version=0.0.4; charset=utf-8")
        return self._json(404, {"error": f"nothing is served at GET {path}; this server answers {ENDPOINTS}"})

    def _unknown_model(self, name: str) -> Any:
        if name == self.model_name:
            return None
        return self._json(404, {"error": f"unknown model {name!r}; this server serves {self.model_name!r}"})

    def _unknown_version(self, version: Optional[str]) -> Any:
        if version in (None, "1"):
            return None
        return self._json(404, {"error": f"model {self.model_name!r} has no version {version!r}; it has version 1"})

    async def _infer(self, http, protocol: str) -> Any:
        """Runs the model on one request of the simple JSON form or the v2 protocol; every outcome is counted."""
        started = time.perf_counter_ns()
        response, input_ns, output_ns = await self._infer_response(http, protocol)
        seconds = time.perf_counter_ns() - started
        self.metrics.answered(protocol, response.status_code, seconds / 1e9)
        self._record(response.status_code == 200, seconds, input_ns, output_ns)
        return response

    async def _infer_response(self, http, protocol: str) -> tuple[Any, int, int]:
        """The answer, and the nanoseconds spent reading the request and writing the answer."""
        started = time.perf_counter_ns()
        try:
            body = await self._read_body(http)
            if protocol == "v2":
                wanted = v2.read_infer(body, http.headers.get(v2.HEADER_LENGTH), self.reader.inputs,
                                       self.output_names)
                request = self.reader.from_named(wanted.named, "v2")
            else:
                request = self.reader.from_json(body)
        except BodyTooLarge:
            self.counts.refused += 1
            return self._json(413, {"error": f"the body is over this server's limit of {self.max_body_bytes} bytes; "
                                             "send fewer rows per request (or raise max_body_bytes)"}), 0, 0
        except InputError as err:
            self.counts.refused += 1
            return self._json(400, {"error": messages.refused(str(err))}), 0, 0
        input_ns = time.perf_counter_ns() - started
        try:
            outputs = await self._answer(request)
            writing = time.perf_counter_ns()
            if protocol == "v2":
                body, headers = v2.write_infer(self.model_name, wanted, outputs)
                response = self._response(body, status_code=200, headers=headers)
            else:
                response = self._json(200, {"outputs": encode(outputs, request.reply)})
            return response, input_ns, time.perf_counter_ns() - writing
        except Jit2TritonError as err:
            log.warning("jit2triton serving: the model failed on a request: %s", err)  # the operator's full message
            return self._json(500, {"error": messages.failed(str(err), self.input_names)}), input_ns, 0
        except Exception as err:  # noqa: BLE001 — a client gets a message, the replica's log the traceback
            log.exception("jit2triton serving: a model call failed")
            return self._json(500, {"error": f"internal error ({type(err).__name__}); the replica's log has it"}), \
                input_ns, 0

    async def predict(self, *inputs: Any, **named: Any) -> Any:
        """The Python handle: `handle.predict.remote(x)` returns what the loaded module returns, on the CPU."""
        started = time.perf_counter_ns()
        try:
            request = self.reader.from_values(inputs, named)
        except InputError:
            self.counts.refused += 1
            self._handled(400, started)
            raise
        try:
            outputs = await self._answer(request)
        except Exception:
            self._handled(500, started)
            raise
        self._handled(200, started)
        return map_tensors(_owned, outputs)

    def _handled(self, code: int, started_ns: int) -> None:
        seconds = time.perf_counter_ns() - started_ns
        self.metrics.answered("handle", code, seconds / 1e9)
        self._record(code == 200, seconds)

    def _record(self, ok: bool, total_ns: int, input_ns: int = 0, output_ns: int = 0) -> None:
        self.statistics.request(ok, total_ns, input_ns, output_ns)
        self._publisher.changed()

    async def model_statistics(self) -> dict:
        """This model's statistics in Triton's schema, summed over its replicas."""
        return as_triton(self.model_name, "1", await self._publisher.read())

    def describe(self) -> dict:
        """For the repository's server: what GET / shows of this model."""
        return self.info

    async def json_request(self, body: bytes) -> tuple[int, bytes]:
        """For the repository's server: the simple JSON form's answer to a body POSTed to / (one model loaded)."""
        response = await self._infer(Forwarded("POST", "/", body), "json")
        return response.status_code, bytes(response.body)

    async def forwarded(self, method: str, path: str, body: bytes = b"",
                        headers: Optional[dict] = None) -> tuple[int, bytes, dict]:
        """For the gRPC endpoint (grpc_endpoint.py): the answer to a request for `path` (from /v2 on) handed over by
        another process, as (status, body, headers), through the same routes, checks and counts as HTTP's."""
        response = await self(Forwarded(method, path, body, headers or {}, root=self.mount))
        return response.status_code, bytes(response.body), dict(response.headers)

    def stats(self) -> dict:
        return {**self.counts.as_dict(), "batch_dim": self.batching.dim, "max_rows_per_call": self.batching.max_rows}

    async def _read_body(self, http) -> bytes:
        """The body, refused as soon as it passes the limit: a declared length is checked before reading."""
        declared = http.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise BodyTooLarge()
        chunks, size = [], 0
        async for chunk in http.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise BodyTooLarge()
            chunks.append(chunk)
        return b"".join(chunks)

    def _json(self, status: int, doc: Any) -> Any:
        return self._response(json.dumps(doc), status_code=status, media_type="application/json")

    async def _answer(self, request: Request) -> Any:
        result = await self._batched(request)
        if isinstance(result, Exception):
            self.counts.failed += 1
            raise result
        self.counts.answered += 1
        return result

    async def _run_batch(self, requests: list[Request]) -> list[Any]:
        """Serve's batch handler: a model call per chunk (one group, at most max_rows rows); each request gets its
        rows, or the error of its own call. A failed call of several requests is retried one by one, so a request
        whose values make the model raise fails alone."""
        answers: list[Any] = [None] * len(requests)
        for chunk in plan_chunks(requests, self.batching.max_rows):
            members = [requests[i] for i in chunk]
            results = await self._call(members)
            if len(members) > 1 and isinstance(results[0], Exception):
                results = [(await self._call([m]))[0] for m in members]
            for index, result in zip(chunk, results):
                answers[index] = result
        return answers

    async def _call(self, members: list[Request]) -> list[Any]:
        rows = [m.rows for m in members]
        try:
            started = time.perf_counter_ns()
            inputs = concat_inputs(members)
            joined = time.perf_counter_ns()
            outputs = await asyncio.get_running_loop().run_in_executor(self._model_thread, self._run_model, inputs)
            ran = time.perf_counter_ns()
            answers = split_rows(outputs, rows) if len(members) > 1 else [outputs]
            queued = [started - round(m.received * 1e9) for m in members]  # perf_counter and _ns share one clock
            self.metrics.called([q / 1e9 for q in queued], sum(rows), (ran - joined) / 1e9)
            self.statistics.call(queued, sum(rows), joined - started, ran - joined, time.perf_counter_ns() - ran)
            self.counts.called(len(members), sum(rows))
            return answers
        except Exception as err:  # noqa: BLE001 — handed to the requests of this call only
            return [err] * len(members)

    def _run_model(self, inputs: list) -> Any:
        device = self.model.device
        if device.type != "cpu":
            inputs = [t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t for t in inputs]
        return map_tensors(torch.Tensor.cpu, self.model(*inputs))


MODEL_PATH = re.compile(r"/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?"
                        r"(?P<action>/ready|/infer|/config|/stats)?/?")
ENDPOINTS = ("POST / (JSON), POST /v2/models/NAME/infer (KServe v2), GET /, /stats, /metrics, /v2, /v2/health/live, "
             "/v2/health/ready, /v2/models/stats, /v2/models/NAME, /v2/models/NAME/ready, /v2/models/NAME/config, "
             "/v2/models/NAME/stats")


class Forwarded:
    """A request handed over by another process (the repository's server, the gRPC endpoint), read as an HTTP
    request is: its method, path (`root`: the app's route prefix, as Serve gives it), headers and body."""

    def __init__(self, method: str, path: str, body: bytes = b"", headers: Optional[dict] = None,
                 root: str = "") -> None:
        self.method, self.body, self.headers = method, body, headers or {}
        self.url, self.scope = _Url(path), {"root_path": root}

    async def stream(self):
        yield self.body


@dataclasses.dataclass(frozen=True)
class _Url:
    path: str


def _path_under_route(http) -> str:
    """The request's path below the app's route prefix (Serve gives the prefix as the ASGI root_path)."""
    path, root = http.url.path, http.scope.get("root_path", "")
    return path[len(root):] if root and path.startswith(root) else path


def default_model_name(package: str) -> str:
    """The name a package is served under in the v2 protocol: its file name without .j2t."""
    return os.path.basename(package).removesuffix(".j2t")


def jit2triton_version() -> str:
    from jit2triton.version import __version__
    return __version__


def _batch_options(max_rows: int, wait_s: float) -> dict:
    """serve.batch's settings: batches counted in rows where this Ray can (batch_size_fn, Ray 2.53+), else in
    requests (each has at least one row, so a batch never needs more than max_rows requests)."""
    options = {"max_batch_size": max_rows, "batch_wait_timeout_s": wait_s}
    if "batch_size_fn" in inspect.signature(_ray_serve().batch).parameters:
        # a request over max_rows (still in the dim's range) counts as max_rows: it runs alone, never refused
        options["batch_size_fn"] = lambda batch: sum(min(r.rows, max_rows) for r in batch)
    return options


def map_tensors(fn: Any, value: Any) -> Any:
    """`value` (a model's outputs) with `fn` applied to each tensor in it."""
    if isinstance(value, torch.Tensor):
        return fn(value)
    if isinstance(value, (tuple, list)):
        return type(value)(map_tensors(fn, v) for v in value)
    if isinstance(value, dict):
        return {k: map_tensors(fn, v) for k, v in value.items()}
    return value


def _owned(tensor: torch.Tensor) -> torch.Tensor:
    """A request's rows as a tensor of its own: a view would pickle the whole batch's storage to the caller."""
    return tensor.clone() if tensor.untyped_storage().nbytes() > tensor.nbytes else tensor


def app(package: str, *, runtime: str = "auto", max_batch_size: int = 32, batch_wait_timeout_s: float = 0.005,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, num_replicas: int = 1, num_cpus: float = 1,
        num_gpus: float = 0, num_threads: Optional[int] = None, trusted_keys: Sequence[str] = (),
        name: str = "jit2triton", model_name: Optional[str] = None, mount: str = "", imports: Sequence[str] = (),
        **deployment_options: Any) -> Any:
    """A bound Ray Serve deployment of a package, ready for `serve.run(app(...))` on any Ray cluster.

    Each replica loads the package from `package` (a path every node can read) in the C++ runtime (`runtime`: "auto" or "cpp"), on `num_gpus` GPUs (Ray picks which), and batches concurrent requests up to `max_batch_size` rows of
    the package's batch dim, waiting at most `batch_wait_timeout_s` for a batch to fill. The KServe v2 protocol
    serves it as `model_name` (default: the package's file name without .j2t); `mount`: the model's path
    (/v2/models/NAME) where the app is deployed at that route prefix, as a model repository deploys it; `imports`:
    Python modules each replica imports first, the libraries whose ops the package calls (torchvision). Other
    keyword arguments go to the deployment's options (autoscaling_config, max_queued_requests, ...)."""
    serve = _ray_serve()
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be at least 1 (1: no batching), not {max_batch_size}")
    options = {"max_ongoing_requests": 2 * max_batch_size,  # a full batch can gather while the previous one runs
               "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus}, **deployment_options}
    if "autoscaling_config" not in options:
        options["num_replicas"] = num_replicas
    deployment = serve.deployment(ModelServer, name=name).options(**options)
    return deployment.bind(os.path.abspath(package), runtime, max_batch_size, batch_wait_timeout_s, max_body_bytes,
                           num_threads, trusted_key_paths(trusted_keys), model_name,
                           None if "autoscaling_config" in options else options["num_replicas"], mount,
                           tuple(imports))


def _replica_grpc_on_loopback() -> None:
    """On a Ray node that listens on loopback only (start_local's), the replica's own gRPC server for calls between
    deployments listens there too: Ray Serve binds it to [::] whatever the node's address (ray 2.60,
    serve/_private/replica.py), and calls reach it at the node's address, here loopback. Elsewhere: untouched."""
    import ray
    from ray.serve._private import replica

    bind = getattr(replica, "add_port_to_grpc_server", None)
    if bind is None or not is_loopback(ray.util.get_node_ip_address()):
        return

    def bind_on_loopback(server, address: str):
        return bind(server, address.replace("[::]", "127.0.0.1", 1))

    replica.add_port_to_grpc_server = bind_on_loopback
