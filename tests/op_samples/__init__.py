"""Sample calls for every op the op table lowers, for the per-op tests that `test_ops.py` generates from the table.

`SAMPLES` maps an exact overload name to one or more `Sample`s: how to build a tiny TorchScript model that calls
that overload, and makers of its inputs (called once for the example inputs, again for fresh ones). A sample packs
the cases the op must survive into one model's outputs, so an op costs one C++ compile: float32, a transposed or
sliced view made inside the model, broadcasting ([4, 1, 6] with [5, 1]), bfloat16, int64 where the op takes
integers, and NaN/inf, negative or half-way values where the op's semantics turn on them.

The samples sit in one module per lowering module (`pointwise.py` for `lower_pointwise.py`, ...), on the parts in
`kit.py`. Adding a lowering without adding its sample fails `test_every_lowered_op_has_a_sample`.
"""
from __future__ import annotations

from .cat import CAT_SAMPLES
from .gates import GATES_SAMPLES
from .kit import Sample
from .pointwise import BACKSLASH_CONTINUED_SOURCE, POINTWISE_SAMPLES
from .reductions import NARROW_INTEGER_MAX_MIN, REDUCTION_SAMPLES
from .padding import PADDING_SAMPLES
from .scatter import SCATTER_SAMPLES
from .views import VIEW_SAMPLES
from .writes import WRITES_SAMPLES

SAMPLES: dict[str, list[Sample]] = {**POINTWISE_SAMPLES, **REDUCTION_SAMPLES, **VIEW_SAMPLES, **CAT_SAMPLES,
                                    **PADDING_SAMPLES, **WRITES_SAMPLES, **GATES_SAMPLES, **SCATTER_SAMPLES}

__all__ = ["BACKSLASH_CONTINUED_SOURCE", "NARROW_INTEGER_MAX_MIN", "SAMPLES", "Sample"]
