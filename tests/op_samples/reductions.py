"""Samples of the ops `transpiler/lower_reductions.py` and `lower_pooling.py` lower: reductions, the normalisations
built on them, pooling."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .kit import (BF16, I64, M, X, X3, XB, XI, Sample, edges, infinite_rows, ints, mask, positive, randn, scripted,
                  sparse, uniform)


# --- softmax and normalisations -----------------------------------------------------------------------------------

def softmax(x, x3, xb):
    return (torch.softmax(x, 1), torch.softmax(x.t(), 0), torch.softmax(x3, 0), torch.softmax(xb, -1),
            torch.softmax(xb, -1, dtype=torch.float32))


def log_softmax(x, x3, xb):
    return (torch.log_softmax(x, 1), torch.log_softmax(x.t(), 0), torch.log_softmax(x3, 0),
            torch.log_softmax(xb, -1), torch.log_softmax(xb, -1, dtype=torch.float32))


def logsumexp(x, x3, inf, xb):
    return (torch.logsumexp(x, [1]), torch.logsumexp(x.t(), [0], True), torch.logsumexp(x3, [0, 2]),
            torch.logsumexp(inf, [1]), torch.logsumexp(xb, [1]))


def vector_norm(x, x3, xb):
    return (torch.linalg.vector_norm(x, 2, [1], True), torch.linalg.vector_norm(x.t(), 1, [0]),
            torch.linalg.vector_norm(x3, float("inf"), [0, 2]), torch.linalg.vector_norm(x3, float("-inf"), [1]),
            torch.linalg.vector_norm(x3, 3.0), torch.linalg.vector_norm(xb, 2, [-1]))


def normalize(x, x3, xb):
    return F.normalize(x, dim=-1), F.normalize(x.t(), dim=0), F.normalize(x3, p=1.0, dim=1), F.normalize(xb, dim=-1)


def layer_norm(x, w, b, xb, wb, bb):
    return (torch.layer_norm(x, [6], w, b, 1e-5), torch.layer_norm(x.transpose(0, 1), [2, 6]),
            torch.layer_norm(xb, [6], wb, bb, 1e-5), torch.layer_norm(xb, [6], w, b, 1e-5))


def group_norm(x, w, b, xb, wb, bb):
    return (torch.group_norm(x, 2, w, b, 1e-5), torch.group_norm(x.transpose(2, 3), 4),
            torch.group_norm(xb, 2, wb, bb, 1e-5), torch.group_norm(xb, 2, w, b, 1e-5))


def batch_norm(x, y, w, b, mean, var, xb, wb, bb, meanb, varb):
    return (torch.batch_norm(x, w, b, mean, var, False, 0.1, 1e-5, False),
            torch.batch_norm(y.t(), None, None, mean, var, False, 0.1, 1e-3, False),
            torch.batch_norm(xb, wb, bb, meanb, varb, False, 0.1, 1e-5, False),
            torch.batch_norm(xb, w, b, mean, var, False, 0.1, 1e-5, False))


# --- pooling ------------------------------------------------------------------------------------------------------

def adaptive_avg_pool2d(x, xb):
    return F.adaptive_avg_pool2d(x, [2, 3]), F.adaptive_avg_pool2d(x.transpose(2, 3), 1), F.adaptive_avg_pool2d(xb, 2)


def adaptive_avg_pool1d(x, xb):
    return (F.adaptive_avg_pool1d(x[0], 3), F.adaptive_avg_pool1d(x[0].transpose(1, 2), 1),
            F.adaptive_avg_pool1d(xb[0], 2))


def max_pool2d(x, e, xb):
    return (F.max_pool2d(x, 2), F.max_pool2d(x.transpose(2, 3), [2, 3], [1, 2]), F.max_pool2d(e, 2),
            F.max_pool2d(xb, 2))


def padded_max_pool2d(x, e, xb):
    """-inf padding (a window of negatives at the border stays negative), dilation, ceil_mode, NaN at a border."""
    return (F.max_pool2d(x, 3, 2, 1), F.max_pool2d(x - 10, 3, 2, 1), F.max_pool2d(x.transpose(2, 3), [3, 2], 1, [1, 0]),
            F.max_pool2d(x, 2, 1, 0, 2), F.max_pool2d(x, [3, 2], [1, 2], 1, [2, 3]), F.max_pool2d(x, 3, 2, 1, 1, True),
            F.max_pool2d(x, 2, 3, 0, 1, True), F.max_pool2d(e, 3, 2, 1), F.max_pool2d(xb, 3, 2, 1, 1, True))


class ConvReluMaxPool(torch.nn.Module):
    """resnet's stem: a channels-last conv (its output channels-last too), relu, a padded 3x3 max pool, stride 2."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1).to(dtype).to(memory_format=torch.channels_last)

    def forward(self, x):
        return F.max_pool2d(torch.relu(self.conv(x)), 3, 2, 1)


def stem(dtype: torch.dtype) -> Sample:
    return Sample(lambda example: torch.jit.trace(ConvReluMaxPool(dtype).eval(), example),
                  (randn(2, 3, 9, 10, dtype=dtype),))


def avg_pool2d(x, xb):
    return F.avg_pool2d(x, 2), F.avg_pool2d(x.transpose(2, 3), [2, 3], [1, 2]), F.avg_pool2d(xb, 2)


def padded_avg_pool2d(x, xb):
    """Zero padding, counted in the divisor or not, and a divisor override."""
    return (F.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
            F.avg_pool2d(x.transpose(2, 3), [3, 2], 1, [1, 0], count_include_pad=False),
            F.avg_pool2d(x, 2, divisor_override=3), F.avg_pool2d(xb, 3, 2, 1, count_include_pad=False))


def large_window_pool2d(x, xb):
    """Windows of more than 32 positions: reductions over window loop variables (on the CPU; ATen's on CUDA)."""
    return F.max_pool2d(x, 6, 3), F.avg_pool2d(x, [6, 7], 2), F.max_pool2d(x, 6, 3, 2), F.avg_pool2d(xb, 6, 4)


# --- reductions ---------------------------------------------------------------------------------------------------

def cumsum(x, x3, xb, xi, m):
    return (torch.cumsum(x, 1), torch.cumsum(x3, 0), torch.cumsum(x3.transpose(1, 2), -1) * 2.0, torch.cumsum(xb, 1),
            torch.cumsum(xi, 0), torch.cumsum(m, 1), torch.cumsum(x, 0, dtype=torch.float64))


def sum_all(x, xb, xi, m):
    return x.sum(), x[:, 1:].sum(), xb.sum(), xi.sum(), m.sum(), x.sum(dtype=torch.float64)


def sum_dim(x, x3, xb, xi, m):
    return (x.sum(1), x.t().sum(0, keepdim=True), x3.sum([0, 2]), x3.sum(-1), xb.sum(1), xi.sum(0), m.sum(1),
            x.sum(1, dtype=torch.float64))


def mean_all(x, xb):
    return x.mean(), x[:, 1:].mean(), xb.mean(), x.mean(dtype=torch.float64)


def mean_dim(x, x3, xb):
    return x.mean(1), x.t().mean(0, keepdim=True), x3.mean([0, 2]), xb.mean(-1)


def amax(x, x3, e, xb, xi):
    return x.amax(1), x.t().amax(0, keepdim=True), x3.amax([0, 2]), e.amax(1), xb.amax(-1), xi.amax(0), x.amax()


def amin(x, x3, e, xb, xi):
    return x.amin(1), x.t().amin(0, keepdim=True), x3.amin([0, 2]), e.amin(1), xb.amin(-1), xi.amin(0), x.amin()


def max_all(x, e, xb, xi):
    return x.max(), x.t()[1:].max(), e.max(), xb.max(), xi.max()


def min_all(x, e, xb, xi):
    return x.min(), x.t()[1:].min(), e.min(), xb.min(), xi.min()


def max_dim(x, e, xb, xi):
    return x.max(1), x.t().max(0, keepdim=True), e.max(1), e.max(0), xb.max(-1), xi.max(0)


def min_dim(x, e, xb, xi):
    return x.min(1), x.t().min(0, keepdim=True), e.min(1), e.min(0), xb.min(-1), xi.min(0)


def argmax(x, e, xb, xi):
    return x.argmax(1), x.t().argmax(0, keepdim=True), x[0].argmax(), e.argmax(1), xb.argmax(1), xi.argmax(0)


def argmin(x, e, xb, xi):
    return x.argmin(1), x.t().argmin(0, keepdim=True), x[0].argmin(), e.argmin(1), xb.argmin(1), xi.argmin(0)


def var_all(x, xb):
    return x.var(), x.var(False), x[:, 1:].var(), xb.var()


def var_dim(x, x3, xb):
    return x.var(1), x.t().var(0, keepdim=True), x3.var([0, 2], False), xb.var(1)


def var_correction(x, x3, xb):
    return (x.var(1, correction=0), x3.var(dim=[0, 2], correction=2, keepdim=True), x.t().var(0, correction=1),
            x.var(correction=0), xb.var(1, correction=0))


def std_all(x, xb):
    return x.std(), x.std(False), x[:, 1:].std(), xb.std()


def std_dim(x, x3, xb):
    return x.std(1), x.t().std(0, keepdim=True), x3.std([0, 2], False), xb.std(1)


def std_correction(x, x3, xb):
    return (x.std(1, correction=0), x3.std(dim=[0, 2], correction=2, keepdim=True), x.t().std(0, correction=1),
            x.std(correction=0), xb.std(1, correction=0))


def prod_all(x, xb, xi):
    return x.prod(), x[:, 1:].prod(), xb.prod(), xi.prod(), x.prod(dtype=torch.float64)


def prod_dim(x, xb, xi):
    return x.prod(1), x.t().prod(0, keepdim=True), xb.prod(1), xi.prod(0)


def any_all(m, x, xi):
    return m.any(), m.t()[1:].any(), x.any(), xi.any()


def any_dim(m, x, xi):
    return m.any(1), m.t().any(0, keepdim=True), x.any(1), xi.any(0)


def all_all(m, x, xi):
    return m.all(), m.t()[1:].all(), x.all(), xi.all()


def all_dim(m, x, xi):
    return m.all(1), m.t().all(0, keepdim=True), x.all(1), xi.all(0)


# --- the table ----------------------------------------------------------------------------------------------------

EXTREMES = (X, edges(4, 6), XB, XI)
BATCH_NORM_INPUTS = (randn(2, 3, 2, 2), randn(3, 4), randn(3), randn(3), randn(3), positive(3),
                     randn(2, 3, 2, 2, dtype=BF16), randn(3, dtype=BF16), randn(3, dtype=BF16), randn(3, dtype=BF16),
                     positive(3, dtype=BF16))
NEAR_ONE = (uniform(0.5, 1.5, 4, 6), uniform(0.5, 1.5, 4, 6, dtype=BF16), ints(-2, 3, 4, 6, nonzero=True))
SPARSE = (mask(4, 6, p_true=0.05), sparse(4, 6), sparse(4, 6, dtype=I64, p_nonzero=0.05))
DENSE = (mask(4, 6, p_true=0.9), sparse(4, 6, p_nonzero=0.9), sparse(4, 6, dtype=I64, p_nonzero=0.97))
IMAGE, IMAGE_BF16 = randn(2, 3, 4, 6), randn(2, 3, 4, 6, dtype=BF16)

REDUCTION_SAMPLES: dict[str, list[Sample]] = {
    "aten::softmax.int": [scripted(softmax, X, X3, XB)],
    "aten::log_softmax.int": [scripted(log_softmax, X, X3, XB)],
    "aten::layer_norm": [scripted(layer_norm, X3, randn(6), randn(6), randn(2, 4, 6, dtype=BF16),
                                  randn(6, dtype=BF16), randn(6, dtype=BF16))],
    "aten::group_norm": [scripted(group_norm, randn(2, 4, 3, 3), randn(4), randn(4), randn(2, 4, 3, 3, dtype=BF16),
                                  randn(4, dtype=BF16), randn(4, dtype=BF16))],
    "aten::batch_norm": [scripted(batch_norm, *BATCH_NORM_INPUTS)],
    "aten::sum": [scripted(sum_all, X, XB, XI, M)],
    "aten::cumsum": [scripted(cumsum, X, X3, XB, XI, M)],
    "aten::sum.dim_IntList": [scripted(sum_dim, X, X3, XB, XI, M)],
    "aten::mean": [scripted(mean_all, X, XB)],
    "aten::mean.dim": [scripted(mean_dim, X, X3, XB)],
    "aten::amax": [scripted(amax, X, X3, edges(4, 6), XB, XI)],
    "aten::amin": [scripted(amin, X, X3, edges(4, 6), XB, XI)],
    "aten::max": [scripted(max_all, *EXTREMES)],
    "aten::min": [scripted(min_all, *EXTREMES)],
    "aten::max.dim": [scripted(max_dim, *EXTREMES)],
    "aten::min.dim": [scripted(min_dim, *EXTREMES)],
    "aten::argmax": [scripted(argmax, *EXTREMES)],
    "aten::argmin": [scripted(argmin, *EXTREMES)],
    "aten::var": [scripted(var_all, X, XB)],
    "aten::var.dim": [scripted(var_dim, X, X3, XB)],
    "aten::var.correction": [scripted(var_correction, X, X3, XB)],
    "aten::std": [scripted(std_all, X, XB)],
    "aten::std.dim": [scripted(std_dim, X, X3, XB)],
    "aten::std.correction": [scripted(std_correction, X, X3, XB)],
    "aten::prod": [scripted(prod_all, *NEAR_ONE)],
    "aten::prod.dim_int": [scripted(prod_dim, *NEAR_ONE)],
    "aten::any": [scripted(any_all, *SPARSE)],
    "aten::any.dim": [scripted(any_dim, *SPARSE)],
    "aten::all": [scripted(all_all, *DENSE)],
    "aten::all.dim": [scripted(all_dim, *DENSE)],
    "aten::logsumexp": [scripted(logsumexp, X, X3, infinite_rows, XB)],
    "aten::linalg_vector_norm": [scripted(vector_norm, X, X3, XB)],
    "aten::norm.ScalarOpt_dim": [scripted(normalize, X, X3, XB)],
    "aten::adaptive_avg_pool2d": [scripted(adaptive_avg_pool2d, IMAGE, IMAGE_BF16)],
    "aten::adaptive_avg_pool1d": [scripted(adaptive_avg_pool1d, IMAGE, IMAGE_BF16)],
    "aten::max_pool2d": [scripted(max_pool2d, IMAGE, edges(2, 3, 4, 6), IMAGE_BF16),
                         scripted(padded_max_pool2d, randn(2, 3, 9, 10), edges(2, 3, 9, 10),
                                  randn(2, 3, 9, 10, dtype=BF16)),
                         stem(torch.float16), stem(torch.float32),
                         scripted(large_window_pool2d, randn(2, 3, 13, 14), randn(2, 3, 13, 14, dtype=BF16))],
    "aten::avg_pool2d": [scripted(avg_pool2d, IMAGE, IMAGE_BF16),
                         scripted(padded_avg_pool2d, randn(2, 3, 9, 10), randn(2, 3, 9, 10, dtype=BF16))],
}


# --- a case that runs into a bug outside the lowerings: a strict xfail in test_ops.py -----------------------------

def narrow_extremes(x32, x16, m):
    return x32.amax(1), x32.max(), x16.amin(1), x16.min(), m.amax(1), m.max()


NARROW_INTEGER_MAX_MIN = scripted(narrow_extremes, ints(-100, -1, 4, 6, dtype=torch.int32),
                                  ints(1, 100, 4, 6, dtype=torch.int16), mask(4, 6, p_true=0.1))
