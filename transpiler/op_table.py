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
from dataclasses import dataclass, replace
from typing import Callable, Optional

import torch

POINTWISE, REDUCTION, VIEW, EXTERN, HOST, FALLBACK = "pointwise", "reduction", "view", "extern", "host", "fallback"


@dataclass(frozen=True)
class OpInfo:
    """Everything a pass or a runtime asks about an op. Each fact is declared once, below, by `register` (an op's
    category, with any facts of its own) or `facts` (a fact shared across categories, or of an op outside the
    table); passes ask `lookup(op)`, never a set of their own (tests/test_op_facts.py), and the facts the runtimes
    need are generated into deploy/op_facts.py and deploy/cpp/src/op_facts.h (transpiler/op_facts.py)."""
    name: str
    category: str
    lowering: Optional[Callable] = None  # filled in by the kernel IR's lowering module
    # its output's size depends on its inputs' values, not their shapes (a mask's count): "tensor" for ops whose
    # tensor output's size does (every size computed from it is opaque: transpiler/data_sizes.py), "scalar" for ops
    # that read a number out of a tensor; shape inference runs such models on other values too
    data_dependent_size: str = ""
    # the input positions of the boolean masks whose true entries set its output's count (nonzero's input), which
    # conversion's count draws thin (transpiler/count_draws.py); boolean indexing's masks sit in its index list
    count_masks: tuple[int, ...] = ()
    # argument positions whose number sets its output's size besides `size_args` (topk's k, a slice's or narrow's
    # bounds, a split's sizes): a number read out of data there makes a data-dependent size (data_sizes.py)
    sized_by: tuple[int, ...] = ()
    wraps_number: bool = False  # a 0-d tensor of a number (a trace's NumToTensor of a size): reading it reads no data
    keeps_best: bool = False  # its first output lists the kept items, best first (NMS): the count draws cut it
    # the C++ runtime's own CPU kernel for it (deploy/cpp/src/native_ops.cpp: the same schema but for the name, the
    # same answers), and the dtypes of its first input where those answers were checked: CPU plans name the
    # runtime's op there (transpiler/native_ops.py)
    runtime_op: str = ""
    runtime_op_dtypes: tuple[str, ...] = ()
    # the op is nonzero of its one mask: "indices" (nonzero's [count, dims]) or "unbound" (one-argument where: those
    # columns as a list); a loop's such op may take a count read before the loop (transpiler/loop_counts.py)
    nonzero_form: str = ""
    compares: bool = False  # an elementwise comparison of its two operands (a bool tensor of their broadcast shape)
    # the host op that computes it alike on 0-dim int64 tensors and ints (alpha 1): transpiler/loop_counts.py
    on_host_ints: str = ""
    reads_int: bool = False  # reads a 0-dim tensor's value into a host int
    # nearly equal inputs can give it different outputs (a comparison, an argmax, a sort's order, NMS, a floor):
    # where a package first differs from TorchScript at such an op, rounding decided it, not a wrong kernel
    # (deploy/packaging/culprit.py first_divergence); every op with a data-dependent size is
    discontinuous: bool = False
    # the device types ("cpu", "cuda") where its generated kernel does not round as ATen's kernel does, bit for bit: a
    # sum in another order, a function from another math library (SLEEF on the CPU). Where a package's outputs differ
    # from TorchScript's by rounding that a discontinuous op turned into another answer, these ops go to ATen first
    # and the kernels that round as ATen does stay (fallbacks.py); tests/test_aten_rounding.py holds the others exact
    rounds_own_way: tuple[str, ...] = ()
    # why the op computes in float32 when a package runs in reduced precision (transpiler/precision.py): its
    # statistics or accumulators overflow or lose their range in float16/bfloat16 (autocast's float32 list); "" runs
    # it in the package's precision
    keeps_fp32: str = ""
    # --- the host ---------------------------------------------------------------------------------------------------
    on_host: bool = False  # runs on the host though it takes a tensor (reads its shape, a number, its identity)
    # what of a tensor's shape it reads, which fold_shapes turns into a constant where shape inference knows it:
    # "sizes" every size (size, numel), "size" one dim's (size.int), "meta" none (dim, dtype, device)
    reads_shape: str = ""
    reads_values: bool = False  # reads a tensor's values into a host number: what it decides depends on data
    none_test: bool = False  # `x is None`, `x is not None`: folded where x is a tensor an op made
    # makes the host wait for the device's values, or acts on the host on every call: a CUDA graph cannot hold it
    # (deploy/packaging/graph_regions.py)
    syncs_host: bool = False
    host_effect: bool = False  # acts on the host (raise, print, warn): merged kernels never move across it
    # reaches outside the model (files, the process's random generator, autograd state): a plan must not call it,
    # and both runtimes refuse a package that does
    forbidden: bool = False
    # rebuilds a quantized op's packed weights from their stored parts at load: the only ops a plan's "packed" list
    # may run (deploy/packaging/packed.py, literals.cpp)
    packs_weights: bool = False
    # makes a value no op should compute twice nor drop (a random draw, uninitialised memory): set by the words in
    # its name (_IMPURE_WORDS), so that it holds for every overload
    impure: bool = False
    # --- containers and control flow --------------------------------------------------------------------------------
    builds_container: str = ""  # "list", "tuple", "dict": the container it builds from its inputs
    unpacks: bool = False  # one output per item of a list or tuple
    reads_tensor_list: bool = False  # a lowered op that reads a Tensor[] argument (cat, stack)
    control_flow: str = ""  # "if", "loop": the node holds blocks the plan runs as such
    # its output's shape is arithmetic on sizes only: nothing reads it once the views and iotas over dynamic dims
    # lowered by their fitted shapes (transpiler/drop_unread.py)
    shape_bookkeeping: bool = False
    # --- memory -----------------------------------------------------------------------------------------------------
    returns_input: bool = False  # may return its input itself (a cast or a `contiguous` that is a no-op)
    asks_layout: bool = False  # its result's memory layout is what the model asked for (contiguous, clone)
    scatter_form: str = ""  # a view whose write-through becomes this functional scatter (select -> select_scatter)
    functional_form: str = ""  # an in-place op whose functional form has another name (zero_ -> fill.Scalar)
    # --- arguments --------------------------------------------------------------------------------------------------
    # argument positions that only decide the output's shape, which the lowering reads from the output instead:
    # computed at run time over dynamic dims, they do not keep the op out of kernels (fuse.shape_argument)
    size_args: tuple[int, ...] = ()
    size_is_output_shape: bool = False  # that argument is the output's shape itself (view, reshape, expand)
    # (index position, dim position or None: dim 0) of a gather whose indices are checked (check_indices.py); the
    # indexed tensor is the first input
    gather: Optional[tuple[int, Optional[int]]] = None
    # fills its result with one number: the position of that number's argument, or -1 for zero (check_indices.py
    # knows the values of an index made so)
    fills: Optional[int] = None
    splits: str = ""  # a tensor split into a list: "unbind", "chunk", "size" (one size), "sizes" (a list of sizes)
    # --- GEMMs and convolutions -------------------------------------------------------------------------------------
    # an extern GEMM's input whose rows it reads: it wants it dense, row-major. A kernel that kept an input's permuted
    # memory order (ConvNeXt's LayerNorm and GELU between its pointwise linears) made linear run 1.4-1.7x slower on
    # the CPU than on the row-major tensor ATen's own ops would have given it
    gemm_rows: Optional[int] = None
    gemm_form: str = ""  # how a GEMM by a constant weight is written: "linear", "kn" (x @ W), "addmm"
    batched_matmul: bool = False  # multiplies stacks of matrices (attention's q @ k and its weights @ v)
    scales: str = ""  # "mul", "div": multiplies or divides its first input by its second (attention's scale)
    convolution: bool = False  # a convolution by a weight (input 1) with a bias (input 2)
    # runs float32 through TF32 on CUDA where torch allows it: "conv" (cuDNN: torch.backends.cudnn.allow_tf32, on by
    # default), "matmul" (cuBLAS: torch.backends.cuda.matmul.allow_tf32); verification then runs TorchScript and the
    # package without it (verify.tf32_note)
    tf32: str = ""
    # --- interpreter ops --------------------------------------------------------------------------------------------
    # a prim:: op of fixed schema whose TorchScript operation reads its graph node (MKL-DNN conversion's clamp and
    # hardtanh keep their bounds there): called as a plan step, with no node, it reads through a null pointer. The
    # C++ runtime tells such ops apart by Operator::hasOperation(), which Python cannot see (deploy/resolve.py)
    reads_node: bool = False
    # --- invented inputs (jit2triton/draw_rules.py): where the model says an integer input is valid ----------------
    # (index position, dim position or None: dim 0) of an op whose integer argument indexes its first input
    indexes: Optional[tuple[int, Optional[int]]] = None
    keeps_index_values: bool = False  # its output holds its first input's values (a cast, a view): indices stay so
    keeps_sizes: str = ""  # "all": its output has its first input's size along every dim; "rows": along dim 0
    # its output holds every value of its first input (a reshape, a permutation, an expand; never a slice): the
    # bounds of an index made so are checked on its input, the smaller tensor (check_indices.py)
    covers_input: bool = False

    def __post_init__(self) -> None:
        if self.data_dependent_size:
            object.__setattr__(self, "discontinuous", True)
        if any(word in self.name for word in _IMPURE_WORDS):
            object.__setattr__(self, "impure", True)


# Words in an op's name that make it impure: every random draw and every op returning uninitialised memory
_IMPURE_WORDS = ("rand", "normal", "bernoulli", "dropout", "uniform", "multinomial", "randperm", "empty")

OP_TABLE: dict[str, OpInfo] = {}
_FACTS: dict[str, dict] = {}  # every op's declared facts, in the table or not


def register(category: str, names: str, **fields) -> None:
    """Put each op in the table under `category`, with `fields` (OpInfo's) and any facts declared elsewhere."""
    for name in names.split():
        _FACTS.setdefault(name, {}).update(fields)
        OP_TABLE[name] = OpInfo(name, category, **_FACTS[name])


def facts(names: str, **fields) -> None:
    """Declare facts of ops, in the table or outside it (a host op, a refused op); order does not matter."""
    for name in names.split():
        _FACTS.setdefault(name, {}).update(fields)
        if name in OP_TABLE:
            OP_TABLE[name] = replace(OP_TABLE[name], **fields)


def ops_where(field: str) -> dict[str, object]:
    """Every declared op whose `field` is set, with its value, in the order the ops were declared."""
    return {name: given[field] for name, given in _FACTS.items() if given.get(field) not in (None, False, "", ())}


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
    aten::scatter_add aten::index_add aten::scatter_reduce.two
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
    aten::scaled_dot_product_attention aten::topk aten::sort aten::nonzero aten::nonzero_static aten::index.Tensor
    aten::unique
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


# --- facts shared across categories, or of ops outside the table (each block names the pass that asks) ------------

# Output sizes that depend on data: boolean-mask indexing (aten::index.Tensor with a bool index; with integer indices
# its size is theirs), nonzero and its forms, unique, NMS; and the host ops that read a number out of a tensor, which
# a slice, a topk or a loop bound may then use (transpiler/data_sizes.py, bind_sizes.py, pipeline.py)
facts("""
    aten::index.Tensor aten::nonzero aten::nonzero_numpy aten::argwhere aten::where aten::masked_select
    aten::unique aten::_unique aten::_unique2 aten::unique_dim aten::unique_consecutive aten::unique_dim_consecutive
    aten::repeat_interleave.Tensor aten::repeat_interleave.self_Tensor aten::bincount torchvision::nms j2t::nms
    j2t::nms_unstable
    aten::tensor_split.tensor_indices_or_sections
""", data_dependent_size="tensor")
facts("aten::item aten::Int.Tensor aten::Float.Tensor aten::ScalarImplicit aten::IntImplicit prim::tolist",
      data_dependent_size="scalar")
facts("aten::nonzero aten::nonzero_numpy aten::argwhere aten::where", count_masks=(0,))  # (where: its one-argument form)
facts("aten::masked_select", count_masks=(1,))
facts("torchvision::nms j2t::nms j2t::nms_unstable", keeps_best=True)
facts("torchvision::roi_align", runtime_op="j2t::roi_align", runtime_op_dtypes=("float32",))
# (or j2t::nms_unstable: whichever keeps the installed torchvision's order of equal scores; transpiler/native_ops.py)
facts("torchvision::nms", runtime_op="j2t::nms", runtime_op_dtypes=("float32", "float64"))
facts("aten::nonzero", nonzero_form="indices")
facts("aten::add.Tensor aten::add.Scalar", on_host_ints="aten::add.int")
facts("aten::sub.Tensor aten::sub.Scalar", on_host_ints="aten::sub.int")
facts("aten::mul.Tensor aten::mul.Scalar", on_host_ints="aten::mul.int")
facts("aten::neg", on_host_ints="aten::neg.int")
facts("aten::Int.Tensor aten::IntImplicit", reads_int=True)
facts("aten::where", nonzero_form="unbound")  # (its one-argument form)
facts("""aten::gt.Scalar aten::gt.Tensor aten::ge.Scalar aten::ge.Tensor aten::lt.Scalar aten::lt.Tensor aten::le.Scalar
    aten::le.Tensor aten::eq.Scalar aten::eq.Tensor aten::ne.Scalar aten::ne.Tensor""", compares=True)
facts("aten::topk aten::nonzero_static aten::split.Tensor aten::split_with_sizes aten::split.sizes aten::chunk "
      "aten::repeat aten::tensor_split.sections aten::repeat_interleave.self_int", sized_by=(1,))
facts("aten::slice.Tensor aten::narrow", sized_by=(2, 3))
facts("prim::NumToTensor.Scalar", wraps_number=True)

# Outputs that jump where their inputs cross a boundary: comparisons, arg-reductions, orders, roundings, casts to
# integers (and every op whose output size depends on data: OpInfo sets it)
facts("""
    aten::eq.Tensor aten::eq.Scalar aten::ne.Tensor aten::ne.Scalar aten::gt.Tensor aten::gt.Scalar aten::ge.Tensor
    aten::ge.Scalar aten::lt.Tensor aten::lt.Scalar aten::le.Tensor aten::le.Scalar aten::argmax aten::argmin
    aten::max.dim aten::min.dim aten::sort aten::sort.stable aten::argsort aten::argsort.stable aten::topk
    aten::kthvalue aten::median.dim aten::mode aten::floor aten::ceil aten::round aten::round.decimals aten::trunc
    aten::sign aten::floor_divide aten::floor_divide.Scalar aten::div.Tensor_mode aten::div.Scalar_mode
    aten::remainder.Tensor aten::remainder.Scalar aten::fmod.Tensor aten::fmod.Scalar aten::searchsorted.Tensor
    aten::bucketize.Tensor aten::histc aten::threshold torchvision::roi_align torchvision::roi_pool j2t::roi_align
""", discontinuous=True)

# Kernels that round their own way (see OpInfo.rounds_own_way): float sums in another order, and functions computed
# otherwise than ATen computes them; on the CPU also what ATen takes from SLEEF's vectorized math
facts("""
    aten::sum aten::sum.dim_IntList aten::mean aten::mean.dim aten::var aten::var.dim aten::var.correction aten::std
    aten::std.dim aten::std.correction aten::prod aten::prod.dim_int aten::norm.ScalarOpt_dim aten::linalg_vector_norm
    aten::logsumexp aten::cumsum aten::adaptive_avg_pool2d aten::adaptive_avg_pool1d aten::avg_pool2d
    aten::scatter_add aten::index_add aten::scatter_reduce.two aten::softmax.int aten::log_softmax.int
    aten::layer_norm aten::group_norm aten::tanh aten::gelu aten::silu aten::mish aten::elu aten::softplus aten::erf
    aten::log1p aten::expm1 aten::lerp.Scalar aten::tan aten::pow.Tensor_Tensor aten::pow.Scalar aten::addcdiv
    aten::glu aten::log2 aten::exp2
""", rounds_own_way=("cpu", "cuda"))
facts("""
    aten::sigmoid aten::exp aten::log aten::sin aten::cos aten::sqrt aten::pow.Tensor_Scalar aten::addcmul
""", rounds_own_way=("cpu",))

# Float32 inside a reduced-precision package, with the reason the report gives. GEMMs and convolutions are not here:
# they run in the reduced type, and ATen's (cuBLAS, cuDNN, oneDNN) accumulate in float32.
facts("aten::softmax.int aten::log_softmax.int aten::logsumexp", keeps_fp32="sums exponentials")
facts("aten::layer_norm aten::group_norm aten::batch_norm", keeps_fp32="normalization statistics (mean, variance)")
facts("""aten::sum aten::sum.dim_IntList aten::mean aten::mean.dim aten::var aten::var.dim aten::var.correction
    aten::std aten::std.dim aten::std.correction aten::prod aten::prod.dim_int aten::cumsum aten::norm.ScalarOpt_dim
    aten::linalg_vector_norm aten::scatter_add aten::index_add aten::scatter_reduce.two""",
      keeps_fp32="a large sum or product")
facts("""aten::exp aten::expm1 aten::log aten::log1p aten::pow.Tensor_Scalar aten::pow.Tensor_Tensor aten::pow.Scalar
    aten::reciprocal aten::rsqrt""", keeps_fp32="overflows or loses its range in float16")

# The host: what reads a shape, a number or an identity (fold_shapes.py), what waits for the device or acts on the
# host (deploy/packaging/graph_regions.py, merge_kernels.py), and what a plan must not call (deploy/cpp/src/plan_check.cpp)
facts("""aten::size.int aten::size aten::dim aten::len.Tensor aten::Int.Tensor aten::Float.Tensor aten::Bool.Tensor
    aten::ScalarImplicit aten::item aten::numel prim::device prim::dtype aten::is_floating_point aten::__is__
    aten::__isnot__""", on_host=True)
facts("aten::size aten::numel aten::len.Tensor prim::shape", reads_shape="sizes")
facts("aten::size.int", reads_shape="size")
facts("aten::dim prim::dtype prim::device", reads_shape="meta")
facts("""aten::Int.Tensor aten::Float.Tensor aten::Bool.Tensor aten::ScalarImplicit aten::item aten::IntImplicit
    aten::FloatImplicit prim::tolist aten::is_nonzero""", reads_values=True)
facts("aten::__is__ aten::__isnot__", none_test=True)
facts("""aten::Int.Tensor aten::Float.Tensor aten::Bool.Tensor aten::item aten::nonzero aten::unique aten::_unique2
    aten::masked_select prim::tolist aten::equal aten::is_nonzero aten::allclose aten::ScalarImplicit""",
      syncs_host=True)
facts("prim::RaiseException prim::Print aten::warn", host_effect=True, syncs_host=True)  # a replay would skip them
facts("""aten::save aten::from_file aten::from_file.out aten::manual_seed aten::manual_seed.generator aten::seed
    aten::set_grad_enabled""", forbidden=True)
# (mkldnn::_reorder_convolution_weight / _reorder_linear_weight: a fused oneDNN convolution's or linear's weight,
# in oneDNN's blocked layout)
facts("""aten::_make_per_tensor_quantized_tensor aten::_make_per_channel_quantized_tensor quantized::linear_prepack
    quantized::linear_prepack_fp16 quantized::conv2d_prepack quantized::conv3d_prepack
    quantized::conv_transpose2d_prepack quantized::conv_transpose3d_prepack
    quantized::make_quantized_cell_params_dynamic quantized::make_quantized_cell_params_fp16
    quantized::embedding_bag_prepack mkldnn::_reorder_convolution_weight mkldnn::_reorder_linear_weight""",
      packs_weights=True)
facts("""prim::ListConstruct prim::TupleConstruct aten::size.int aten::size prim::NumToTensor.Scalar aten::Int.Tensor
    aten::mul.int aten::add.int aten::sub.int aten::floordiv.int""", shape_bookkeeping=True)

# Containers and control flow
facts("prim::ListConstruct", builds_container="list")
facts("prim::TupleConstruct", builds_container="tuple")
facts("prim::DictConstruct", builds_container="dict")
facts("prim::ListUnpack prim::TupleUnpack", unpacks=True)
facts("aten::cat aten::stack", reads_tensor_list=True)
facts("prim::If", control_flow="if")
facts("prim::Loop", control_flow="loop")

# Memory: results that may be the input itself, layouts asked for, writes through views (functionalize.py)
facts("""aten::to.dtype aten::to.other aten::to.dtype_layout aten::to.device aten::type_as aten::contiguous
    aten::detach""", returns_input=True)
facts("aten::contiguous aten::clone", asks_layout=True)
facts("aten::select.int", scatter_form="aten::select_scatter")
facts("aten::slice.Tensor", scatter_form="aten::slice_scatter")
facts("aten::zero_", functional_form="aten::fill.Scalar")
facts("aten::copy_", functional_form="aten::copy")

# Arguments: size lists (fuse.py), gathers' indices (check_indices.py), splits (unpack_splits.py)
facts("aten::view aten::reshape aten::expand", size_args=(1,), size_is_output_shape=True)
facts("aten::arange aten::zeros aten::ones aten::full", size_args=(0,))
facts("aten::arange.start aten::arange.start_step aten::new_zeros aten::new_ones aten::new_full", size_args=(1,))
facts("aten::slice.Tensor", size_args=(3,))
facts("aten::expand_as aten::view_as aten::reshape_as", size_args=(1,))  # (a tensor read for its shape)
facts("aten::embedding", gather=(1, None))
facts("prim::MKLDNNClamp prim::MKLDNNClamp_ prim::MKLDNNHardTanh prim::MKLDNNHardTanh_", reads_node=True)
facts("aten::embedding aten::embedding_bag", indexes=(1, None))
facts("""aten::index_select aten::gather aten::scatter aten::scatter_add aten::scatter_reduce aten::index_add
         aten::index_copy aten::index_fill""", indexes=(2, 1))
facts("""aten::to aten::long aten::int aten::view aten::reshape aten::flatten aten::squeeze aten::unsqueeze
         aten::contiguous aten::clone aten::type_as aten::select aten::slice aten::t aten::transpose aten::permute
         aten::expand aten::detach""", keeps_index_values=True)
facts("""aten::zeros_like aten::ones_like aten::empty_like aten::full_like aten::relu aten::sigmoid aten::tanh
         aten::gelu aten::dropout aten::to aten::contiguous aten::clone aten::detach aten::layer_norm aten::softmax""",
      keeps_sizes="all")
facts("aten::linear", keeps_sizes="rows")
facts("""aten::view aten::reshape aten::expand aten::expand_as aten::unsqueeze aten::squeeze aten::squeeze.dim
         aten::flatten.using_ints aten::unflatten.int aten::view_as aten::reshape_as aten::permute aten::transpose.int
         aten::t aten::contiguous aten::clone""", covers_input=True)
facts("aten::index_select aten::gather", gather=(2, 1))
# a scatter's index names positions of its destination (its first input) along dim: checked the same way
facts("aten::scatter_add aten::index_add aten::scatter_reduce.two", gather=(2, 1))
facts("aten::zeros aten::zeros_like aten::new_zeros", fills=-1)
facts("aten::full aten::full_like", fills=1)
facts("aten::new_full", fills=2)
facts("aten::unbind.int", splits="unbind")
facts("aten::chunk", splits="chunk")
facts("aten::split.Tensor", splits="size")
facts("aten::split_with_sizes aten::split.sizes", splits="sizes")

# GEMMs and convolutions
facts("aten::linear mkldnn::_linear_pointwise aten::matmul aten::mm aten::bmm", gemm_rows=0)
facts("aten::addmm", gemm_rows=1)
facts("aten::linear", gemm_form="linear")
facts("aten::matmul aten::mm", gemm_form="kn")
facts("aten::addmm", gemm_form="addmm")
facts("aten::matmul aten::bmm", batched_matmul=True)
facts("aten::mul.Tensor aten::mul.Scalar", scales="mul")
facts("aten::div.Tensor aten::div.Scalar", scales="div")
facts("aten::_convolution aten::conv1d aten::conv2d aten::conv3d", convolution=True)
facts("aten::_convolution aten::convolution aten::conv1d aten::conv2d aten::conv3d aten::conv_transpose1d "
      "aten::conv_transpose2d aten::conv_transpose3d", tf32="conv")
facts("aten::linear aten::matmul aten::mm aten::bmm aten::addmm aten::baddbmm aten::einsum", tf32="matmul")


def lookup(op: str, schema: str = "") -> OpInfo:
    """The table entry of `op`; ops outside the table are host ops when they touch no tensor, else fallback."""
    info = OP_TABLE.get(op)
    return info if info is not None else _unlisted(op, schema)


@functools.lru_cache(maxsize=4096)
def _unlisted(op: str, schema: str) -> OpInfo:
    return OpInfo(op, HOST if is_host_op(op, schema) else FALLBACK, **_FACTS.get(op, {}))


def is_host_op(op: str, schema: str = "") -> bool:
    if op.startswith("prim::") or _FACTS.get(op, {}).get("on_host"):
        return True
    if schema:
        returns = schema.rsplit("->", 1)[-1]
        return "Tensor" not in returns and "Tensor" not in schema.split("->", 1)[0]
    return False


def may_alias(op: str) -> bool:
    """Whether the op's result may share memory with its first input (views, and casts that can be no-ops)."""
    info = lookup(op)
    return info.returns_input or info.category == VIEW


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
def written_tensor_arguments(schema: str) -> tuple[int, ...]:
    """The positions of the tensor arguments an op writes in place (`self` of `add_`, `out` of an out= overload)."""
    if not schema or "!" not in schema:
        return ()
    return tuple(i for i, a in enumerate(torch._C.parse_schema(schema).arguments)
                 if a.alias_info is not None and a.alias_info.is_write and "Tensor" in str(a.type))


@functools.lru_cache(maxsize=None)
def stores_argument(schema: str) -> bool:
    """Whether the op keeps an argument inside a container (`aten::append.t(t[](a!) self, t(c -> *) el)`: the
    element joins the list's contents, the wildcard set), where it outlives the op and the call."""
    return bool(schema) and "*" in schema and any(
        a.alias_info is not None and "*" in a.alias_info.after_set for a in torch._C.parse_schema(schema).arguments)


@functools.lru_cache(maxsize=None)
def returns_alias(schema: str) -> bool:
    """Whether the op's result shares memory with an input by its schema (`-> Tensor(a)`: a view such as diagonal;
    `-> Tensor(a!)`: an in-place op's result is its input)."""
    return bool(schema) and any(r.alias_info is not None for r in torch._C.parse_schema(schema).returns)
