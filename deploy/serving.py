"""Serving a package with Ray Serve: replicas that load it once, batch concurrent requests along its batch dim, and
answer HTTP JSON and Python handle calls.

Ray is imported only by what needs it (`ModelServer`, `app`, `start_local`): reading requests, grouping them into
batches and handing outputs back are plain functions, tested without Ray.

HTTP: POST {"inputs": {name: tensor, ...} or [tensor, ...], "outputs": "list" | "base64"}, where a tensor is a
nested list or {"dtype": "float32", "shape": [2, 16], "data": base64 of its little-endian bytes}; the answer is
{"outputs": ...} in the same structure as the model's (answers are encoded the way the inputs came unless
"outputs" says otherwise). A bad body gets 400 with the InputError's message, a body over the limit 413. GET
answers the signature and batching, GET .../stats the replica's counters.
"""
from __future__ import annotations

import asyncio
import base64
import binascii
import dataclasses
import inspect
import json
import logging
import math
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional, Sequence

import torch

from jit2triton.errors import InputError, Jit2TritonError, PackageDeviceError, StepError

from .literals import decode
from .package import read_package
from .signature import NO_DEFAULT, InputChecker, format_type
from .signing import trusted_key_paths

DEFAULT_MAX_BODY_BYTES = 64 << 20  # a batch of 32 224x224 RGB images is 25 MB as base64, ~60 MB as JSON lists
ENCODINGS = ("list", "base64")
BODY_EXAMPLE = '{"inputs": {"x": [[0.5, 1.0]]}}'
log = logging.getLogger("jit2triton.serving")


class BodyTooLarge(Exception):
    """A request body over the replica's limit (answered 413)."""


@dataclasses.dataclass(frozen=True)
class Batching:
    """How a replica batches, decided once from the package's signature."""
    dim: Optional[str]  # the batch dim; None: one request per model call
    max_rows: int  # rows of the batch dim in one model call
    why_not: str = ""  # when dim is None: why requests are not batched


def plan_batching(signature: dict, max_batch_size: int) -> Batching:
    """The batch dim is a dynamic dim on axis 0 of every input and every output, and on no other axis: requests
    then concatenate along axis 0 and each gets its rows back. Anything else is served one request per call."""
    inputs, dims = signature["inputs"], signature.get("dims") or {}
    shapes = [d["shape"] for d in inputs if d["type"] == "Tensor"]
    dim = shapes[0][0] if shapes and shapes[0] else None
    if not isinstance(dim, str) or len(shapes) != len(inputs) or any(
            not s or s[0] != dim or dim in s[1:] for s in shapes):
        return Batching(None, 1, "the package has no dynamic dim on axis 0 of every input")
    if not _splits_by_rows(signature["outputs"], dim):
        return Batching(None, 1, f"an output does not have dim {dim} on axis 0 (only), so its rows cannot be handed "
                                 "back per request")
    high = dims[dim].get("max")
    max_rows = min(max_batch_size, high) if high else max_batch_size
    if max_rows < 2:
        return Batching(None, 1, f"at most {max_rows} row of dim {dim} per call")
    return Batching(dim, max_rows)


def _splits_by_rows(desc: dict, dim: str) -> bool:
    kind = desc["type"]
    if kind == "Tensor":
        named = desc.get("dims") or []
        return bool(named) and named[0] == dim and dim not in named[1:]
    if kind in ("Tuple", "List"):
        return all(_splits_by_rows(d, dim) for d in desc["items"])
    if kind == "Dict":
        return all(_splits_by_rows(d, dim) for d in desc["items"].values())
    return False


@dataclasses.dataclass
class Request:
    """One validated request: its inputs (CPU tensors, defaults filled), its rows of the batch dim, the key of the
    requests it may be concatenated with (every input's shape past axis 0), and how to encode its answer."""
    inputs: list
    rows: int = 1
    group: tuple = ()
    reply: str = "list"


class RequestReader:
    """Turns an HTTP body or a handle call into a validated `Request`, or raises InputError saying what is wrong.
    Built once per replica: the package's own input check, by name and position, with the package's messages."""

    def __init__(self, signature: dict, batching: Batching) -> None:
        self.inputs = signature["inputs"]
        self.names = [d["name"] for d in self.inputs]
        self.defaults = [decode(d["default"]) if "default" in d else NO_DEFAULT for d in self.inputs]
        self.dtypes = [getattr(torch, d["dtype"], None) if d["type"] == "Tensor" else None for d in self.inputs]
        # requests arrive as CPU tensors; the batch is moved to the model's device once, after concatenation
        self.check = InputChecker(self.inputs, torch.device("cpu"), self.defaults, dims=signature.get("dims"))
        self.batched = batching.dim is not None

    def from_json(self, body: bytes) -> Request:
        try:
            doc = json.loads(body)
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
            raise InputError(f"the body is not JSON ({err}); send e.g. {BODY_EXAMPLE}") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), (dict, list)):
            raise InputError(f"the body must be a JSON object with \"inputs\": an object by input name or a list by "
                             f"position (the model takes {', '.join(self.names)}); e.g. {BODY_EXAMPLE}")
        given = doc["inputs"]
        if not given:
            raise InputError(f"\"inputs\" is empty; the model takes ({', '.join(self.names)})")
        sent = list(given.values()) if isinstance(given, dict) else given
        reply = doc.get("outputs", "base64" if any(isinstance(v, dict) for v in sent) else "list")
        if reply not in ENCODINGS:
            raise InputError(f"\"outputs\" must be \"list\" or \"base64\", not {reply!r}")
        if isinstance(given, dict):
            self._known(given)
            return self._checked(self._bind({n: self._decode(self.names.index(n), v) for n, v in given.items()}),
                                 reply)
        if len(given) > len(self.names):
            raise InputError(f"expected at most {len(self.names)} inputs ({', '.join(self.names)}), got {len(given)}")
        return self._checked([self._decode(i, v) for i, v in enumerate(given)], reply)

    def from_values(self, args: Sequence[Any], named: dict[str, Any]) -> Request:
        """A Python handle call: tensors by position and by name, as the loaded module takes them."""
        args = self._bind(named, list(args)) if named else list(args)
        values = [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]
        return self._checked(values, "list")

    def _bind(self, given: dict, positional: Sequence[Any] = ()) -> list:
        """Inputs by name after those by position, in the model's order up to the last one named; a gap takes the
        input's default."""
        self._known(given)
        twice = [n for n in given if self.names.index(n) < len(positional)]
        if twice:
            raise InputError(f"input {twice[0]!r} was given by position and by name; give it once")
        args = list(positional)
        for position in range(len(positional), max(self.names.index(n) for n in given) + 1):
            name, default = self.names[position], self.defaults[position]
            if name not in given and default is NO_DEFAULT:
                raise InputError(f"input {name!r} is missing and has no default; send it")
            args.append(given.get(name, default))
        return args

    def _known(self, given: dict) -> None:
        unknown = [n for n in given if n not in self.names]
        if unknown:
            raise InputError(f"unknown input {unknown[0]!r}; the model takes ({', '.join(self.names)})")

    def _decode(self, index: int, value: Any) -> Any:
        dtype = self.dtypes[index]
        if self.inputs[index]["type"] != "Tensor" or dtype is None:
            return value  # a scalar input: the input check says whether its JSON type fits
        label = f"input {index} ({self.names[index]!r})"
        if isinstance(value, dict):
            return tensor_from_base64(label, value, dtype)
        return tensor_from_list(label, value, dtype)

    def _checked(self, values: list, reply: str) -> Request:
        inputs = self.check(tuple(values))
        if not self.batched:
            return Request(inputs, 1, (), reply)
        return Request(inputs, inputs[0].shape[0], tuple(t.shape[1:] for t in inputs), reply)


def tensor_from_list(label: str, value: Any, dtype: torch.dtype) -> torch.Tensor:
    """A nested list of numbers as a tensor of the input's dtype. Floats for an integer or bool input are refused
    rather than rounded: a silently changed value is a wrong answer."""
    if dtype.is_complex:
        raise InputError(f"{label}: complex tensors travel as base64: {{\"dtype\": \"{_name(dtype)}\", \"shape\": "
                         "[...], \"data\": \"...\"}")
    try:
        if dtype.is_floating_point:
            return torch.tensor(value, dtype=dtype)
        tensor = torch.tensor(value)
    except (TypeError, ValueError, RuntimeError, OverflowError) as err:
        raise InputError(f"{label}: expected a nested list of numbers of one rectangular shape ({err})") from None
    if (dtype == torch.bool) != (tensor.dtype == torch.bool) or tensor.dtype.is_floating_point:
        raise InputError(f"{label}: expected {_name(dtype)} values, got {_name(tensor.dtype)} ones; send "
                         f"{'true/false' if dtype == torch.bool else 'whole numbers'}")
    return tensor.to(dtype)


def tensor_from_base64(label: str, doc: dict, dtype: torch.dtype) -> torch.Tensor:
    """{"dtype", "shape", "data"}: a tensor's raw little-endian bytes, base64-encoded, of the input's own dtype
    (bytes are read only as that dtype: torch.frombuffer crashes the process on some others, quantized ones)."""
    name, shape, data = doc.get("dtype"), doc.get("shape"), doc.get("data")
    if name != _name(dtype):
        raise InputError(f"{label}: expected {_name(dtype)} data, got \"dtype\": {json.dumps(name)}; send the tensor "
                         f"as {_name(dtype)}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 62
                                              for n in shape):
        raise InputError(f"{label}: \"shape\" must be a list of sizes (e.g. [2, 16]), not {shape!r}")
    if not isinstance(data, str):
        raise InputError(f"{label}: \"data\" must be the tensor's bytes as a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as err:
        raise InputError(f"{label}: \"data\" is not base64 ({err})") from None
    expected = math.prod(shape) * dtype.itemsize
    if len(raw) != expected:
        raise InputError(f"{label}: {_name(dtype)}{shape} is {expected} bytes, \"data\" holds {len(raw)}")
    if not raw:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)  # bytearray: a buffer the tensor may own


def plan_chunks(requests: Sequence[Request], max_rows: int) -> list[list[int]]:
    """Model calls for a batch of requests: each a list of request indices of one group (equal shapes past axis
    0, so they concatenate), of at most `max_rows` rows, in arrival order. A request larger than `max_rows` (but in
    the dim's range) runs alone."""
    chunks: list[list[int]] = []
    open_chunk: dict[tuple, tuple[int, int]] = {}  # group -> (its chunk being filled, rows in it)
    for index, request in enumerate(requests):
        at = open_chunk.get(request.group)
        if at is None or at[1] + request.rows > max_rows:
            chunks.append([])
            at = (len(chunks) - 1, 0)
        chunks[at[0]].append(index)
        open_chunk[request.group] = (at[0], at[1] + request.rows)
    return chunks


def concat_inputs(requests: Sequence[Request]) -> list:
    if len(requests) == 1:
        return requests[0].inputs
    return [torch.cat(column) for column in zip(*(r.inputs for r in requests))]


def split_rows(outputs: Any, rows: list[int]) -> list[Any]:
    """A batch's outputs, handed back per request: every tensor split along axis 0 into `rows`."""
    if isinstance(outputs, torch.Tensor):
        if outputs.dim() == 0 or outputs.shape[0] != sum(rows):
            raise StepError(f"the model returned {outputs.shape[0] if outputs.dim() else 'no'} rows for a batch of "
                            f"{sum(rows)}, so they cannot be handed back per request; serve this package with "
                            "max_batch_size=1")
        return list(outputs.split(rows))
    if isinstance(outputs, (tuple, list)):
        per_item = [split_rows(v, rows) for v in outputs]
        return [type(outputs)(parts[i] for parts in per_item) for i in range(len(rows))]
    if isinstance(outputs, dict):
        per_key = {k: split_rows(v, rows) for k, v in outputs.items()}
        return [{k: parts[i] for k, parts in per_key.items()} for i in range(len(rows))]
    raise StepError(f"the model returned a {type(outputs).__name__}, which cannot be split per request; serve this "
                    "package with max_batch_size=1")


def encode(value: Any, how: str) -> Any:
    """Outputs as JSON: tensors as nested lists or base64 records, containers as lists and objects."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        if how == "list":
            return value.tolist()
        data = value.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return {"dtype": _name(value.dtype), "shape": list(value.shape), "data": base64.b64encode(data).decode()}
    if isinstance(value, (tuple, list)):
        return [encode(v, how) for v in value]
    if isinstance(value, dict):
        return {str(k): encode(v, how) for k, v in value.items()}
    return value


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def load_for_serving(path: str, runtime: str = "auto", num_threads: Optional[int] = None,
                     trusted_keys: Sequence[str] = ()) -> tuple[Any, dict]:
    """The package loaded as jit2triton.load loads it (the C++ runtime, else the Python one), and its manifest."""
    if runtime not in ("auto", "cpp", "python"):
        raise ValueError(f"runtime must be auto, cpp or python, not {runtime!r}")
    keys = trusted_key_paths(trusted_keys)
    if runtime != "python":
        from . import cpp_runtime
        why = cpp_runtime.unavailable() if runtime == "auto" else None
        if why is None:
            manifest = read_package(path, mmap=True, trusted_keys=keys).manifest
            try:
                return cpp_runtime.CppRuntime(path, None, num_threads, trusted_keys=keys), manifest
            except PackageDeviceError:
                if runtime == "cpp":
                    raise
    from .runtime import Runtime
    contents = read_package(path, trusted_keys=keys)
    return Runtime(contents, None, num_threads), contents.manifest


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
                 num_threads: Optional[int] = None, trusted_keys: Sequence[str] = ()) -> None:
        serve = _ray_serve()
        from starlette.responses import Response  # a dependency of Ray Serve

        if num_threads:
            torch.set_num_threads(num_threads)  # ATen's ops too, not only the generated kernels
        self.model, manifest = load_for_serving(package, runtime, num_threads, trusted_keys)
        signature = manifest["signature"]
        self.batching = plan_batching(signature, max_batch_size)
        self.reader = RequestReader(signature, self.batching)
        self.max_body_bytes = max_body_bytes
        self._response = Response
        # one model call at a time, off the event loop: requests keep arriving and forming the next batch while the
        # model runs (the C++ runtime releases the GIL), and the module never sees two calls at once
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="jit2triton-model")
        self._batched = serve.batch(**_batch_options(self.batching.max_rows, batch_wait_timeout_s))(self._run_batch)
        context = serve.get_replica_context()
        replica = getattr(context, "replica_id", None) or getattr(context, "replica_tag", "")
        self.counts = Counts(replica=str(getattr(replica, "unique_id", replica)))
        args = ", ".join(f"{d['name']}: {format_type(d)}" for d in signature["inputs"])
        self.info = {"package": os.path.basename(package), "signature": f"({args}) -> "
                     f"{format_type(signature['outputs'])}", "runtime": self.model.name,
                     "device": str(self.model.device), "batch_dim": self.batching.dim,
                     "max_rows_per_call": self.batching.max_rows, "not_batched_because": self.batching.why_not or None}

    async def __call__(self, http) -> Any:
        if http.method == "GET":
            last = http.url.path.rstrip("/").rsplit("/", 1)[-1]
            return self._json(200, self.stats() if last == "stats" else self.info)
        if http.method != "POST":
            return self._json(405, {"error": "POST a JSON body to run the model; GET for its signature, GET "
                                             ".../stats for this replica's counters"})
        try:
            request = self.reader.from_json(await self._read_body(http))
        except BodyTooLarge:
            self.counts.refused += 1
            return self._json(413, {"error": f"the body is over this server's limit of {self.max_body_bytes} bytes; "
                                             "send fewer rows per request (or raise max_body_bytes)"})
        except InputError as err:
            self.counts.refused += 1
            return self._json(400, {"error": str(err)})
        try:
            outputs = await self._answer(request)
        except Jit2TritonError as err:
            return self._json(500, {"error": f"the model failed on this request: {err}"})
        except Exception as err:  # noqa: BLE001 — a client gets a message, the replica's log the traceback
            log.exception("jit2triton serving: a model call failed")
            return self._json(500, {"error": f"internal error ({type(err).__name__}); the replica's log has it"})
        return self._json(200, {"outputs": encode(outputs, request.reply)})

    async def predict(self, *inputs: Any, **named: Any) -> Any:
        """The Python handle: `handle.predict.remote(x)` returns what the loaded module returns, on the CPU."""
        try:
            request = self.reader.from_values(inputs, named)
        except InputError:
            self.counts.refused += 1
            raise
        return map_tensors(_owned, await self._answer(request))

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
            outputs = await asyncio.get_running_loop().run_in_executor(self._model_thread, self._run_model,
                                                                       concat_inputs(members))
            self.counts.called(len(members), sum(rows))
            return split_rows(outputs, rows) if len(members) > 1 else [outputs]
        except Exception as err:  # noqa: BLE001 — handed to the requests of this call only
            return [err] * len(members)

    def _run_model(self, inputs: list) -> Any:
        device = self.model.device
        if device.type != "cpu":
            inputs = [t.to(device, non_blocking=True) if isinstance(t, torch.Tensor) else t for t in inputs]
        return map_tensors(torch.Tensor.cpu, self.model(*inputs))


def _batch_options(max_rows: int, wait_s: float) -> dict:
    """serve.batch's settings: batches counted in rows where this Ray can (batch_size_fn, Ray 2.53+), else in
    requests (each has at least one row, so a batch never needs more than max_rows requests)."""
    options = {"max_batch_size": max_rows, "batch_wait_timeout_s": wait_s}
    if "batch_size_fn" in inspect.signature(_ray_serve().batch).parameters:
        # a request over max_rows (still in the dim's range) counts as max_rows: it runs alone, never refused
        options["batch_size_fn"] = lambda batch: sum(min(r.rows, max_rows) for r in batch)
    return options


def _ray_serve() -> Any:
    """Ray Serve, or an ImportError that says how to install it (it is an optional extra)."""
    try:
        from ray import serve
    except ImportError as err:
        raise ImportError(f"jit2triton.serving needs Ray Serve ({err}): pip install 'jit2triton[serve]'") from None
    return serve


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
        name: str = "jit2triton", **deployment_options: Any) -> Any:
    """A bound Ray Serve deployment of a package, ready for `serve.run(app(...))` on any Ray cluster.

    Each replica loads the package from `package` (a path every node can read) with `runtime` ("auto", "cpp",
    "python"), on `num_gpus` GPUs (Ray picks which), and batches concurrent requests up to `max_batch_size` rows of
    the package's batch dim, waiting at most `batch_wait_timeout_s` for a batch to fill. Other keyword arguments
    go to the deployment's options (autoscaling_config, max_queued_requests, ...)."""
    serve = _ray_serve()
    if max_batch_size < 1:
        raise ValueError(f"max_batch_size must be at least 1 (1: no batching), not {max_batch_size}")
    options = {"max_ongoing_requests": 2 * max_batch_size,  # a full batch can gather while the previous one runs
               "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus}, **deployment_options}
    if "autoscaling_config" not in options:
        options["num_replicas"] = num_replicas
    deployment = serve.deployment(ModelServer, name=name).options(**options)
    return deployment.bind(os.path.abspath(package), runtime, max_batch_size, batch_wait_timeout_s, max_body_bytes,
                           num_threads, trusted_key_paths(trusted_keys))


def start_local(host: str = "127.0.0.1", port: int = 8000, num_cpus: Optional[int] = None,
                log_to_driver: bool = True) -> None:
    """A new local Ray instance with Serve's HTTP proxy on `host:port`, for a quick start; to serve on an existing
    cluster, serve.run(app(...)) there instead. With a loopback `host` Ray's own processes talk over loopback too
    (Ray's single-machine mode, which it reads when first imported: call this before importing ray)."""
    if host in ("127.0.0.1", "localhost", "::1"):
        os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    serve = _ray_serve()
    import ray
    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=log_to_driver)
    serve.start(http_options={"host": host, "port": port})
