"""The outputs' dynamic sizes in a package's signature: each fitted, over the outputs seen at the example and at each
draw of the dynamic dims, to a polynomial over the dims (transpiler/symbolic.py). Conversion only."""
from __future__ import annotations

import torch

from jit2triton.transpiler.symbolic import fit


def with_dims(desc: dict, seen: list[tuple[dict, list]]) -> dict:
    """The outputs' description with each tensor's dynamic sizes named (`dims`: "batch", "12*batch"), beside the
    example's: fitted to the outputs seen at the example and at each draw of the dims (`seen`: (sizes, outputs))."""
    if not seen[1:]:
        return desc
    draws = [sizes for sizes, _ in seen]

    def walk(d: dict, values: list) -> None:
        if d.get("type") == "Tensor" and all(isinstance(v, torch.Tensor) and v.dim() == len(d["shape"])
                                             for v in values):
            fitted = [fit([v.shape[axis] for v in values], draws) for axis in range(len(d["shape"]))]
            if any(not isinstance(n, int) for n in fitted):
                d["dims"] = [str(n) if n is not None else "?" for n in fitted]
        elif d.get("type") in ("Tuple", "List") and all(isinstance(v, (tuple, list)) and len(v) == len(d["items"])
                                                        for v in values):
            for i, item in enumerate(d["items"]):
                walk(item, [v[i] for v in values])
        elif d.get("type") == "Dict" and all(isinstance(v, dict) and v.keys() == d["items"].keys() for v in values):
            for key, item in d["items"].items():
                walk(item, [v[key] for v in values])

    walk(desc, [outputs[0] if len(outputs) == 1 else tuple(outputs) for _, outputs in seen])
    return desc
