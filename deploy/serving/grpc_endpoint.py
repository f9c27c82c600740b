"""The KServe v2 / Triton Inference Server gRPC protocol for `jit2triton serve --grpc-port`: the
`GRPCInferenceService` of the protobufs `tritonclient[grpc]` ships, served with grpcio in the serving process, each
RPC handed to the same Ray Serve applications the HTTP routes reach, through their handles (Ray Serve's own gRPC
proxy routes by an `application` metadata key that tritonclient does not send).

- a model's RPCs (ModelMetadata, ModelConfig, ModelInfer, ModelStatistics of one model) go to its application as
  the HTTP request they stand for (`ModelServer.forwarded`): the same checks, batching, statistics and messages;
- the repository's (RepositoryIndex, RepositoryModelLoad/Unload, ModelReady, every model's statistics, and why a
  model is not served) to the repository's application (`RepositoryServer`).

An infer request travels to the replica as the HTTP protocol's body with binary tensor data (typed contents are
turned into bytes here), and every output comes back as raw_output_contents, as tritonclient reads them. A refusal
is a gRPC status with the HTTP answer's one-line message: NOT_FOUND for an unknown model or version,
INVALID_ARGUMENT for a bad input, UNAVAILABLE for a model not loaded, INTERNAL where the model failed.
"""
from __future__ import annotations

import json
import math
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Optional

import numpy as np

from jit2triton.errors import InputError

from . import v2
from .repository import EXTENSIONS, REPOSITORY_APP, model_route
from .server import DEFAULT_MAX_BODY_BYTES, _ray_serve, jit2triton_version

try:  # optional: where they are missing, `--grpc-port` says what to install and nothing else changes
    import grpc
    from google.protobuf import json_format
    from tritonclient.grpc import model_config_pb2, service_pb2, service_pb2_grpc
    _Servicer: Any = service_pb2_grpc.GRPCInferenceServiceServicer
    MISSING: Optional[str] = None
except ImportError as err:
    _Servicer = object
    MISSING = (f"the gRPC endpoint needs grpcio and tritonclient's KServe v2 protobufs ({err}): pip install "
               "'tritonclient[grpc]'")

LOAD = "RepositoryModelLoad"  # how a gRPC client loads a model, named in the refusal of one that is not loaded
# an input's typed contents: the field that carries each datatype, and its values' dtype
TYPED_CONTENTS = {"BOOL": ("bool_contents", np.bool_), "INT8": ("int_contents", np.int8),
                  "INT16": ("int_contents", np.int16), "INT32": ("int_contents", np.int32),
                  "INT64": ("int64_contents", np.int64), "UINT8": ("uint_contents", np.uint8),
                  "FP32": ("fp32_contents", np.float32), "FP64": ("fp64_contents", np.float64)}


def infer_body(request: Any) -> tuple[bytes, str]:
    """A ModelInferRequest as the HTTP protocol's infer body with binary tensor data, and its JSON part's length:
    every input's bytes after the JSON part, every output asked for as binary data. InputError says what is wrong
    in the gRPC request's words."""
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InputError(f"the request has {len(request.inputs)} inputs and {len(raw)} raw_input_contents; send one "
                         "per input, in order (or none, with typed contents)")
    inputs, chunks = [], []
    for i, tensor in enumerate(request.inputs):
        data = _checked_bytes(tensor, raw[i], f"raw_input_contents[{i}]") if raw else _typed_bytes(tensor)
        inputs.append({"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape),
                       "parameters": {"binary_data_size": len(data)}})
        chunks.append(data)
    doc: dict = {"inputs": inputs, "parameters": {"binary_data_output": True}}
    if request.id:
        doc["id"] = request.id
    if request.outputs:
        doc["outputs"] = [{"name": o.name, "parameters": {"binary_data": True}} for o in request.outputs]
    head = json.dumps(doc).encode()
    return head + b"".join(chunks), str(len(head))


def _checked_bytes(tensor: Any, data: bytes, where: str) -> bytes:
    dtype = v2.DATATYPES.get(tensor.datatype)
    if dtype is not None and all(n >= 0 for n in tensor.shape):  # else the HTTP protocol's check names what is wrong
        expected = math.prod(tensor.shape) * dtype.itemsize
        if len(data) != expected:
            raise InputError(f"input {tensor.name!r}: {tensor.datatype}{list(tensor.shape)} is {expected} bytes, "
                             f"{where} holds {len(data)}")
    return data


def _typed_bytes(tensor: Any) -> bytes:
    """An input's typed contents (fp32_contents, int64_contents, ...) as its little-endian bytes."""
    if tensor.datatype not in TYPED_CONTENTS:
        raise InputError(f"input {tensor.name!r}: {tensor.datatype} travels as raw_input_contents only (it has no "
                         "typed contents); send every input as raw_input_contents")
    field, dtype = TYPED_CONTENTS[tensor.datatype]
    values = getattr(tensor.contents, field)
    count = math.prod(tensor.shape) if all(n >= 0 for n in tensor.shape) else len(values)
    if len(values) != count:
        raise InputError(f"input {tensor.name!r}: shape {list(tensor.shape)} holds {count} values, its "
                         f"contents.{field} {len(values)}")
    try:
        return np.array(list(values), dtype=np.dtype(dtype).newbyteorder("<")).tobytes()
    except OverflowError as err:
        raise InputError(f"input {tensor.name!r}: a value of contents.{field} does not fit {tensor.datatype} ({err})"
                         ) from None


def infer_response(body: bytes, headers: dict) -> Any:
    """The HTTP protocol's infer answer (every output as binary data) as a ModelInferResponse with
    raw_output_contents."""
    length = int(headers.get(v2.HEADER_LENGTH, len(body)))
    doc = json.loads(body[:length])
    response = service_pb2.ModelInferResponse(model_name=doc["model_name"], model_version=doc["model_version"],
                                              id=doc.get("id", ""))
    offset = length
    for output in doc["outputs"]:
        size = output["parameters"]["binary_data_size"]
        response.outputs.add(name=output["name"], datatype=output["datatype"], shape=output["shape"])
        response.raw_output_contents.append(body[offset:offset + size])
        offset += size
    return response


class InferenceService(_Servicer):
    """The RPCs of `GRPCInferenceService`, each answered by a Ray Serve application of the repository of
    `models` (their names); the streaming, shared-memory, trace and log RPCs are left UNIMPLEMENTED."""

    def __init__(self, models: list[str]) -> None:
        from ray.serve.exceptions import DeploymentUnavailableError, RayServeException

        self.models = set(models)
        self._serve = _ray_serve()
        self._gone, self._absent = DeploymentUnavailableError, RayServeException
        self._handles: dict[str, Any] = {}  # a handle per application, made once (a new one waits for its replicas)
        self._lock = threading.Lock()

    # ---- the server ----

    def ServerLive(self, request, context):
        return service_pb2.ServerLiveResponse(live=True)

    def ServerReady(self, request, context):
        return service_pb2.ServerReadyResponse(ready=True)  # as GET /v2/health/ready: answering is ready

    def ServerMetadata(self, request, context):
        return service_pb2.ServerMetadataResponse(name="jit2triton", version=jit2triton_version(),
                                                  extensions=EXTENSIONS)

    # ---- a model ----

    def ModelReady(self, request, context):
        ready = request.name in self.models and request.version in ("", "1") and any(
            m["name"] == request.name and m["state"] == "READY" for m in self._repository(context, "index"))
        return service_pb2.ModelReadyResponse(ready=ready)  # an unknown model is not ready, as Triton answers

    def ModelMetadata(self, request, context):
        doc = json.loads(self._forward(context, request.name, request.version, "GET", "")[0])
        return json_format.ParseDict(doc, service_pb2.ModelMetadataResponse())

    def ModelConfig(self, request, context):
        doc = json.loads(self._forward(context, request.name, request.version, "GET", "/config")[0])
        return service_pb2.ModelConfigResponse(config=json_format.ParseDict(doc, model_config_pb2.ModelConfig()))

    def ModelInfer(self, request, context):
        try:
            body, head_length = infer_body(request)
        except InputError as err:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        answer, headers = self._forward(context, request.model_name, request.model_version, "POST", "/infer", body,
                                        {v2.HEADER_LENGTH: head_length})
        return infer_response(answer, headers)

    def ModelStatistics(self, request, context):
        if request.name:
            stats = json.loads(self._forward(context, request.name, request.version, "GET", "/stats")[0])
            stats = stats["model_stats"]
        else:
            stats = self._repository(context, "statistics")
        response = service_pb2.ModelStatisticsResponse()
        for entry in stats:
            json_format.ParseDict(entry, response.model_stats.add(), ignore_unknown_fields=True)
        return response

    # ---- the repository ----

    def RepositoryIndex(self, request, context):
        return service_pb2.RepositoryIndexResponse(models=[
            service_pb2.RepositoryIndexResponse.ModelIndex(**m) for m in self._repository(context, "index")
            if not request.ready or m["state"] == "READY"])

    def RepositoryModelLoad(self, request, context):
        if request.parameters:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a load reads the repository's package again, as it is: "
                          f"parameters ({', '.join(request.parameters)}) are not served; send none")
        self._change(context, request.model_name, "load")
        return service_pb2.RepositoryModelLoadResponse()

    def RepositoryModelUnload(self, request, context):
        self._change(context, request.model_name, "unload")
        return service_pb2.RepositoryModelUnloadResponse()

    def _change(self, context, name: str, action: str) -> None:
        status, message = self._repository(context, "change", name, action)
        if status != 200:
            context.abort(STATUS_CODES.get(status, grpc.StatusCode.INTERNAL), message)

    # ---- through the applications' handles ----

    def _forward(self, context, name: str, version: str, method: str, action: str, body: bytes = b"",
                 headers: Optional[dict] = None) -> tuple[bytes, dict]:
        """The answer of model `name`'s application to the HTTP request at its path + `action`; a refusal aborts
        the RPC with its status and message."""
        path = model_route(name) + (f"/versions/{version}" if version else "") + action
        answer = None
        for _ in range(2):  # a handle kept from before the model was unloaded fails: asked again, once
            handle = self._handle(name) if name in self.models else None
            if handle is None:
                break
            try:
                answer = handle.forwarded.remote(method, path, body, headers).result()
                break
            except self._gone:
                self._forget(name)
            except Exception as err:  # noqa: BLE001 — a replica that died, Serve shutting down: said in one line
                context.abort(grpc.StatusCode.INTERNAL, f"model {name!r} did not answer: {_one_line(err)}")
        if answer is None:
            state, message = self._repository(context, "refusal", name, LOAD)
            context.abort(grpc.StatusCode.NOT_FOUND if state == "UNKNOWN" else grpc.StatusCode.UNAVAILABLE, message)
        status, answer_body, answer_headers = answer
        if status != 200:
            context.abort(STATUS_CODES.get(status, grpc.StatusCode.INTERNAL), json.loads(answer_body)["error"])
        return answer_body, answer_headers

    def _repository(self, context, method: str, *args: Any) -> Any:
        try:
            return getattr(self._handle(REPOSITORY_APP), method).remote(*args).result()
        except Exception as err:  # noqa: BLE001
            context.abort(grpc.StatusCode.INTERNAL, f"the model repository did not answer: {_one_line(err)}")

    def _handle(self, app: str) -> Any:
        """The application's handle, or None where it is not deployed."""
        with self._lock:
            if app not in self._handles:
                try:
                    self._handles[app] = self._serve.get_app_handle(app)
                except self._absent:
                    return None
            return self._handles[app]

    def _forget(self, app: str) -> None:
        with self._lock:
            self._handles.pop(app, None)


def _one_line(err: Exception) -> str:
    lines = str(err).strip().splitlines()
    return f"{type(err).__name__}: {lines[-1]}" if lines else type(err).__name__


STATUS_CODES = {} if MISSING else {
    400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND, 409: grpc.StatusCode.ABORTED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED, 503: grpc.StatusCode.UNAVAILABLE}  # else INTERNAL


def start(models: list[str], host: str, port: int, workers: int = 64) -> Any:
    """The gRPC server of a repository of `models` (their names), listening on host:port (the HTTP server's host),
    started. `workers`: RPCs answered at once, each waiting on its application (requests batch across them)."""
    server = grpc.server(ThreadPoolExecutor(workers, thread_name_prefix="jit2triton-grpc"), options=[
        ("grpc.so_reuseport", 0),  # a port in use is an error, never shared with another server
        ("grpc.max_receive_message_length", DEFAULT_MAX_BODY_BYTES), ("grpc.max_send_message_length", -1)])
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(InferenceService(models), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        server.add_insecure_port(address)
    except RuntimeError as err:  # taken since the CLI's check of the port
        raise InputError(f"cannot listen on {address} for gRPC ({err}); pick another --grpc-port") from None
    server.start()
    return server
