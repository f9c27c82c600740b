"""Generated convolutions for the CPU: a 1x1 convolution, a depthwise one and a small dense one over channels-last
activations, each rendered from a fixed C++ template with the pointwise kernel after it as its epilogue
(transpiler/conv_kernels.py says when; conv_timing.py times them for transpiler/onednn_conv.py).

The 1x1 convolution is a GEMM of the pixels [M, cin] by the weight [cin, cout]: each tile is 6 pixels by 16 output
channels, 12 AVX2 accumulators held in registers over all of cin, the weight packed [cout/16][cin][16] so that a
tile's panel is contiguous; pixel tiles outermost, so a tile's rows of x stay in L1 across the column blocks. The
depthwise convolution computes 4 output pixels of a row by 16 channels at a time, a tap's weights loaded once
for the 4; taps are tested against the image only at the row's edges. A dense convolution (the stem's 3x3 over 3
channels) gathers the patches of 6 output pixels into L1, zeros for the padding, and runs the 1x1's tile over
them, the weight packed as [cout/16][tap row][tap column][cin][16]. All keep fp32 accumulators (FMA) and add the
bias once at the end, as oneDNN does. Without AVX2 and FMA (a package rebuilt for an older CPU) the same loops run
as plain C++.

Each finished tile goes through the epilogue, written by the C++ renderer itself (its rows and sweep, the sweep
bounded to the tile's channels), with its reads of the product replaced by the tile's value.
"""
from __future__ import annotations

from typing import Optional

from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.conv_templates import BLOCK

from .common import Scope, provenance_comment, unravel
from .cpp import CTYPES, PARALLEL_WORK, _KernelWriter

PIXELS = 4  # output pixels of a row per step of the depthwise template
ROWS = 6  # pixels per tile of the pointwise template: 6 x 2 accumulators + 2 weights + 1 broadcast = 15 of 16 ymm

PRELUDE = r"""
// --- convolution templates (emitters/cpp_conv.py) ---
#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define J2T_CONV_AVX2 1
#endif
// tile[r][j] = sum over k of x[r][k] * w[k][j]: rows (at most 6) pixels of x, K floats each, by one 16-column panel
// of the packed weight
template <int64_t K>
static inline void j2t_pointwise_tile(const float* __restrict x, const float* __restrict w, float* __restrict tile,
                                      int64_t rows) {
#ifdef J2T_CONV_AVX2
  if (rows == 6) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a10 = a00, a11 = a00, a20 = a00, a21 = a00, a30 = a00, a31 = a00,
           a40 = a00, a41 = a00, a50 = a00, a51 = a00;
#pragma GCC unroll 4
    for (int64_t k = 0; k < K; ++k) {
      const __m256 w0 = _mm256_loadu_ps(w + k * 16), w1 = _mm256_loadu_ps(w + k * 16 + 8);
      __m256 v = _mm256_broadcast_ss(x + k);
      a00 = _mm256_fmadd_ps(v, w0, a00); a01 = _mm256_fmadd_ps(v, w1, a01);
      v = _mm256_broadcast_ss(x + K + k);
      a10 = _mm256_fmadd_ps(v, w0, a10); a11 = _mm256_fmadd_ps(v, w1, a11);
      v = _mm256_broadcast_ss(x + 2 * K + k);
      a20 = _mm256_fmadd_ps(v, w0, a20); a21 = _mm256_fmadd_ps(v, w1, a21);
      v = _mm256_broadcast_ss(x + 3 * K + k);
      a30 = _mm256_fmadd_ps(v, w0, a30); a31 = _mm256_fmadd_ps(v, w1, a31);
      v = _mm256_broadcast_ss(x + 4 * K + k);
      a40 = _mm256_fmadd_ps(v, w0, a40); a41 = _mm256_fmadd_ps(v, w1, a41);
      v = _mm256_broadcast_ss(x + 5 * K + k);
      a50 = _mm256_fmadd_ps(v, w0, a50); a51 = _mm256_fmadd_ps(v, w1, a51);
    }
    _mm256_storeu_ps(tile, a00); _mm256_storeu_ps(tile + 8, a01);
    _mm256_storeu_ps(tile + 16, a10); _mm256_storeu_ps(tile + 24, a11);
    _mm256_storeu_ps(tile + 32, a20); _mm256_storeu_ps(tile + 40, a21);
    _mm256_storeu_ps(tile + 48, a30); _mm256_storeu_ps(tile + 56, a31);
    _mm256_storeu_ps(tile + 64, a40); _mm256_storeu_ps(tile + 72, a41);
    _mm256_storeu_ps(tile + 80, a50); _mm256_storeu_ps(tile + 88, a51);
    return;
  }
#endif
  for (int64_t i = 0; i < rows * 16; ++i) tile[i] = 0.0f;
  for (int64_t k = 0; k < K; ++k)
    for (int64_t r = 0; r < rows; ++r) {
      const float v = x[r * K + k];
#pragma omp simd
      for (int64_t j = 0; j < 16; ++j) tile[r * 16 + j] += v * w[k * 16 + j];
    }
}

// tile[p][c] for PX output pixels (columns wo0.. of output row ho of image n) and the 16 channels from c0, summed
// over the taps of w [tap][C]; CHECKED tests each tap's column against the image (the row's edges), else every
// tap of these pixels is inside it
template <int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW,
          int64_t DH, int64_t DW, int PX, bool CHECKED>
static inline void j2t_depthwise_px(const float* __restrict x, const float* __restrict w, int64_t n, int64_t ho,
                                    int64_t wo0, int64_t c0, float* __restrict tile) {
#ifdef J2T_CONV_AVX2
  __m256 a0[PX], a1[PX];
  for (int p = 0; p < PX; ++p) a0[p] = a1[p] = _mm256_setzero_ps();
#pragma GCC unroll 9
  for (int64_t i = 0; i < KH; ++i) {
    const int64_t hi = ho * SH - PH + i * DH;
    if (hi < 0 || hi >= H) continue;
    const float* row = x + (n * H + hi) * W * C + c0;
#pragma GCC unroll 9
    for (int64_t j = 0; j < KW; ++j) {
      const float* tap = w + (i * KW + j) * C + c0;
      const __m256 w0 = _mm256_loadu_ps(tap), w1 = _mm256_loadu_ps(tap + 8);
#pragma GCC unroll 8
      for (int p = 0; p < PX; ++p) {
        const int64_t wi = (wo0 + p) * SW - PW + j * DW;
        if (CHECKED && (wi < 0 || wi >= W)) continue;
        a0[p] = _mm256_fmadd_ps(_mm256_loadu_ps(row + wi * C), w0, a0[p]);
        a1[p] = _mm256_fmadd_ps(_mm256_loadu_ps(row + wi * C + 8), w1, a1[p]);
      }
    }
  }
  for (int p = 0; p < PX; ++p) { _mm256_storeu_ps(tile + p * 16, a0[p]); _mm256_storeu_ps(tile + p * 16 + 8, a1[p]); }
#else
  for (int64_t i = 0; i < PX * 16; ++i) tile[i] = 0.0f;
  for (int64_t i = 0; i < KH; ++i) {
    const int64_t hi = ho * SH - PH + i * DH;
    if (hi < 0 || hi >= H) continue;
    for (int64_t j = 0; j < KW; ++j)
      for (int p = 0; p < PX; ++p) {
        const int64_t wi = (wo0 + p) * SW - PW + j * DW;
        if (CHECKED && (wi < 0 || wi >= W)) continue;
        const float* at = x + ((n * H + hi) * W + wi) * C + c0;
        const float* tap = w + (i * KW + j) * C + c0;
#pragma omp simd
        for (int64_t c = 0; c < 16; ++c) tile[p * 16 + c] += at[c] * tap[c];
      }
  }
#endif
}

// The patch of one output pixel (flat index over [batch][HO][WO]) as a row of KH * KW * C floats, zeros where a tap
// falls outside the image: a dense convolution is then the pointwise tile over these rows
template <int64_t C, int64_t H, int64_t W, int64_t HO, int64_t WO, int64_t KH, int64_t KW, int64_t SH, int64_t SW,
          int64_t PH, int64_t PW, int64_t DH, int64_t DW>
static inline void j2t_patch(const float* __restrict x, int64_t pixel, float* __restrict row) {
  const int64_t n = pixel / (HO * WO), ho = (pixel / WO) % HO, wo = pixel % WO;
  for (int64_t i = 0; i < KH; ++i) {
    const int64_t hi = ho * SH - PH + i * DH;
    for (int64_t j = 0; j < KW; ++j) {
      const int64_t wi = wo * SW - PW + j * DW;
      float* to = row + (i * KW + j) * C;
      if (hi < 0 || hi >= H || wi < 0 || wi >= W) {
        for (int64_t c = 0; c < C; ++c) to[c] = 0.0f;
      } else {
        const float* from = x + ((n * H + hi) * W + wi) * C;
        for (int64_t c = 0; c < C; ++c) to[c] = from[c];
      }
    }
  }
}

// tile[c] for one output pixel and the last channels c0..C (fewer than 16), every tap tested
template <int64_t C, int64_t H, int64_t W, int64_t KH, int64_t KW, int64_t SH, int64_t SW, int64_t PH, int64_t PW,
          int64_t DH, int64_t DW>
static inline void j2t_depthwise_tail(const float* __restrict x, const float* __restrict w, int64_t n, int64_t ho,
                                      int64_t wo, int64_t c0, float* __restrict tile) {
  for (int64_t c = c0; c < C; ++c) tile[c - c0] = 0.0f;
  for (int64_t i = 0; i < KH; ++i) {
    const int64_t hi = ho * SH - PH + i * DH;
    if (hi < 0 || hi >= H) continue;
    for (int64_t j = 0; j < KW; ++j) {
      const int64_t wi = wo * SW - PW + j * DW;
      if (wi < 0 || wi >= W) continue;
      const float* at = x + ((n * H + hi) * W + wi) * C;
      const float* tap = w + (i * KW + j) * C;
      for (int64_t c = c0; c < C; ++c) tile[c - c0] += at[c] * tap[c];
    }
  }
}
"""


def render_conv(kernel: K.ConvKernel) -> str:
    """The kernel's C++ function: the template at the kernel's shape, its epilogue (or a plain store) on each tile."""
    x, w = kernel.inputs[0], kernel.inputs[1]
    bias = kernel.inputs[2] if kernel.bias else None
    head = [provenance_comment(kernel, "//"),
            f'J2T_KERNEL int {kernel.name}(void* const* buffers, const int64_t* sizes, int num_threads) {{',
            "  int j2t_status = 0;"]
    for i, b in enumerate(kernel.inputs):
        head.append(f"  const {CTYPES[b.dtype]}* __restrict in_{b.name} = (const {CTYPES[b.dtype]}*)buffers[{i}];")
    for j, b in enumerate(kernel.outputs):
        head.append(f"  {CTYPES[b.dtype]}* __restrict out_{b.name} = "
                    f"({CTYPES[b.dtype]}*)buffers[{len(kernel.inputs) + j}];")
    bias_code = f" + in_{bias.name}[{{c}}]" if bias is not None else ""
    store = _Store(kernel, bias_code)
    body = {"pointwise": _pointwise, "dense": _dense, "depthwise": _depthwise}[kernel.kind](kernel, x, w, store)
    return "\n".join(head + store.root + body + ["  return j2t_status;", "}"])


class _Store:
    """The lines that store a tile: `lines(row, count, first, last, indent)` stores `count` pixels (rows of the flat
    channels-last output from `row`), each the channels [first, last) held at tile[p * 16 + c - first], through
    the epilogue where there is one."""

    def __init__(self, kernel: K.ConvKernel, bias_code: str) -> None:
        self.kernel, self.bias_code = kernel, bias_code
        self.root: list[str] = []
        if kernel.epilogue is None:
            self.var, self.row_lines, self.sweep_lines = "c", [], [
                f"out_{kernel.outputs[0].name}[row * {kernel.cout} + c] = product;"]
            self.unravel: list[str] = []
            return
        writer = _EpilogueWriter(kernel.epilogue, kernel.product)
        rows, sweep = writer.write()
        nest = writer.nest
        if len(nest.inner) != 1 or nest.inner[0].arg[1] != kernel.cout:
            raise ValueError(f"the epilogue of {kernel.name} does not sweep the product's channels")
        self.var = nest.inner[0].arg[0]
        self.root = rows.parent.lines
        self.unravel = [f"const int64_t {name} = {code};" for name, code in unravel("row", nest.outer, "/")]
        self.row_lines = [line.strip() for line in rows.lines]
        self.sweep_lines = [line.strip() for line in sweep.lines]

    def lines(self, row: str, count: str, first: str, last: str, indent: str) -> list[str]:
        c = self.var
        inner = indent + "    "
        return ([f"{indent}for (int64_t p = 0; p < {count}; ++p) {{", f"{indent}  const int64_t row = {row} + p;"]
                + [f"{indent}  {line}" for line in self.unravel + self.row_lines]
                + [f"{indent}  #pragma omp simd",
                   f"{indent}  for (int64_t {c} = {first}; {c} < {last}; ++{c}) {{",
                   f"{inner}const float product = tile[p * 16 + {c} - ({first})]{self.bias_code.format(c=c)};"]
                + [inner + line for line in self.sweep_lines]
                + [f"{indent}  }}", f"{indent}}}"])


class _EpilogueWriter(_KernelWriter):
    """The C++ renderer, but the product's loads are the tile's value (`product`, declared in the sweep)."""

    def __init__(self, kernel: K.Kernel, product: str) -> None:
        super().__init__(kernel)
        self.product = product

    def open_sweep(self, rows: Scope) -> Scope:
        sweep = super().open_sweep(rows)
        for node in K.nodes_in(*self.kernel.values):
            if node.op == "load" and node.arg == self.product:
                sweep.names[id(node)] = "product"
        return sweep


def _parallel(work: int) -> list[str]:
    return ["  #pragma omp parallel for num_threads(num_threads)"] if work > PARALLEL_WORK else []


def _pointwise(kernel: K.ConvKernel, x: K.KernelBuffer, w: K.KernelBuffer, store: _Store) -> list[str]:
    pixels = kernel.batch * kernel.size[0] * kernel.size[1]
    k, n = kernel.cin, kernel.cout
    blocks = -(-n // BLOCK)
    tiles = -(-pixels // ROWS)
    return ([f"  // out[{pixels} pixels, {n}] = x[{pixels}, {k}] @ w[{k}, {n}]: {ROWS}-pixel by 16-channel tiles"]
            + _parallel(pixels * k * n)
            + [f"  for (int64_t t = 0; t < {tiles * blocks}; ++t) {{",
               f"    const int64_t m0 = (t / {blocks}) * {ROWS}, n0 = (t % {blocks}) * 16;",
               f"    const int64_t rows = std::min<int64_t>({ROWS}, {pixels} - m0), "
               f"n1 = std::min<int64_t>(n0 + 16, {n});",
               f"    alignas(32) float tile[{ROWS} * 16];",
               f"    j2t_pointwise_tile<{k}>(in_{x.name} + m0 * {k}, in_{w.name} + n0 * {k}, tile, rows);"]
            + store.lines("m0", "rows", "n0", "n1", "    ")
            + ["  }"])


def _dense(kernel: K.ConvKernel, x: K.KernelBuffer, w: K.KernelBuffer, store: _Store) -> list[str]:
    (h, wd), (ho, wo) = kernel.size, kernel.out_size
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel.kernel_size, kernel.stride, kernel.padding, kernel.dilation
    pixels, n = kernel.batch * ho * wo, kernel.cout
    k = kh * kw * kernel.cin
    tiles = -(-pixels // ROWS)
    shape = f"{kernel.cin}, {h}, {wd}, {ho}, {wo}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}"
    return ([f"  // out[{pixels} pixels, {n}] = {kh}x{kw} convolution over x[{kernel.batch}, {h}, {wd}, {kernel.cin}]: "
             f"the patches of {ROWS} pixels gathered, then {ROWS}-pixel by 16-channel tiles"]
            + _parallel(pixels * k * n)
            + [f"  for (int64_t t = 0; t < {tiles}; ++t) {{",
               f"    const int64_t m0 = t * {ROWS}, rows = std::min<int64_t>({ROWS}, {pixels} - m0);",
               f"    alignas(32) float patches[{ROWS} * {k}];",
               f"    for (int64_t r = 0; r < rows; ++r) j2t_patch<{shape}>(in_{x.name}, m0 + r, patches + r * {k});",
               f"    alignas(32) float tile[{ROWS} * 16];",
               "    for (int64_t n0 = 0; n0 < " + str(n) + "; n0 += 16) {",
               f"      const int64_t n1 = std::min<int64_t>(n0 + 16, {n});",
               f"      j2t_pointwise_tile<{k}>(patches, in_{w.name} + n0 * {k}, tile, rows);"]
            + store.lines("m0", "rows", "n0", "n1", "      ")
            + ["    }", "  }"])


def _depthwise(kernel: K.ConvKernel, x: K.KernelBuffer, w: K.KernelBuffer, store: _Store) -> list[str]:
    (h, wd), (ho, wo) = kernel.size, kernel.out_size
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel.kernel_size, kernel.stride, kernel.padding, kernel.dilation
    c = kernel.cout
    full, tail = c // BLOCK, c % BLOCK
    blocks = full + (1 if tail else 0)
    low = min(-(-pw // sw), wo)  # the first output column whose taps are all inside the image
    reach = wd - 1 + pw - (kw - 1) * dw
    high = max(low, min(wo, reach // sw + 1 if reach >= 0 else 0))  # past the last such column
    shape = f"{c}, {h}, {wd}, {kh}, {kw}, {sh}, {sw}, {ph}, {pw}, {dh}, {dw}"
    args = f"in_{x.name}, in_{w.name}, n, ho, wo"
    lines = [f"  // out[{kernel.batch}, {ho}, {wo}, {c}] = depthwise {kh}x{kw} over x[{kernel.batch}, {h}, {wd}, {c}]"
             f": {PIXELS} pixels of a row by 16 channels at a time"]
    lines += _parallel(kernel.batch * ho * wo * c * kh * kw)
    lines += [f"  for (int64_t t = 0; t < {kernel.batch * ho * blocks}; ++t) {{",
              f"    const int64_t image_row = t / {blocks}, c0 = (t % {blocks}) * 16;",
              f"    const int64_t n = image_row / {ho}, ho = image_row % {ho};",
              f"    alignas(32) float tile[{PIXELS} * 16];",
              f"    if (c0 + 16 <= {c}) {{",
              "      int64_t wo = 0;",
              f"      for (; wo < {low}; ++wo) {{",
              f"        j2t_depthwise_px<{shape}, 1, true>({args}, c0, tile);"]
    lines += store.lines(f"image_row * {wo} + wo", "1", "c0", "c0 + 16", "        ")
    lines += ["      }",
              f"      for (; wo + {PIXELS} <= {high}; wo += {PIXELS}) {{",
              f"        j2t_depthwise_px<{shape}, {PIXELS}, false>({args}, c0, tile);"]
    lines += store.lines(f"image_row * {wo} + wo", str(PIXELS), "c0", "c0 + 16", "        ")
    lines += ["      }",
              f"      for (; wo < {wo}; ++wo) {{",
              f"        j2t_depthwise_px<{shape}, 1, true>({args}, c0, tile);"]
    lines += store.lines(f"image_row * {wo} + wo", "1", "c0", "c0 + 16", "        ")
    lines += ["      }", "    } else {",
              f"      for (int64_t wo = 0; wo < {wo}; ++wo) {{",
              f"        j2t_depthwise_tail<{shape}>({args}, c0, tile);"]
    lines += store.lines(f"image_row * {wo} + wo", "1", "c0", str(c), "        ")
    lines += ["      }", "    }", "  }"]
    return lines


def render_template(kernel: K.Kernel) -> Optional[str]:
    """cpp.render_module's `template`: the source of a convolution kernel, None for a kernel of expressions."""
    return render_conv(kernel) if isinstance(kernel, K.ConvKernel) else None
