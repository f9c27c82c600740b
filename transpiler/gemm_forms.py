"""On CUDA, each GEMM by a constant weight runs in whichever of ATen's forms the GPU ran fastest at convert time.

cuBLAS picks its kernel by the operands' layouts and whether a bias rides in its epilogue, and for some shapes
the pick is poor. On an H100, BERT-base's 9x3072 @ 3072x768 in float32 (batch 1, 9 tokens) took 33.8 us as
`linear(x, W, b)`, 19.8 without the bias and 13.7 as `matmul(x, W^T)` with W^T stored [K, N], weights cold in L2;
its 9x768 @ 768x768 took 10.3 against 8.0. A bias out of the GEMM is an ordinary pointwise add that fuses into
the kernel after it (the residual add and LayerNorm, the GELU), so there it is free. The forms:

    linear       linear(x, W, b)                     W as [N, K], the bias in cuBLAS's epilogue
    linear_add   linear(x, W) + b                    the bias in the generated kernel that reads the output
    kn           matmul(x, Wt) (+ b)                 Wt = W^T stored contiguous [K, N], once
    skinny       a generated Triton GEMM for at most 16 rows, the bias in its epilogue (emitters/triton_gemm.py):
                 offered by the face as `generated` when it generates Triton kernels; the node stays a `linear`
                 marked with the form and its timed configuration until after fusion (transpiler/gemm_kernels.py)

Each is timed on the GPU once per shape (`choose`): a CUDA graph of calls per form, each reading its own copy of
the operands, so the weights come from memory as they do in a model whose weights do not fit in L2; the forms'
graphs are replayed in turns and their medians compared (transpiler/timing.py). Where the GEMM's output feeds
something other than pointwise ops (which would take the bias in), the add's own kernel is timed with the form.
The package records the choice; a load never times anything. With choices="fixed" each GEMM keeps its own form.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import torch

from .constant_gemm import ConstantGemm, constant_gemm, features, transposed_weight
from .ir import (GENERATED_GEMM, Attr, Graph, Node, Type, Value, blocks, literals as literals_of, readers as readers_of,
                 weight_names)
from .op_table import POINTWISE, lookup
from .symbolic import at_example
from . import timing

FORMS = ("linear", "linear_add", "kn")
GENERATED = GENERATED_GEMM
DTYPES = ("float32", "float16", "bfloat16")
MODE = "auto"  # "auto": timed on CUDA; "never"; or a form name: every GEMM takes it, on any device (for tests)
# The generated form's hook: (rows, k, n, dtype, has_bias, timed) -> (seconds or None, launch configuration), or None
# where the template does not fit; without timing, its default configuration
Generated = Callable[[int, int, int, str, bool, bool], Optional[tuple[Optional[float], dict]]]
MARGIN = 0.97  # another form must take at most this share of the model's own form's time (~1% noise)
MAX_TIMED_BYTES = 2 ** 30  # a range's end whose activation is larger is not timed (a GEMM there is bound anyway)

_LINEAR = "aten::linear(Tensor input, Tensor weight, Tensor? bias=None) -> Tensor"
_MATMUL = "aten::matmul(Tensor self, Tensor other) -> Tensor"
_ADD = "aten::add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"

_timed: dict[tuple, dict[str, float]] = {}  # per process: (rows, K, N, dtype, bias, bias fuses, device) -> s


def gemm_forms(graph: Graph, device_type: str, dims: Optional[dict[str, tuple]] = None,
               generated: Optional[Generated] = None) -> dict[str, int]:
    """Rewrite in place; returns how many GEMMs took each form other than the model's own. `dims`: the dynamic
    dims as name -> (min, max, example); each GEMM is timed at the example and at the ranges' ends. `generated`:
    the generated form's hook, where the face offers one."""
    if MODE == "never" or (MODE == "auto" and (device_type != "cuda" or not torch.cuda.is_available())):
        return {}
    weights, literals = weight_names(graph), literals_of(graph)
    readers = readers_of(graph)
    counts: dict[str, int] = {}
    for block in blocks(graph):
        out: list[Node] = []
        for node in block.nodes:
            gemm = constant_gemm(node, weights, literals)
            if gemm is None or gemm.x.type.dtype not in DTYPES or (MODE == "auto" and gemm.x.type.device != "cuda"):
                out.append(node)
                continue
            bias_fuses = _bias_fuses(node, readers)
            template = _template(gemm, generated)
            form = (MODE if MODE in FORMS or (MODE == GENERATED and template) else
                    "linear" if MODE == GENERATED else choose(gemm, bias_fuses, timing.range_points(dims), template))
            if form == "linear_add" and gemm.bias is None:  # no bias to take out: that is linear
                form = "linear"
            if form == _own_form(node, gemm):
                out.append(node)
                continue
            out += _rewrite(graph, weights, node, gemm, form,
                            template(MODE != GENERATED) if form == GENERATED else None)
            counts[form] = counts.get(form, 0) + 1
        block.nodes = out
    return counts


def _own_form(node: Node, gemm: ConstantGemm) -> str:
    """The form the model wrote: an addmm counts as its own (untimed) form, so it is always rewritten to the best."""
    return lookup(node.op).gemm_form


def _bias_fuses(node: Node, readers: dict[int, list]) -> bool:
    """Whether every reader of the GEMM's output is a pointwise op: a generated kernel that takes a bias add in."""
    users = readers.get(node.output.id, [])
    return bool(users) and all(u is not None and lookup(u.op, u.attrs.get(Attr.SCHEMA, "")).category == POINTWISE
                               for u in users)


def _template(gemm: ConstantGemm, generated: Optional[Generated]) -> Optional[Callable[[bool], tuple]]:
    """The generated form's hook bound to this GEMM, where it has static rows and the template fits it."""
    shape = gemm.x.type.shape
    if generated is None or not all(isinstance(d, int) for d in shape):
        return None
    args = (math.prod(shape[:-1]), shape[-1], features(gemm), gemm.x.type.dtype, gemm.bias is not None)
    return (lambda timed: generated(*args, timed)) if generated(*args, False) is not None else None


def choose(gemm: ConstantGemm, bias_fuses: bool, points: list[dict[str, int]],
           template: Optional[Callable[[bool], tuple]] = None) -> str:
    """The fastest form for this GEMM's shapes on the current GPU: at each point of the dynamic range (the
    example first), the one never far behind the fastest; the model's own unless another is clearly faster.
    (An addmm is judged as its closest form, kn, and always rewritten: the forms compared are all there is.)"""
    own = "linear" if not gemm.transposed else "kn"
    shapes = [at_example(gemm.x.type.shape, sizes) for sizes in points]
    if shapes[0] is None:  # an opaque size: nothing to time at, so the model's own form
        return own
    k, n, has_bias = shapes[0][-1], features(gemm), gemm.bias is not None
    itemsize = getattr(torch, gemm.x.type.dtype).itemsize
    rows = list(dict.fromkeys(math.prod(shape[:-1]) for shape in shapes  # the example, then ends that fit memory
                              if shape is not None and math.prod(shape) * itemsize <= MAX_TIMED_BYTES))
    what = (f"GEMM form, {'/'.join(map(str, rows))}x{k} -> {n} {gemm.x.type.dtype}{', bias' if has_bias else ''}"
            f"{' (fuses after)' if has_bias and bias_fuses else ''}")
    if timing.fixed():
        return timing.take_fixed(what, own, own).chosen
    seconds = [_timed_at(m, k, n, gemm.x.type.dtype, has_bias, bias_fuses) for m in rows]
    generated = _timed_template(template) if template is not None and len(rows) == 1 else None
    if generated is not None and generated[0] is not None and seconds[0]:
        seconds[0] = dict(seconds[0], **{GENERATED: generated[0]})
    return timing.settle_over(what, seconds, own, MARGIN).chosen  # none timed: the model's own


def _timed_template(template: Callable[[bool], tuple]) -> Optional[tuple]:
    """The generated form's (seconds, configuration) at this shape; None where timing it fails (a Triton that
    cannot build it here): the GEMM keeps ATen's forms, which are timed apart, and the other GEMMs their choices."""
    try:
        return template(True)
    except Exception:  # noqa: BLE001 - whatever the template's build or launch raised
        return None


def _timed_at(rows: int, k: int, n: int, dtype: str, has_bias: bool, bias_fuses: bool) -> dict[str, float]:
    """Seconds per call of each form at one shape, timed once per shape and process (none where it cannot be)."""
    key = (rows, k, n, dtype, has_bias, bias_fuses, torch.cuda.current_device() if torch.cuda.is_available() else None)
    if key not in _timed:
        try:
            forms = FORMS if has_bias else ("linear", "kn")
            micros = _time_forms(forms, rows, k, n, getattr(torch, dtype), has_bias, bias_fuses)
        except Exception:  # noqa: BLE001 - a form that cannot be timed here (memory, a capture error)
            micros = {}
        _timed[key] = {form: us / 1e6 for form, us in micros.items()}
    return _timed[key]


def _time_forms(forms: tuple, rows: int, k: int, n: int, dtype: torch.dtype, has_bias: bool,
                bias_fuses: bool) -> dict[str, float]:
    """GPU microseconds per call of each form, weights cold in L2 (each call reads its own operands)."""
    copies = timing.cold_copies((n * k + rows * k) * dtype.itemsize)
    calls: dict[str, list] = {form: [] for form in forms}
    for _ in range(copies):
        x = torch.randn(rows, k, device="cuda", dtype=dtype)
        w = torch.randn(n, k, device="cuda", dtype=dtype) / math.sqrt(k)
        b = torch.randn(n, device="cuda", dtype=dtype) if has_bias else None
        wt = w.t().contiguous() if "kn" in forms else None
        for form in forms:
            calls[form].append(_form_call(form, x, wt if form == "kn" else w, b, bias_fuses))
    return timing.graphs_gpu_us(calls)


def _form_call(form: str, x, w, b, bias_fuses: bool) -> Callable[[], object]:
    add = b is not None and not bias_fuses and form != "linear"  # else the bias rides in a kernel that runs anyway
    if form == "linear":
        return lambda: torch.nn.functional.linear(x, w, b)
    gemm = (lambda: torch.nn.functional.linear(x, w)) if form == "linear_add" else (lambda: torch.matmul(x, w))
    return (lambda: gemm() + b) if add else gemm


def _rewrite(graph: Graph, weights: dict[int, str], node: Node, gemm: ConstantGemm, form: str,
             template: Optional[tuple]) -> list[Node]:
    """`node` as `form`: the GEMM, then the bias as a pointwise add where the form takes it out. The generated
    form is a `linear` marked with it and its configuration (`template`'s), made a kernel after fusion."""
    nodes: list[Node] = []
    weight = gemm.weight
    if (form == "kn") != gemm.transposed:  # the form wants the weight in the other layout: stored so, once
        constant, weight = transposed_weight(graph, weights, weight)
        nodes.append(constant)
    result = node.output
    bias_after = gemm.bias is not None and form not in ("linear", GENERATED)
    product = Value(f"{result.name}_product", result.type) if bias_after else result
    attrs = {Attr.FROM_OPS: [node.op], Attr.GEMM_FORM: form}
    if form == GENERATED:
        attrs[Attr.GEMM_CONFIG] = template[1]
    if form == "kn":
        nodes.append(Node("aten::matmul", [gemm.x, weight], [product], source=node.source,
                          attrs=dict(attrs, **{Attr.SCHEMA: _MATMUL})))
    else:
        bias = gemm.bias if form in ("linear", GENERATED) else None
        if bias is None:
            bias = Value(f"{result.name}_no_bias", Type("None"))
            nodes.append(Node("prim::Constant", [], [bias], attrs={Attr.VALUE: None}))
        nodes.append(Node("aten::linear", [gemm.x, weight, bias], [product], source=node.source,
                          attrs=dict(attrs, **{Attr.SCHEMA: _LINEAR})))
    if bias_after:
        alpha = Value(f"{result.name}_alpha", Type("int"))
        nodes += [Node("prim::Constant", [], [alpha], attrs={Attr.VALUE: 1}),
                  Node("aten::add.Tensor", [product, gemm.bias, alpha], [result], source=node.source,
                       attrs={Attr.SCHEMA: _ADD, Attr.SYNTHETIC: True})]
    return nodes
