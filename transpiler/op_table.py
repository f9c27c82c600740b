"""The op table: for each TorchScript op (by exact overload name), its category and how it lowers.

Categories:
  pointwise   elementwise math; fuses into generated kernels
  reduction   reduces over dims; fuses with pointwise prologues and epilogues
  view        changes indexing only (reshape, permute, slice...); becomes indexing inside kernels
  extern      has a vendor library (matmul, conv): runs through ATen by design
  host        control flow and scalar/list bookkeeping, run by the runtime itself
  fallback    not in the table: runs through ATen by its schema and is counted in the report

A backend turns an op into kernel code only through a lowering registered here; until then an op of a kernel
category runs through ATen as a fallback, and the report says so.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Optional

import torch

POINTWISE, REDUCTION, VIEW, EXTERN, HOST, FALLBACK = "pointwise", "reduction", "view", "extern", "host", "fallback"


@dataclass(frozen=True)
class OpInfo:
    name: str
    category: str
    lowering: Optional[Callable] = None  # filled in by the kernel IR's lowering module
    # its output's size depends on its inputs' values, not their shapes (a mask's count): "tensor" for ops whose
    # tensor output's size does (every size computed from it is opaque: transpiler/data_sizes.py), "scalar" for ops
    # that read a number out of a tensor; shape inference runs such models on other values too
    data_dependent_size: str = ""
    # nearly equal inputs can give it different outputs (a comparison, an argmax, a sort's order, NMS, a floor):
    # where a package first differs from TorchScript at such an op, rounding decided it, not a wrong kernel
    discontinuous: bool = False
    # why the op computes in float32 when a package runs in reduced precision (transpiler/precision.py): its
    # statistics or accumulators overflow or lose their range in float16/bfloat16 (autocast's float32 list); "" runs
    # it in the package's precision
    keeps_fp32: str = ""


OP_TABLE: dict[str, OpInfo] = {}


# Ops whose output sizes depend on data: boolean-mask indexing (aten::index.Tensor with a bool index; with integer
# indices its size is theirs), nonzero and its forms, unique, NMS; and the host ops that read a number out of a
# tensor, which a slice, a topk or a loop bound may then use.
DATA_DEPENDENT_SIZE = dict.fromkeys("""
    aten::index.Tensor aten::nonzero aten::nonzero_numpy aten::argwhere aten::where aten::masked_select
    aten::unique aten::_unique aten::_unique2 aten::unique_dim aten::unique_consecutive aten::unique_dim_consecutive
    aten::repeat_interleave.Tensor aten::repeat_interleave.self_Tensor aten::bincount torchvision::nms
""".split(), "tensor") | dict.fromkeys("""
    aten::item aten::Int.Tensor aten::Float.Tensor aten::ScalarImplicit aten::IntImplicit aten::tolist
""".split(), "scalar")


# Ops whose outputs jump where their inputs cross a boundary: comparisons, arg-reductions, orders, roundings, casts
# to integers, and every op whose output size depends on data. (Verification: jit2triton/verify.py first_divergence.)
DISCONTINUOUS = frozenset("""
    aten::eq.Tensor aten::eq.Scalar aten::ne.Tensor aten::ne.Scalar aten::gt.Tensor aten::gt.Scalar aten::ge.Tensor
    aten::ge.Scalar aten::lt.Tensor aten::lt.Scalar aten::le.Tensor aten::le.Scalar aten::argmax aten::argmin
    aten::max.dim aten::min.dim aten::sort aten::sort.stable aten::argsort aten::argsort.stable aten::topk
    aten::kthvalue aten::median.dim aten::mode aten::floor aten::ceil aten::round aten::round.decimals aten::trunc
    aten::sign aten::floor_divide aten::floor_divide.Scalar aten::div.Tensor_mode aten::div.Scalar_mode
    aten::remainder.Tensor aten::remainder.Scalar aten::fmod.Tensor aten::fmod.Scalar aten::searchsorted.Tensor
    aten::bucketize.Tensor aten::histc aten::threshold torchvision::roi_align torchvision::roi_pool
""".split()) | frozenset(DATA_DEPENDENT_SIZE)


# Ops that run in float32 inside a reduced-precision package, with the reason the report gives. GEMMs and
# convolutions are not here: they run in the reduced type, and ATen's (cuBLAS, cuDNN, oneDNN) accumulate in float32.
KEEPS_FP32 = dict.fromkeys("aten::softmax.int aten::log_softmax.int aten::logsumexp".split(),
                           "sums exponentials") \
    | dict.fromkeys("aten::layer_norm aten::group_norm aten::batch_norm".split(),
                    "normalization statistics (mean, variance)") \
    | dict.fromkeys("""aten::sum aten::sum.dim_IntList aten::mean aten::mean.dim aten::var aten::var.dim
        aten::var.correction aten::std aten::std.dim aten::std.correction aten::prod aten::prod.dim_int aten::cumsum
        aten::norm.ScalarOpt_dim aten::linalg_vector_norm""".split(), "a large sum or product") \
    | dict.fromkeys("""aten::exp aten::expm1 aten::log aten::log1p aten::pow.Tensor_Scalar aten::pow.Tensor_Tensor
        aten::pow.Scalar aten::reciprocal aten::rsqrt""".split(), "overflows or loses its range in float16")


def register(category: str, names: str) -> None:
    for name in names.split():
        OP_TABLE[name] = OpInfo(name, category, data_dependent_size=DATA_DEPENDENT_SIZE.get(name, ""),
                                discontinuous=name in DISCONTINUOUS, keeps_fp32=KEEPS_FP32.get(name, ""))


register(POINTWISE, """
    aten::add.Tensor aten::add.Scalar aten::sub.Tensor aten::sub.Scalar aten::rsub.Scalar aten::rsub.Tensor
    aten::mul.Tensor aten::mul.Scalar aten::div.Tensor aten::div.Scalar aten::div.Tensor_mode aten::neg
    aten::pow.Tensor_Scalar aten::pow.Tensor_Tensor aten::pow.Scalar aten::sqrt aten::rsqrt aten::exp aten::log
    aten::log1p aten::expm1 aten::abs aten::sin aten::cos aten::tan aten::tanh aten::sigmoid aten::erf
    aten::relu aten::relu6 aten::gelu aten::silu aten::hardswish aten::hardsigmoid aten::hardtanh aten::mish
    aten::elu aten::leaky_relu aten::softplus aten::clamp aten::clamp_min aten::clamp_max aten::clamp.Tensor
    aten::where.self aten::where.ScalarOther aten::where.ScalarSelf aten::where.Scalar aten::masked_fill.Scalar
    aten::masked_fill.Tensor aten::eq.Tensor aten::eq.Scalar aten::ne.Tensor aten::ne.Scalar aten::lt.Tensor
    aten::lt.Scalar aten::le.Tensor aten::le.Scalar aten::gt.Tensor aten::gt.Scalar aten::ge.Tensor aten::ge.Scalar
    aten::logical_not aten::logical_and aten::logical_or aten::bitwise_not aten::maximum aten::minimum
    aten::__and__.Tensor aten::bitwise_and.Tensor aten::__or__.Tensor aten::bitwise_or.Tensor
    aten::reciprocal aten::floor aten::ceil aten::round aten::sign aten::remainder.Tensor aten::remainder.Scalar
    aten::floor_divide aten::floor_divide.Scalar aten::to.dtype aten::to.other aten::to.dtype_layout
    aten::to.device aten::type_as aten::dropout aten::feature_dropout aten::alpha_dropout aten::detach
    aten::clone aten::contiguous aten::lerp.Scalar aten::addcmul aten::addcdiv aten::fill.Scalar
    aten::zeros_like aten::ones_like aten::full_like aten::zeros aten::ones aten::full aten::new_zeros aten::new_ones
    aten::new_full aten::isnan aten::isinf aten::nan_to_num aten::arange
    aten::arange.start aten::arange.start_step
    aten::softmax.int aten::log_softmax.int aten::layer_norm aten::group_norm aten::batch_norm
    aten::embedding aten::gather aten::index_select aten::cat aten::stack
    aten::select_scatter aten::slice_scatter
    aten::prelu aten::roll aten::pad aten::constant_pad_nd aten::copy aten::fill.Tensor aten::tensor.int
    aten::tensor.float aten::tensor.bool aten::glu aten::div.Scalar_mode aten::max.other aten::min.other
    aten::log2 aten::exp2
""")

register(REDUCTION, """
    aten::sum aten::sum.dim_IntList aten::mean aten::mean.dim aten::amax aten::amin aten::max aten::min
    aten::max.dim aten::min.dim aten::argmax aten::argmin aten::var aten::var.dim aten::var.correction
    aten::std aten::std.dim aten::std.correction aten::prod aten::prod.dim_int aten::any aten::any.dim
    aten::all aten::all.dim aten::norm.ScalarOpt_dim aten::linalg_vector_norm aten::logsumexp
    aten::cumsum aten::adaptive_avg_pool2d aten::adaptive_avg_pool1d aten::avg_pool2d aten::max_pool2d
""")

register(VIEW, """
    aten::view aten::reshape aten::flatten.using_ints aten::unflatten.int aten::permute aten::transpose.int
    aten::t aten::expand aten::expand_as aten::slice.Tensor aten::select.int aten::squeeze aten::squeeze.dim
    aten::unsqueeze aten::narrow aten::chunk aten::split.Tensor aten::split_with_sizes aten::unbind.int
    aten::view_as aten::reshape_as aten::numpy_T aten::movedim.int aten::split.sizes aten::tensor_split.sections
""")

register(EXTERN, """
    aten::matmul aten::mm aten::bmm aten::addmm aten::linear aten::baddbmm aten::einsum aten::conv1d aten::conv2d
    aten::conv3d aten::_convolution aten::conv_transpose1d aten::conv_transpose2d.input aten::conv_transpose3d.input
    aten::convolution aten::conv1d.padding aten::conv2d.padding aten::conv3d.padding aten::conv_tbc
    aten::lstm.input aten::gru.input
    aten::scaled_dot_product_attention aten::topk aten::sort aten::nonzero aten::index.Tensor aten::unique
    mkldnn::_linear_pointwise mkldnn::_convolution_pointwise mkldnn::_convolution_pointwise.binary
""")

# Quantized GEMMs, convolutions, RNNs and embeddings over packed weights (transpiler/packed_params.py): FBGEMM, oneDNN or
# QNNPACK kernels, as the quantized engine picks
register(EXTERN, """
    quantized::linear quantized::linear_relu quantized::linear_dynamic quantized::linear_relu_dynamic
    quantized::linear_dynamic_fp16 quantized::linear_relu_dynamic_fp16 quantized::linear_leaky_relu
    quantized::linear_tanh quantized::conv1d quantized::conv1d_relu quantized::conv2d.new quantized::conv2d_relu.new
    quantized::conv2d_add quantized::conv2d_add_relu quantized::conv3d.new quantized::conv3d_relu.new
    quantized::conv_transpose1d quantized::conv_transpose2d quantized::conv_transpose3d quantized::conv2d_dynamic
    aten::quantized_lstm.input aten::quantized_lstm.data aten::quantized_gru.input aten::quantized_gru.data
    quantized::quantized_lstm_cell_dynamic quantized::quantized_gru_cell_dynamic quantized::embedding_byte
    quantized::embedding_bag_byte
""")


def lookup(op: str, schema: str = "") -> OpInfo:
    """The table entry of `op`; ops outside the table are host ops when they touch no tensor, else fallback."""
    info = OP_TABLE.get(op)
    if info is not None:
        return info
    return OpInfo(op, HOST if is_host_op(op, schema) else FALLBACK, data_dependent_size=DATA_DEPENDENT_SIZE.get(op, ""),
                  discontinuous=op in DISCONTINUOUS)


_HOST_NAMESPACES = ("prim::",)
_HOST_TENSOR_READERS = {"aten::size.int", "aten::size", "aten::dim", "aten::len.Tensor", "aten::Int.Tensor",
                        "aten::Float.Tensor", "aten::Bool.Tensor", "aten::ScalarImplicit", "aten::item", "aten::numel",
                        "prim::device", "prim::dtype", "aten::is_floating_point", "aten::__is__", "aten::__isnot__"}


def is_host_op(op: str, schema: str = "") -> bool:
    if op.startswith(_HOST_NAMESPACES) or op in _HOST_TENSOR_READERS:
        return True
    if schema:
        returns = schema.rsplit("->", 1)[-1]
        return "Tensor" not in returns and "Tensor" not in schema.split("->", 1)[0]
    return False


_RETURNS_INPUT = {"aten::to.dtype", "aten::to.other", "aten::to.dtype_layout", "aten::to.device", "aten::type_as",
                  "aten::contiguous", "aten::detach"}


def may_alias(op: str) -> bool:
    """Whether the op's result may share memory with its first input (views, and casts that can be no-ops)."""
    return op in _RETURNS_INPUT or lookup(op).category == VIEW


def is_view(op: str) -> bool:
    return lookup(op).category == VIEW


@functools.lru_cache(maxsize=None)
def schema_of(op: str) -> str:
    """The full schema of an exact overload (`aten::ge.Scalar`), or "" when torch has no such overload."""
    base, _, overload = op.partition(".")
    for schema in torch._C._jit_get_schemas_for_operator(base):
        if schema.overload_name == overload:
            return str(schema)
    return ""


# --- what a schema says about memory: one reading of its alias annotations for every pass ------------------------

@functools.lru_cache(maxsize=None)
def writes_in_place(schema: str) -> str:
    """What an op writes in place, by its schema's alias annotations: "tensor", "container" (list, dict) or ""."""
    if not schema or "!" not in schema:
        return ""
    written = [a.type for a in torch._C.parse_schema(schema).arguments if a.alias_info is not None
               and a.alias_info.is_write]
    if not written:
        return ""
    return "tensor" if any("Tensor" in str(t) for t in written) else "container"


@functools.lru_cache(maxsize=None)
def returns_alias(schema: str) -> bool:
    """Whether the op's result shares memory with an input by its schema (`-> Tensor(a)`: a view such as diagonal;
    `-> Tensor(a!)`: an in-place op's result is its input)."""
    return bool(schema) and any(r.alias_info is not None for r in torch._C.parse_schema(schema).returns)
