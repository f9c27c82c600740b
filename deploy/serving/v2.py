"""The KServe v2 / Triton Inference Server HTTP protocol, for a served package: model metadata, infer requests read
into the package's named inputs, and outputs written back as typed tensors, as JSON or with the binary tensor data
extension (what `tritonclient.http` sends by default). Plain functions, tested without Ray.

A package's outputs are a structure (a tensor, tuples, lists, dicts); v2 outputs are a flat list of named tensors.
The names follow the structure: a lone tensor is "output__0", item i of a tuple or list "output__i", a dict entry its
key, nested levels joined by "." ("output__1.mask"), as the Triton PyTorch backend numbers its outputs.
"""
from __future__ import annotations

import dataclasses
import json
import math
from typing import Any, Iterator, Optional

import torch

from jit2triton.errors import InputError

DATATYPES = {"BOOL": torch.bool, "UINT8": torch.uint8, "INT8": torch.int8, "INT16": torch.int16,
             "INT32": torch.int32, "INT64": torch.int64, "FP16": torch.float16, "BF16": torch.bfloat16,
             "FP32": torch.float32, "FP64": torch.float64}
V2_NAMES = {dtype: name for name, dtype in DATATYPES.items()}
SCALAR_DATATYPES = {"int": "INT64", "float": "FP64", "bool": "BOOL"}  # a scalar input travels as a 1-element tensor
HEADER_LENGTH = "inference-header-content-length"  # the binary extension: the JSON part's length, bytes follow
EXAMPLE = '{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.0]}]}'


@dataclasses.dataclass
class InferRequest:
    """A v2 infer request read: the inputs by name, and how the answer is wanted."""
    named: dict
    id: Optional[str] = None
    outputs: Optional[list[str]] = None  # None: every output
    binary: dict = dataclasses.field(default_factory=dict)  # output name -> as binary data (else JSON)
    binary_default: bool = False


def datatype_of(desc: dict) -> Optional[str]:
    if desc["type"] == "Tensor":
        return V2_NAMES.get(getattr(torch, desc["dtype"], None))
    return SCALAR_DATATYPES.get(desc["type"])


def tensor_metadata(name: str, desc: dict) -> dict:
    """An input's or output's v2 metadata: a dim fixed at conversion is its size, a dynamic one -1. (An output's
    "dims" name every axis, a fixed one by its size as text: "8".)"""
    sizes = desc.get("dims", desc.get("shape", [])) if desc["type"] == "Tensor" else []
    return {"name": name, "datatype": datatype_of(desc) or "BYTES", "shape": [_size(n) for n in sizes]}


def _size(dim: Any) -> int:
    if isinstance(dim, int):
        return dim
    return int(dim) if isinstance(dim, str) and dim.isdigit() else -1


def output_leaves(desc: dict, path: str = "") -> Iterator[tuple[str, dict]]:
    """(name, description) of each tensor in an output structure, in order."""
    kind = desc["type"]
    if kind in ("Tuple", "List"):
        for i, item in enumerate(desc["items"]):
            yield from output_leaves(item, _join(path, f"output__{i}" if not path else str(i)))
    elif kind == "Dict":
        for key, item in desc["items"].items():
            yield from output_leaves(item, _join(path, key))
    else:
        yield path or "output__0", desc


def flatten_outputs(value: Any, path: str = "") -> Iterator[tuple[str, Any]]:
    """The model's outputs as (name, tensor or scalar), named as `output_leaves` names them."""
    if isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from flatten_outputs(item, _join(path, f"output__{i}" if not path else str(i)))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from flatten_outputs(item, _join(path, str(key)))
    else:
        yield path or "output__0", value


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def model_metadata(name: str, signature: dict) -> dict:
    return {"name": name, "versions": ["1"], "platform": "jit2triton",
            "inputs": [tensor_metadata(d["name"], d) for d in signature["inputs"]],
            "outputs": [tensor_metadata(n, d) for n, d in output_leaves(signature["outputs"])]}


def model_config(metadata: dict, max_batch_size: int, batch_wait_s: float, replicas: Optional[int],
                 device: str) -> dict:
    """The model's configuration in the Triton Inference Server's form (GET /v2/models/NAME/config): with
    max_batch_size > 0 (the package batches along axis 0 of every input and output), dims leave the batch axis
    out, as Triton's do."""
    skip = 1 if max_batch_size > 0 else 0

    def tensors(entries: list[dict]) -> list[dict]:
        return [{"name": t["name"], "data_type": f"TYPE_{'STRING' if t['datatype'] == 'BYTES' else t['datatype']}",
                 "dims": t["shape"][skip:] or [1]} for t in entries]

    config = {"name": metadata["name"], "platform": "jit2triton", "backend": "jit2triton",
              "version_policy": {"latest": {"num_versions": 1}}, "max_batch_size": max_batch_size,
              "input": tensors(metadata["inputs"]), "output": tensors(metadata["outputs"]),
              "instance_group": [{"name": metadata["name"], "kind": "KIND_CPU" if device == "cpu" else "KIND_GPU",
                                  **({"count": replicas} if replicas else {})}]}
    if max_batch_size > 0:
        config["dynamic_batching"] = {"max_queue_delay_microseconds": round(batch_wait_s * 1e6)}
    return config


def read_infer(body: bytes, header_length: Optional[str], inputs: list[dict], output_names: list[str]) -> InferRequest:
    """An infer request's body as named values of the package's inputs; InputError says what is wrong."""
    json_part, binary = _split_body(body, header_length)
    try:
        doc = json.loads(json_part)
    except (ValueError, RecursionError) as err:
        raise InputError(f"the infer request is not JSON ({err}); send e.g. {EXAMPLE}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("inputs"), list) or not doc["inputs"]:
        raise InputError(f"an infer request is a JSON object with \"inputs\": a list of named tensors; e.g. {EXAMPLE}")
    by_name = {d["name"]: d for d in inputs}
    named, offset = {}, 0
    for tensor in doc["inputs"]:
        name = tensor.get("name") if isinstance(tensor, dict) else None
        if name not in by_name:
            raise InputError(f"unknown input {name!r}; the model takes ({', '.join(by_name)})")
        named[name], offset = _read_input(tensor, by_name[name], binary, offset)
    if offset != len(binary):
        raise InputError(f"the request carries {len(binary) - offset} bytes of binary data no input claims")
    parameters = doc.get("parameters") if isinstance(doc.get("parameters"), dict) else {}
    request = InferRequest(named, doc.get("id"), binary_default=bool(parameters.get("binary_data_output")))
    if doc.get("outputs") is not None:
        _read_wanted(doc["outputs"], output_names, request)
    return request


def _split_body(body: bytes, header_length: Optional[str]) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    if not header_length.isdigit() or int(header_length) > len(body):
        raise InputError(f"Inference-Header-Content-Length is {header_length!r}, the body {len(body)} bytes")
    return body[:int(header_length)], body[int(header_length):]


def _read_input(tensor: dict, desc: dict, binary: bytes, offset: int) -> tuple[Any, int]:
    name, datatype, shape = tensor["name"], tensor.get("datatype"), tensor.get("shape")
    expected = datatype_of(desc)
    if datatype != expected:
        raise InputError(f"input {name!r} is {expected}, got datatype {json.dumps(datatype)}; send it as {expected}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and 0 <= n < 1 << 62
                                              for n in shape):
        raise InputError(f"input {name!r}: \"shape\" must be a list of sizes (e.g. [2, 16]), not {shape!r}")
    dtype = DATATYPES[datatype]
    size = (tensor.get("parameters") or {}).get("binary_data_size")
    if size is not None:
        value, offset = _from_binary(name, dtype, shape, size, binary, offset), offset + size
    else:
        value = _from_json(name, dtype, shape, tensor.get("data"))
    if desc["type"] != "Tensor":
        if value.numel() != 1:
            raise InputError(f"input {name!r} is a single {desc['type']}; send shape [1], not {shape}")
        return value.reshape(()).item(), offset
    return value, offset


def _from_binary(name: str, dtype: torch.dtype, shape: list, size: Any, binary: bytes, offset: int) -> torch.Tensor:
    expected = math.prod(shape) * dtype.itemsize
    if size != expected or offset + size > len(binary):
        raise InputError(f"input {name!r}: {V2_NAMES[dtype]}{shape} is {expected} bytes, binary_data_size says "
                         f"{size} and {len(binary) - offset} remain in the body")
    if not size:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(binary[offset:offset + size]), dtype=dtype).reshape(shape)


def _from_json(name: str, dtype: torch.dtype, shape: list, data: Any) -> torch.Tensor:
    """"data": the values in row-major order, flat or nested. Floats for an integer or bool input are refused
    rather than rounded."""
    try:
        values = torch.tensor(data, dtype=dtype if dtype.is_floating_point else None)
    except (TypeError, ValueError, RuntimeError, OverflowError) as err:
        raise InputError(f"input {name!r}: \"data\" must be a list of numbers ({err})") from None
    if not dtype.is_floating_point and (values.dtype.is_floating_point or (dtype == torch.bool) != (
            values.dtype == torch.bool)) and values.numel():
        raise InputError(f"input {name!r}: expected {V2_NAMES[dtype]} values, got {V2_NAMES[values.dtype]} ones")
    if values.numel() != math.prod(shape):
        raise InputError(f"input {name!r}: \"shape\" {shape} holds {math.prod(shape)} values, \"data\" "
                         f"{values.numel()}")
    return values.to(dtype).reshape(shape)


def _read_wanted(wanted: Any, output_names: list[str], request: InferRequest) -> None:
    if not isinstance(wanted, list) or not all(isinstance(o, dict) and "name" in o for o in wanted):
        raise InputError("\"outputs\" must be a list of {\"name\": ...}")
    unknown = [o["name"] for o in wanted if o["name"] not in output_names]
    if unknown:
        raise InputError(f"unknown output {unknown[0]!r}; the model returns ({', '.join(output_names)})")
    request.outputs = [o["name"] for o in wanted]
    request.binary = {o["name"]: bool((o.get("parameters") or {}).get("binary_data", request.binary_default))
                      for o in wanted}


def write_infer(model: str, request: InferRequest, outputs: Any) -> tuple[bytes, dict]:
    """The answer's body and headers: each wanted output as a typed tensor, its values as JSON or appended as
    bytes (the binary extension, with the JSON part's length in a header)."""
    answers, chunks = [], []
    for name, value in flatten_outputs(outputs):
        if request.outputs is not None and name not in request.outputs:
            continue
        if value is None:
            continue  # an output the model left empty (an Optional it returned as None) has no tensor to send
        tensor = value.detach().cpu() if isinstance(value, torch.Tensor) else torch.tensor(value)
        entry = {"name": name, "datatype": V2_NAMES.get(tensor.dtype, "BYTES"), "shape": list(tensor.shape)}
        if request.binary.get(name, request.binary_default):
            raw = tensor.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = tensor.reshape(-1).tolist()
        answers.append(entry)
    doc = {"model_name": model, "model_version": "1", "outputs": answers}
    if request.id is not None:
        doc["id"] = request.id
    head = json.dumps(doc).encode()
    if not chunks:
        return head, {"content-type": "application/json"}
    return head + b"".join(chunks), {"content-type": "application/octet-stream",
                                     "inference-header-content-length": str(len(head))}
