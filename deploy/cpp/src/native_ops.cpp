// Ops the runtime computes itself where the library's own kernel is slow (namespace j2t, registered with torch's
// dispatcher when the runtime loads): transpiler/native_ops.py names them in a plan in place of the library's op.
//
// j2t::nms: torchvision::nms on the CPU, which compares each kept box with every later one through the score order's
// indirection, a box at a time (29 ms of SSDlite's 132 ms call here, 180 calls). This one lays the boxes out in
// score order first, so each kept box's comparisons are one branch-free loop over contiguous arrays that the
// compiler vectorises; the same IoU arithmetic in the same order, so the same boxes are kept (against torchvision
// 0.26, whose stable sort it takes; j2t::nms_unstable takes ATen's unstable sort, as 0.28 built for torch 2.13
// does). Plans name the one whose order of equal scores the installed torchvision gives (transpiler/native_ops.py).
//
// j2t::roi_align: torchvision::roi_align on the CPU. torchvision's CPU kernel runs one thread, a channel at a time,
// each bilinear sample a scalar: 61 ms of Faster R-CNN MobileNetV3-320's 193 ms a call here (one thread, 165 boxes
// over a 2x256x10x12 map). This one computes each sample's four positions and weights once, as torchvision does,
// then adds the four pixels' channels as vectors from a channels-last copy of the map, a box per task
// (at::parallel_for). The arithmetic is torchvision's, in its order, with no contraction into FMAs: each element
// gets the same bits (tests/test_native_ops.py), so a detector's boxes do not move.
//
// No FMA contraction: the runtime is built with -ffp-contract=off (deploy/cpp_runtime.py, CMakeLists.txt).
//
// Error messages are built with std::to_string, never c10::str or a TORCH_CHECK with arguments: on the GPU machine
// (g++ 13.3, torch 2.11) any std::ostringstream in an extension built there crashed the process (a 7-line
// extension showed it; docs/benchmarks.md), so those raises were segmentation faults.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace jit2triton {

namespace {

[[noreturn]] void fail(const std::string& message) { TORCH_CHECK(false, message); }  // (a string: no stream)

std::string number(int64_t v) { return std::to_string(v); }

template <typename T>
struct Sample {  // one bilinear sample: the four pixels' offsets in the map (in pixels) and their weights
  int64_t at[4];
  T w[4];
};

// A box's samples over its pooled_height x pooled_width bins, grid_h x grid_w per bin, bin by bin: torchvision's
// pre_calc_for_bilinear_interpolate, the same operations in the same order (a NaN coordinate is an empty sample).
template <typename T>
void box_samples(int64_t height, int64_t width, int64_t pooled_height, int64_t pooled_width, T start_h, T start_w,
                 T bin_h, T bin_w, int64_t grid_h, int64_t grid_w, std::vector<Sample<T>>& out) {
  out.clear();
  for (int64_t ph = 0; ph < pooled_height; ph++)
    for (int64_t pw = 0; pw < pooled_width; pw++)
      for (int64_t iy = 0; iy < grid_h; iy++) {
        const T yy = start_h + ph * bin_h + static_cast<T>(iy + .5f) * bin_h / static_cast<T>(grid_h);
        for (int64_t ix = 0; ix < grid_w; ix++) {
          const T xx = start_w + pw * bin_w + static_cast<T>(ix + .5f) * bin_w / static_cast<T>(grid_w);
          T y = yy, x = xx;
          Sample<T> s{{0, 0, 0, 0}, {0, 0, 0, 0}};
          if (!(y >= -1.0 && y <= height && x >= -1.0 && x <= width)) {
            out.push_back(s);
            continue;
          }
          if (y <= 0) y = 0;
          if (x <= 0) x = 0;
          int64_t y_low = static_cast<int>(y), x_low = static_cast<int>(x), y_high, x_high;
          if (y_low >= height - 1) {
            y_high = y_low = height - 1;
            y = static_cast<T>(y_low);
          } else {
            y_high = y_low + 1;
          }
          if (x_low >= width - 1) {
            x_high = x_low = width - 1;
            x = static_cast<T>(x_low);
          } else {
            x_high = x_low + 1;
          }
          T ly = y - y_low, lx = x - x_low;
          T hy = 1. - ly, hx = 1. - lx;
          s.w[0] = hy * hx, s.w[1] = hy * lx, s.w[2] = ly * hx, s.w[3] = ly * lx;
          s.at[0] = y_low * width + x_low, s.at[1] = y_low * width + x_high;
          s.at[2] = y_high * width + x_low, s.at[3] = y_high * width + x_high;
          out.push_back(s);
        }
      }
}

// A bin's samples per side where the sampling ratio adapts to the box: ceil(the bin's size), as torchvision takes it.
// A box of NaN or absurd size (a random input's) raises instead of overflowing the int or allocating without bound.
template <typename T>
int64_t adaptive_grid(T bin, int64_t box) {
  constexpr double kMostSamples = 1 << 16;
  const double grid = std::ceil(static_cast<double>(bin));
  if (!(grid <= kMostSamples))
    fail("roi_align: box " + number(box) + " is " + std::to_string(static_cast<double>(bin)) +
         " pixels a bin, more than " + number(static_cast<int64_t>(kMostSamples)) +
         " samples a side; its coordinates are not a box in the feature map's image");
  return static_cast<int>(std::ceil(bin));
}

// out[k, c, ph, pw] for boxes [begin, end): `map` is [batch, height, width, channels] (channels innermost), `acc`
// a channels-long row. Per channel: sum over the bin's samples of w1 v1 + w2 v2 + w3 v3 + w4 v4, then / count.
template <typename T>
void boxes(const T* map, const T* rois, T* out, int64_t begin, int64_t end, int64_t channels, int64_t height,
           int64_t width, int64_t pooled_height, int64_t pooled_width, T scale, int64_t sampling_ratio, bool aligned) {
  std::vector<Sample<T>> samples;
  std::vector<T> acc(channels);
  const int64_t bins = pooled_height * pooled_width;
  for (int64_t k = begin; k < end; k++) {
    const T* roi = rois + k * 5;
    const int64_t batch = static_cast<int>(roi[0]);  // (in the batch: roi_align checked)
    const T offset = aligned ? (T)0.5 : (T)0.0;
    const T start_w = roi[1] * scale - offset, start_h = roi[2] * scale - offset;
    const T end_w = roi[3] * scale - offset, end_h = roi[4] * scale - offset;
    T roi_w = end_w - start_w, roi_h = end_h - start_h;
    if (!aligned) {
      roi_w = std::max(roi_w, (T)1.);
      roi_h = std::max(roi_h, (T)1.);
    }
    const T bin_h = static_cast<T>(roi_h) / static_cast<T>(pooled_height);
    const T bin_w = static_cast<T>(roi_w) / static_cast<T>(pooled_width);
    const int64_t grid_h = sampling_ratio > 0 ? sampling_ratio : adaptive_grid(roi_h / pooled_height, k);
    const int64_t grid_w = sampling_ratio > 0 ? sampling_ratio : adaptive_grid(roi_w / pooled_width, k);
    const T count = std::max<int64_t>(grid_h * grid_w, 1);
    box_samples(height, width, pooled_height, pooled_width, start_h, start_w, bin_h, bin_w, grid_h, grid_w, samples);
    // (an inverted box's grid is negative: no samples, though the count, a product, may be positive)
    const int64_t per_bin = std::max<int64_t>(grid_h, 0) * std::max<int64_t>(grid_w, 0);
    const T* plane = map + batch * height * width * channels;
    T* box_out = out + k * channels * bins;
    const Sample<T>* s = samples.data();
    for (int64_t bin = 0; bin < bins; bin++) {
      std::fill(acc.begin(), acc.end(), T(0));
      T* a = acc.data();
      for (int64_t i = 0; i < per_bin; i++, s++) {
        const T *v1 = plane + s->at[0] * channels, *v2 = plane + s->at[1] * channels;
        const T *v3 = plane + s->at[2] * channels, *v4 = plane + s->at[3] * channels;
        const T w1 = s->w[0], w2 = s->w[1], w3 = s->w[2], w4 = s->w[3];
#pragma omp simd
        for (int64_t c = 0; c < channels; c++) a[c] += w1 * v1[c] + w2 * v2[c] + w3 * v3[c] + w4 * v4[c];
      }
      for (int64_t c = 0; c < channels; c++) box_out[c * bins + bin] = a[c] / count;
    }
  }
}

// What torchvision leaves undefined raises here: a box naming an image outside the batch (torchvision reads outside
// its input) and an adaptive grid past kMostSamples a side (adaptive_grid). The same arithmetic as `boxes`.
template <typename T>
void check_boxes(const T* rois, int64_t num_rois, int64_t batches, T scale, int64_t pooled_height,
                 int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  for (int64_t k = 0; k < num_rois; k++) {
    const T* roi = rois + k * 5;
    const int64_t batch = static_cast<int>(roi[0]);
    if (!(batch >= 0 && batch < batches))
      fail("roi_align: box " + number(k) + " names image " + number(batch) + " of a batch of " + number(batches) +
           " (its first column is the image's index in the batch)");
    if (sampling_ratio > 0) continue;
    const T offset = aligned ? (T)0.5 : (T)0.0;
    T roi_w = (roi[3] * scale - offset) - (roi[1] * scale - offset);
    T roi_h = (roi[4] * scale - offset) - (roi[2] * scale - offset);
    if (!aligned) {
      roi_w = std::max(roi_w, (T)1.);
      roi_h = std::max(roi_h, (T)1.);
    }
    adaptive_grid(roi_h / pooled_height, k);
    adaptive_grid(roi_w / pooled_width, k);
  }
}

at::Tensor roi_align(const at::Tensor& input, const at::Tensor& rois, double spatial_scale, int64_t pooled_height,
                     int64_t pooled_width, int64_t sampling_ratio, bool aligned) {
  TORCH_CHECK(input.device().is_cpu() && rois.device().is_cpu(), "j2t::roi_align: CPU tensors only");
  TORCH_CHECK(input.dim() == 4, "j2t::roi_align: input must be [N, C, H, W]");
  TORCH_CHECK(rois.dim() == 2 && rois.size(1) == 5, "rois must have shape as Tensor[K, 5]");
  TORCH_CHECK(input.scalar_type() == rois.scalar_type(), "input should have the same type as rois");
  TORCH_CHECK(input.scalar_type() == at::kFloat || input.scalar_type() == at::kDouble,
              "j2t::roi_align: float32 or float64 tensors only");  // (before AT_DISPATCH, whose message streams)
  const int64_t num_rois = rois.size(0), channels = input.size(1), height = input.size(2), width = input.size(3);
  at::Tensor out = at::empty({num_rois, channels, pooled_height, pooled_width}, input.options());  // (all written)
  if (out.numel() == 0) return out;
  // channels innermost: a sample's four pixels are four contiguous rows of channels
  at::Tensor map = input.permute({0, 2, 3, 1}).contiguous();
  at::Tensor boxes_ = rois.contiguous();
  AT_DISPATCH_FLOATING_TYPES(input.scalar_type(), "j2t::roi_align", [&] {
    const scalar_t* m = map.const_data_ptr<scalar_t>();
    const scalar_t* r = boxes_.const_data_ptr<scalar_t>();
    scalar_t* o = out.mutable_data_ptr<scalar_t>();
    check_boxes(r, num_rois, input.size(0), static_cast<scalar_t>(spatial_scale), pooled_height, pooled_width,
                sampling_ratio, aligned);  // (before the parallel region: nothing raises inside it)
    at::parallel_for(0, num_rois, 1, [&](int64_t begin, int64_t end) {
      boxes<scalar_t>(m, r, o, begin, end, channels, height, width, pooled_height, pooled_width,
                      static_cast<scalar_t>(spatial_scale), sampling_ratio, aligned);
    });
  });
  return out;
}

// std::max and std::min as the loop's own expressions (the same comparisons): the header's, compiled under this
// file's optimize pragma, are not inlined and keep the loop from vectorising
template <typename T>
inline T larger(T a, T b) { return a < b ? b : a; }
template <typename T>
inline T smaller(T a, T b) { return b < a ? b : a; }

// `overlap > threshold` for a T overlap and a double threshold is `overlap > t` for t the largest T not above the
// threshold: compared in T, the loop vectorises
template <typename T>
T threshold_below(double threshold) {
  T t = static_cast<T>(threshold);
  if (static_cast<double>(t) > threshold) t = std::nextafter(t, -std::numeric_limits<T>::infinity());
  return t;
}

// The boxes torchvision's nms keeps, in its order: greedily by descending score (`order`, sorted as torchvision
// sorts), each kept box suppressing the later ones whose IoU with it exceeds the threshold.
template <typename T>
int64_t kept_boxes(const T* boxes, const int64_t* order, int64_t n, double iou_threshold, int64_t* keep) {
  std::vector<T> x1(n), y1(n), x2(n), y2(n), area(n);
  for (int64_t s = 0; s < n; s++) {  // in score order
    const T* b = boxes + order[s] * 4;
    x1[s] = b[0], y1[s] = b[1], x2[s] = b[2], y2[s] = b[3];
    area[s] = (x2[s] - x1[s]) * (y2[s] - y1[s]);
  }
  const T threshold = threshold_below<T>(iou_threshold);
  std::vector<uint8_t> suppressed(n, 0);
  int64_t kept = 0;
  for (int64_t i = 0; i < n; i++) {
    if (suppressed[i]) continue;
    keep[kept++] = order[i];
    const T ix1 = x1[i], iy1 = y1[i], ix2 = x2[i], iy2 = y2[i], iarea = area[i];
    const T *jx1 = x1.data(), *jy1 = y1.data(), *jx2 = x2.data(), *jy2 = y2.data(), *jarea = area.data();
    uint8_t* out = suppressed.data();
    // every later box, suppressed or not: marking one again changes nothing, and no branch keeps the loop vectorised
#pragma omp simd
    for (int64_t j = i + 1; j < n; j++) {
      const T w = larger(static_cast<T>(0), smaller(ix2, jx2[j]) - larger(ix1, jx1[j]));
      const T h = larger(static_cast<T>(0), smaller(iy2, jy2[j]) - larger(iy1, jy1[j]));
      const T inter = w * h;
      const T overlap = inter / (iarea + jarea[j] - inter);
      out[j] |= static_cast<uint8_t>(overlap > threshold);
    }
  }
  return kept;
}

// `stable`: the order of boxes of equal scores, which is torchvision's version's: 0.26 sorts scores stably, 0.28 built
// for torch 2.13 with ATen's unstable sort (this process's ATen: the same order). j2t::nms and j2t::nms_unstable.
at::Tensor nms_sorted(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold, bool stable) {
  TORCH_CHECK(dets.device().is_cpu() && scores.device().is_cpu(), "j2t::nms: CPU tensors only");
  if (dets.dim() != 2) fail("boxes should be a 2d tensor, got " + number(dets.dim()) + "D");
  if (dets.size(1) != 4) fail("boxes should have 4 elements in dimension 1, got " + number(dets.size(1)));
  if (scores.dim() != 1) fail("scores should be a 1d tensor, got " + number(scores.dim()) + "D");
  if (dets.size(0) != scores.size(0))
    fail("boxes and scores should have same number of elements in dimension 0, got " + number(dets.size(0)) +
         " and " + number(scores.size(0)));
  TORCH_CHECK(dets.scalar_type() == scores.scalar_type(), "dets should have the same type as scores");
  TORCH_CHECK(dets.scalar_type() == at::kFloat || dets.scalar_type() == at::kDouble,
              "j2t::nms: float32 or float64 tensors only");
  const int64_t n = dets.size(0);
  at::Tensor keep = at::empty({n}, dets.options().dtype(at::kLong));
  if (n == 0) return keep;
  at::Tensor order = std::get<1>(scores.sort(stable, /*dim=*/0, /*descending=*/true)).contiguous();
  at::Tensor boxes = dets.contiguous();
  int64_t kept = 0;
  AT_DISPATCH_FLOATING_TYPES(dets.scalar_type(), "j2t::nms", [&] {
    kept = kept_boxes<scalar_t>(boxes.const_data_ptr<scalar_t>(), order.const_data_ptr<int64_t>(), n, iou_threshold,
                                keep.mutable_data_ptr<int64_t>());
  });
  return keep.narrow(0, 0, kept);
}

at::Tensor nms(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  return nms_sorted(dets, scores, iou_threshold, /*stable=*/true);
}

at::Tensor nms_unstable(const at::Tensor& dets, const at::Tensor& scores, double iou_threshold) {
  return nms_sorted(dets, scores, iou_threshold, /*stable=*/false);
}

}  // namespace

TORCH_LIBRARY(j2t, m) {
  m.def("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor");
  m.def("nms_unstable(Tensor dets, Tensor scores, float iou_threshold) -> Tensor");
  m.def("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, SymInt pooled_width, "
        "int sampling_ratio, bool aligned) -> Tensor");
}

TORCH_LIBRARY_IMPL(j2t, CPU, m) {
  m.impl("nms", &nms);
  m.impl("nms_unstable", &nms_unstable);
  m.impl("roi_align", &roi_align);
}

}  // namespace jit2triton
