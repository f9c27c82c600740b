"""How a replica batches: the batch dim read from a package's signature, requests grouped into model calls of
one shape and at most max_rows rows, and a call's outputs handed back per request. Plain functions, tested without
Ray."""
from __future__ import annotations

import dataclasses
from typing import Any, Optional, Sequence

import torch

from jit2triton.errors import StepError

from .json_form import Request


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
