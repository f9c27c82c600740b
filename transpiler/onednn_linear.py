"""On the CPU, a GEMM by a constant weight runs as oneDNN's `mkldnn::_linear_pointwise` where that is faster, with
the activation after it as the GEMM's own epilogue.

ATen's `linear` on the CPU goes to an sgemm that, on this project's x86 machines (AVX-512, torch's pip build), took
2.0-2.1x as long as oneDNN's matmul on the same operands (BERT's 128x256 @ 256x1024: 326 against 157 us on two
threads), and a GELU after it costs a pass over the output that oneDNN folds into the GEMM's stores (+10 us there,
where a separate kernel took 40). Which is faster depends on the CPU and the shape, so it is timed here, once per
shape, while converting (`choose`); the package records the choice and a load never times anything.

    y = linear(x, W, b); z = gelu(y)   ->   P = mkldnn::_reorder_linear_weight(W, rows)      (once, at load)
                                            z = mkldnn::_linear_pointwise(x, P, b, "gelu", [], "none")

The weight is reordered into oneDNN's blocked layout once, at load (a packed constant of the plan, as the fused
convolutions' are; the package keeps the plain tensor): given a plain weight, oneDNN reorders it on every call,
and on BERT's 64x768 -> 3072 (one thread, interleaved medians) that took 2.3x the prepacked call's time (7.6
against 3.3 ms on the loaded project machine), where ONNX Runtime's prepacked Gemm took 3.5. The reorder takes
the example's row count as a hint for the blocking; the packed weight serves every row count.

The GEMMs: `linear(x, W, b)`; `matmul(x, W)` and `mm(x, W)`, and `addmm(b, x, W)` with beta = alpha = 1 (the
transformers Conv1D of GPT-2), whose weight is stored transposed, once, as linear's. Only float32/bfloat16, with a
constant weight (and bias): frozen, the same on every call. The activation joins only when the GEMM's output has
no other reader.
"""
from __future__ import annotations

import math
from typing import Optional

import torch

from .constant_gemm import ConstantGemm, constant_gemm, features, transposed_weight
from .ir import Attr, Graph, Node, Type, Value, blocks, literals as literals_of, readers as readers_of, weight_names
from .packed_params import AT_LOAD
from .symbolic import at_example
from . import timing

OP = "mkldnn::_linear_pointwise"
SCHEMA = ("mkldnn::_linear_pointwise(Tensor X, Tensor W, Tensor? B, str attr, Scalar?[] scalars, "
          "str? algorithm) -> Tensor Y")
REORDER_OP = "mkldnn::_reorder_linear_weight"
REORDER_SCHEMA = "mkldnn::_reorder_linear_weight(Tensor self, int? batch_size=None) -> Tensor Y"
DTYPES = ("float32", "bfloat16")
# epilogue op -> oneDNN post-op name; gelu's `approximate` ("none" or "tanh") becomes its algorithm
EPILOGUES = {"aten::relu": "relu", "aten::gelu": "gelu", "aten::tanh": "tanh", "aten::sigmoid": "sigmoid",
             "aten::silu": "swish", "aten::hardswish": "hardswish"}
MODE = "auto"  # "auto": where timing says oneDNN is faster; "always"; "never"
# oneDNN must take at most this share of ATen's time. With its weight prepacked it was the faster on each of BERT's
# GEMMs (one thread, interleaved medians: 64x768 -> 768, -> 3072 and 3072 -> 768 took 0.77, 0.38 and 0.87 of
# ATen's time, and in the model 0.83 of ATen's per multiply-add), so a tie goes to oneDNN.
MARGIN = 1.0
# choices="fixed": oneDNN from this many multiply-adds a call, ATen's linear below. On this project's AVX-512
# machine (one thread, interleaved medians) oneDNN took 1.8-3.9x ATen's time under 0.2M (2x256 -> 256), 1.1-1.2x at
# 0.6-2M, and 0.73-0.92x from 5M (9x768 -> 768, BERT's shapes)
FIXED_MIN_MACS = 4 * 2 ** 20

_chosen: dict[tuple, timing.Choice] = {}  # per process: (rows, in, out, dtype, bias, threads) -> the timed choice


def onednn_linear(graph: Graph, device_type: str, sizes: Optional[dict[str, int]] = None) -> int:
    """Rewrite in place; returns how many GEMMs now run through oneDNN."""
    if device_type != "cpu" or MODE == "never" or not _available():
        return 0
    weights, literals = weight_names(graph), literals_of(graph)
    readers = readers_of(graph)
    done = 0
    for block in blocks(graph):
        out: list[Node] = []
        packed: dict[tuple, Value] = {}  # (stored weight, rows hint) -> its packed form: a shared weight, once
        for node in block.nodes:
            if node.attrs.get(Attr.FOLDED_INTO_LINEAR):
                continue
            gemm = _as_linear(node, weights, literals)
            if gemm is not None and choose(gemm.x.type, features(gemm), gemm.bias is not None, sizes or {}):
                weight, stored, prelude = gemm.weight, weights[gemm.weight.id], []
                if gemm.transposed:  # x @ W with a constant W: linear's weight is W's transpose, stored once as such
                    constant, weight = transposed_weight(graph, weights, weight)
                    stored = constant.attrs[Attr.WEIGHT]
                    prelude.append(constant)
                epilogue = _epilogue(node, readers, literals)
                reorder, packed_weight = _reorder(weight, stored, _rows(gemm.x.type, sizes or {}), packed)
                out += prelude + reorder + _rewrite(node, gemm.x, packed_weight, gemm.bias, epilogue)
                done += 1
            else:
                out.append(node)
        block.nodes = out
    return done


def _available() -> bool:
    ops = torch.ops.mkldnn
    return torch.backends.mkldnn.is_available() and all(hasattr(ops, name) for name in (
        "_linear_pointwise", "_reorder_linear_weight"))


def _rows(x: Type, sizes: dict[str, int]) -> Optional[int]:
    """The GEMM's row count at the example (the reorder's blocking hint), or None where a dim is opaque."""
    shape = at_example(x.shape, sizes)
    return math.prod(shape[:-1]) if shape is not None else None


def _reorder(weight: Value, stored: str, rows: Optional[int], packed: dict[tuple, Value]) -> tuple[list[Node], Value]:
    """The nodes that reorder `weight` (the package's weight `stored`) into oneDNN's layout at load (build_plan puts
    them in the plan's "packed" list), and the packed value; no nodes when an earlier GEMM of the block already
    packed it so."""
    key = (stored, rows)
    if key in packed:
        return [], packed[key]
    hint = Value(f"{weight.name}_onednn_rows{rows}", Type("int") if rows is not None else Type("None"))
    packed[key] = Value(f"{weight.name}_onednn_{rows}", weight.type)
    return [Node("prim::Constant", [], [hint], attrs={Attr.VALUE: rows}),
            Node(REORDER_OP, [weight, hint], [packed[key]], attrs={Attr.SCHEMA: REORDER_SCHEMA, AT_LOAD: True})], \
        packed[key]


def _as_linear(node: Node, weights: dict[int, str], literals: dict[int, object]) -> Optional[ConstantGemm]:
    """The GEMM by a constant weight `node` computes, when oneDNN can run it: float32 or bfloat16, on the CPU."""
    gemm = constant_gemm(node, weights, literals)
    if gemm is None or gemm.x.type.dtype not in DTYPES or gemm.x.type.device != "cpu":
        return None
    return gemm


def choose(x: Type, features: int, has_bias: bool, sizes: dict[str, int]) -> bool:
    """Whether oneDNN's linear beats ATen's for `x` (at the example's dims) times a weight of `features` outputs,
    here: each timed on random operands of the shape."""
    if MODE == "always":
        return True
    shape = at_example(x.shape, sizes)
    if shape is None:  # an opaque size: nothing to time at, so ATen's own
        return False
    rows = math.prod(shape[:-1])
    what = f"oneDNN or ATen linear, {rows}x{shape[-1]} -> {features} {x.dtype}{', bias' if has_bias else ''}"
    fixed = "onednn" if rows * shape[-1] * features >= FIXED_MIN_MACS else "aten"
    if timing.fixed():
        return timing.take_fixed(what, fixed, "aten").chosen == "onednn"
    key = (rows, shape[-1], features, x.dtype, has_bias, torch.get_num_threads())
    if key in _chosen:  # timed once per shape and process; recorded in every conversion that asks
        return timing.record(_chosen[key]).chosen == "onednn"
    dtype = getattr(torch, x.dtype)
    a, b = torch.randn(rows, shape[-1], dtype=dtype), torch.randn(features, shape[-1], dtype=dtype)
    bias = torch.randn(features, dtype=dtype) if has_bias else None
    packed = torch.ops.mkldnn._reorder_linear_weight(b, rows)
    candidates = {"aten": lambda: torch.nn.functional.linear(a, b, bias),
                  "onednn": lambda: torch.ops.mkldnn._linear_pointwise(a, packed, bias, "none", [], "")}
    choice = timing.settle_timed(what, candidates, "aten", MARGIN, fixed)
    if not choice.busy:  # a busy machine's fixed answer is not kept: a later conversion times it again
        _chosen[key] = choice
    return choice.chosen == "onednn"


def _epilogue(node: Node, readers: dict[int, list], literals: dict[int, object]) -> Optional[tuple[Node, str, str]]:
    """(the activation node, oneDNN's post-op, its algorithm) when the GEMM's one reader is an activation. One in a
    branch or loop body the GEMM is outside of then runs where the GEMM does: pure, and of a value fixed there, it
    gives what it would have given inside (blocks are rewritten outermost first, so it is gone before its own
    block is)."""
    users = readers.get(node.output.id, [])
    if len(users) != 1 or users[0] is None:
        return None
    act = users[0]
    attr = EPILOGUES.get(act.op)
    if (attr is None or act.inputs[0] is not node.output
            or act.output.type.dtype != node.output.type.dtype):
        return None
    if attr == "gelu":
        approximate = literals.get(act.inputs[1].id, "none") if len(act.inputs) > 1 else "none"
        if approximate not in ("none", "tanh"):
            return None
        return act, attr, approximate
    if len(act.inputs) != 1:
        return None
    return act, attr, ""


def _rewrite(node: Node, x: Value, weight: Value, bias: Optional[Value],
             epilogue: Optional[tuple[Node, str, str]]) -> list[Node]:
    constants, args = [], []
    if bias is None:
        bias = Value(f"{node.output.name}_no_bias", Type("None"))
        constants.append(Node("prim::Constant", [], [bias], attrs={Attr.VALUE: None}))
    attr, algorithm, result = "none", "", node.output
    if epilogue is not None:
        act, attr, algorithm = epilogue
        act.attrs[Attr.FOLDED_INTO_LINEAR] = True
        result = act.output
    for name, value, kind in (("attr", attr, "str"), ("scalars", [], "List"), ("algorithm", algorithm, "str")):
        v = Value(f"{result.name}_{name}", Type(kind, elems=(Type("Optional", elems=(Type("Scalar"),)),))
                  if kind == "List" else Type(kind))
        constants.append(Node("prim::Constant", [], [v], attrs={Attr.VALUE: value}))
        args.append(v)
    fused = Node(OP, [x, weight, bias, *args], [result], source=node.source,
                 attrs={Attr.SCHEMA: SCHEMA, Attr.FROM_OPS: [node.op] + ([epilogue[0].op] if epilogue else [])})
    return constants + [fused]
