"""Samples of the ops `transpiler/lower_views.py` lowers: views, which become indexing, and gathers."""
from __future__ import annotations

import torch

from .kit import BF16, X, X3, XB, XI, Sample, index, ints, randn, scripted


# --- gathers: a load whose index is itself loaded -----------------------------------------------------------------

def embedding(w, idx, wb):
    return torch.embedding(w, idx), torch.embedding(w, idx.t()), torch.embedding(wb, idx)


def gather(x, i1, i0, xb, xi):
    return (torch.gather(x, 1, i1), torch.gather(x, 0, i0), torch.gather(x.t(), 0, i1.t()), torch.gather(x, -1, i1),
            torch.gather(xb, 1, i1), torch.gather(xi, 1, i1))


def index_select(x, i0, i1, xb, xi):
    return (torch.index_select(x, 0, i0), torch.index_select(x, 1, i1), torch.index_select(x.t(), 0, i1),
            torch.index_select(xb, -1, i1), torch.index_select(xi, 0, i0))


def index_tensor(x, x3, rows, cols, xb, xi):
    return (x[rows], x[:, cols], x[rows, cols], x3[:, rows, cols], x3[rows % 2, :, cols], x3[rows % 2], xb[rows],
            xi[:, cols])


# --- views: a bare view output stays an ATen alias, so each view here feeds a kernel (`+ 1`) ----------------------

def view(x, x3, xb, xi):
    return (x.view(6, 4) + 1, x.view(-1) + 1, x[1:].view(3, 2, 3) + 1, x3.view(8, 6) + 1, xb.view(24) + 1,
            xi.view(2, 12) + 1)


def reshape(x, x3, xb, xi):
    return (x.t().reshape(-1) + 1, x.reshape(2, 12) + 1, x[:, 1:].reshape(4, 5) + 1,
            x3.transpose(1, 2).reshape(12, 4) + 1, xb.t().reshape(24) + 1, xi.reshape(3, 8) + 1)


def flatten(x3, xb, xi):
    return (torch.flatten(x3, 1) + 1, x3.transpose(0, 1).flatten(0, 1) + 1, x3.flatten() + 1, xb.flatten() + 1,
            xi.t().flatten() + 1)


def unflatten(x, xb, xi):
    return (x.unflatten(1, [2, 3]) + 1, x.t().unflatten(0, [3, -1]) + 1, xb.unflatten(0, [2, 2]) + 1,
            xi.unflatten(1, [3, 2]) + 1)


def permute(x, x3, xb, xi):
    return (x3.permute(2, 0, 1) + 1, x3.permute(-1, -3, -2) + 1, x.permute(1, 0) + 1, xb.permute(1, 0) + 1,
            xi.permute(1, 0) + 1)


def transpose(x3, xb, xi):
    return (x3.transpose(0, 2) + 1, x3.transpose(-1, -2) + 1, x3[:, 1:].transpose(0, 1) + 1,
            xb.transpose(0, 1) + 1, xi.transpose(0, 1) + 1)


def t(x, xb, xi):
    return x.t() + 1, x[:, 1:].t() + 1, x[0].t() + 1, xb.t() + 1, xi.t() + 1


def expand(col, x, colb, coli):
    return (col.expand(4, 6) + 1, col.expand(2, 4, 6) + 1, col.expand(-1, 6) + 1, x[0].expand(4, 6) + 1,
            colb.expand(4, 6) + 1, coli.expand(2, -1, 3) + 1)


def expand_as(col, x, colb, coli):
    return (col.expand_as(x) + 1, x[0].expand_as(x) + 1, col.t().expand_as(x.t()) + 1, colb.expand_as(x) + 1,
            coli.expand_as(x) + 1)


def slice_(x, x3, xb, xi):
    return (x[1:3] + 1, x[:, ::2] + 1, x[:, -3:] + 1, x[::2, 1:5:2] + 1, x[:, 1:100] + 1, x[-2:] + 1,
            x3[:, 1:, :-1] + 1, xb[1:] + 1, xi[:, 2:] + 1)


def select(x, x3, xb, xi):
    return (x[1] + 1, x[:, -1] + 1, x3.select(1, 2) + 1, x3[-1] + 1, x.t()[2] + 1, x[1, 2] + 1, xb[0] + 1,
            xi[:, 0] + 1)


def squeeze(s, x, sb, si):
    return (s.squeeze() + 1, s.transpose(0, 1).squeeze() + 1, x[:1].squeeze() + 1, sb.squeeze() + 1,
            si.squeeze() + 1)


def squeeze_dim(s, x, sb, si):
    return (s.squeeze(1) + 1, s.squeeze(-2) + 1, s.squeeze(0) + 1, x[:, :1].squeeze(1) + 1, sb.squeeze(1) + 1,
            si.squeeze(1) + 1)


def unsqueeze(x, xb, xi):
    return (x.unsqueeze(0) + 1, x.unsqueeze(-1) + 1, x.t().unsqueeze(1) + 1, xb.unsqueeze(1) + 1,
            xi.unsqueeze(2) + 1)


def narrow(x, xb, xi):
    return (x.narrow(1, 2, 3) + 1, x.narrow(0, 1, 2) + 1, x.narrow(1, -3, 2) + 1, x.t().narrow(0, 1, 4) + 1,
            xb.narrow(1, 1, 4) + 1, xi.narrow(0, 2, 2) + 1)


def view_as(x, y, xb, xi):
    return x.view_as(y) + 1, x[1:3].view_as(y[0]) + 1, xb.view_as(y) + 1, xi.view_as(y) + 1


def reshape_as(x, y, xb, xi):
    return x.t().reshape_as(y) + 1, x.reshape_as(y) + 1, xb.t().reshape_as(y) + 1, xi.reshape_as(y) + 1


def numpy_t(x, xb, xi):
    return x.T + 1, x[:, 1:].T + 1, x[1:3, 2:].T + 1, xb.T + 1, xi.T + 1


def movedim(x, x3, xb, xi):
    return (x3.movedim(0, 2) + 1, x3.movedim(-1, 0) + 1, x3.movedim(1, 1) + 1, x.movedim(0, 1) + 1,
            xb.movedim(1, 0) + 1, xi.movedim(1, 0) + 1)


def select_scatter(x, row, xb, rowb):
    return (torch.select_scatter(x, row, 0, 1) + 1, torch.select_scatter(x, x[:, 2] * 2, 1, -1),
            torch.select_scatter(x.t(), x[0] - 1, 1, 2), torch.select_scatter(xb, rowb, 0, 3))


def slice_scatter(x, xb):
    return (torch.slice_scatter(x, x[1:3] * 2, 0, 1, 3), torch.slice_scatter(x, x[:, :2] + 1, 1, 4),
            torch.slice_scatter(x, x * 3, 0), torch.slice_scatter(xb, xb[:, 2:5] * 2, 1, 2, 5))


# --- the table ----------------------------------------------------------------------------------------------------

VIEW_SAMPLES: dict[str, list[Sample]] = {
    "aten::embedding": [scripted(embedding, randn(10, 4), index(10, 2, 3), randn(10, 4, dtype=BF16))],
    "aten::gather": [scripted(gather, X, index(6, 4, 3), index(4, 2, 6), XB, XI)],
    "aten::index_select": [scripted(index_select, X, index(4, 3), index(6, 5), XB, XI)],
    "aten::index.Tensor": [scripted(index_tensor, X, X3, ints(-4, 4, 3, 2), index(6, 2), XB, XI)],
    "aten::view": [scripted(view, X, X3, XB, XI)],
    "aten::reshape": [scripted(reshape, X, X3, XB, XI)],
    "aten::flatten.using_ints": [scripted(flatten, X3, XB, XI)],
    "aten::unflatten.int": [scripted(unflatten, X, XB, XI)],
    "aten::permute": [scripted(permute, X, X3, XB, XI)],
    "aten::transpose.int": [scripted(transpose, X3, XB, XI)],
    "aten::t": [scripted(t, X, XB, XI)],
    "aten::expand": [scripted(expand, randn(4, 1), X, randn(4, 1, dtype=BF16), ints(-9, 10, 1, 3))],
    "aten::expand_as": [scripted(expand_as, randn(4, 1), X, randn(4, 1, dtype=BF16), ints(-9, 10, 4, 1))],
    "aten::slice.Tensor": [scripted(slice_, X, X3, XB, XI)],
    "aten::select.int": [scripted(select, X, X3, XB, XI)],
    "aten::squeeze": [scripted(squeeze, randn(4, 1, 6), X, randn(4, 1, 6, dtype=BF16), ints(-9, 10, 4, 1, 6))],
    "aten::squeeze.dim": [scripted(squeeze_dim, randn(4, 1, 6), X, randn(4, 1, 6, dtype=BF16),
                                   ints(-9, 10, 4, 1, 6))],
    "aten::unsqueeze": [scripted(unsqueeze, X, XB, XI)],
    "aten::narrow": [scripted(narrow, X, XB, XI)],
    "aten::view_as": [scripted(view_as, X, randn(2, 12), XB, XI)],
    "aten::reshape_as": [scripted(reshape_as, X, randn(2, 12), XB, XI)],
    "aten::numpy_T": [scripted(numpy_t, X, XB, XI)],
    "aten::movedim.int": [scripted(movedim, X, X3, XB, XI)],
    "aten::select_scatter": [scripted(select_scatter, X, randn(6), XB, randn(6, dtype=BF16))],
    "aten::slice_scatter": [scripted(slice_scatter, X, XB)],
}
