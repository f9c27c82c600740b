"""The runtime's own CPU kernels for library ops (deploy/cpp/src/native_ops.cpp, transpiler/native_ops.py):
`j2t::roi_align`, and `j2t::nms` or `j2t::nms_unstable` (the one keeping torchvision's order of ties), in place of
torchvision's.

Where torchvision is installed, the runtime's ops must give torchvision's answers exactly. Where it is not (CI),
stand-ins are registered here, computing torchvision's algorithms in torch ops (roi_align's in another order, so
compared within float32's rounding; nms's kept boxes exactly): scripted models call them, and the packages must
match them."""
import math

import pytest
import torch

import jit2triton
from jit2triton.deploy import cpp_runtime
from helpers import assert_same, plan_ops

try:
    import torchvision  # noqa: F401 - registers torchvision::roi_align
    TORCHVISION = True
except ImportError:
    TORCHVISION = False


def reference_roi_align(x, rois, spatial_scale, pooled_height, pooled_width, sampling_ratio, aligned):
    """torchvision's CPU algorithm, a box and a bin at a time, every channel at once."""
    out = x.new_zeros(rois.shape[0], x.shape[1], pooled_height, pooled_width)
    height, width = x.shape[2:]
    for k, (b, x1, y1, x2, y2) in enumerate(rois.tolist()):
        if not 0 <= int(b) < x.shape[0]:  # (torchvision reads outside its input; the runtime raises)
            raise IndexError(f"roi_align: box {k} names image {int(b)} of a batch of {x.shape[0]}")
        offset = 0.5 if aligned else 0.0
        start_w, start_h = x1 * spatial_scale - offset, y1 * spatial_scale - offset
        roi_w, roi_h = x2 * spatial_scale - offset - start_w, y2 * spatial_scale - offset - start_h
        if not aligned:
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        bin_h, bin_w = roi_h / pooled_height, roi_w / pooled_width
        grid_h = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_h / pooled_height)
        grid_w = sampling_ratio if sampling_ratio > 0 else math.ceil(roi_w / pooled_width)
        for ph in range(pooled_height):
            for pw in range(pooled_width):
                acc = x.new_zeros(x.shape[1])
                for iy in range(grid_h):
                    for ix in range(grid_w):
                        y = start_h + ph * bin_h + (iy + 0.5) * bin_h / grid_h
                        xx = start_w + pw * bin_w + (ix + 0.5) * bin_w / grid_w
                        if not (-1.0 <= y <= height and -1.0 <= xx <= width):
                            continue
                        y, xx = max(y, 0.0), max(xx, 0.0)
                        y_low, x_low = int(y), int(xx)
                        y_high, x_high = y_low + 1, x_low + 1
                        if y_low >= height - 1:
                            y_high = y_low = height - 1
                            y = float(y_low)
                        if x_low >= width - 1:
                            x_high = x_low = width - 1
                            xx = float(x_low)
                        ly, lx = y - y_low, xx - x_low
                        hy, hx = 1.0 - ly, 1.0 - lx
                        plane = x[int(b)]
                        acc += (hy * hx * plane[:, y_low, x_low] + hy * lx * plane[:, y_low, x_high]
                                + ly * hx * plane[:, y_high, x_low] + ly * lx * plane[:, y_high, x_high])
                out[k, :, ph, pw] = acc / max(grid_h * grid_w, 1)
    return out


def reference_nms(boxes, scores, iou_threshold, stable: bool = True):
    """torchvision's CPU algorithm: by descending score (a stable sort, as 0.26 sorts; or ATen's unstable one, as
    0.28 for torch 2.13 does), each box kept unless a kept one overlaps it by more than the threshold, the IoU
    computed as torchvision computes it."""
    x1, y1, x2, y2 = boxes.unbind(1)
    area = (x2 - x1) * (y2 - y1)
    kept = []
    for i in torch.sort(scores, dim=0, descending=True, stable=stable)[1].tolist():
        if kept:
            j = torch.tensor(kept)
            w = (torch.minimum(x2[i], x2[j]) - torch.maximum(x1[i], x1[j])).clamp(min=0)
            h = (torch.minimum(y2[i], y2[j]) - torch.maximum(y1[i], y1[j])).clamp(min=0)
            inter = w * h
            if bool(((inter / (area[j] + area[i] - inter)) > iou_threshold).any()):
                continue
        kept.append(i)
    return torch.tensor(kept, dtype=torch.int64)


if not TORCHVISION:  # the stand-ins, as torchvision would register them
    LIBRARY = torch.library.Library("torchvision", "FRAGMENT")  # (other tests add their stand-ins)
    LIBRARY.define("roi_align(Tensor input, Tensor rois, float spatial_scale, SymInt pooled_height, "
                   "SymInt pooled_width, int sampling_ratio, bool aligned) -> Tensor")
    LIBRARY.impl("roi_align", reference_roi_align, "CPU")
    if not hasattr(torch.ops.torchvision, "nms"):  # (tests/test_data_dependent_sizes.py may have made one)
        LIBRARY.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        LIBRARY.impl("nms", reference_nms, "CPU")


def boxes(k: int, batch: int, height: int, width: int, scale: float, generator: torch.Generator) -> torch.Tensor:
    """k boxes [batch index, x1, y1, x2, y2] in image coordinates over the map: inside, across its edges, one wholly
    outside, one empty and two inverted (x2 < x1; and y2 < y1) among them."""
    xy = (torch.rand(k, 2, generator=generator) * 1.4 - 0.2) * torch.tensor([width, height]) / scale
    size = torch.rand(k, 2, generator=generator) * torch.tensor([width, height]) / scale
    rois = torch.cat([torch.randint(0, batch, (k, 1), generator=generator).float(), xy, xy + size], 1)
    rois[0, 1:] = torch.tensor([-60.0, -60.0, -45.0, -45.0])
    rois[1, 1:] = rois[1, 1:3].repeat(2)
    rois[2, 3] = rois[2, 1] - 3.0
    rois[4, 3:] = rois[4, 1:3] - 40.0 / scale  # (inverted both ways: an aligned adaptive grid is negative on both)
    return rois


CASES = [(0.5, 3, 3, 2, False), (0.25, 7, 7, 0, True), (1.0, 2, 4, -1, False)]


@pytest.mark.parametrize("scale, pooled_h, pooled_w, sampling, aligned", CASES)
def test_the_runtimes_roi_align_computes_torchvisions(scale, pooled_h, pooled_w, sampling, aligned):
    cpp_runtime.extension()  # (registers the j2t ops)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 24, 11, 9, generator=g)
    rois = boxes(12, 2, 11, 9, scale, g)
    got = torch.ops.j2t.roi_align(x, rois, scale, pooled_h, pooled_w, sampling, aligned)
    want = torch.ops.torchvision.roi_align(x, rois, scale, pooled_h, pooled_w, sampling, aligned)
    if TORCHVISION:
        assert torch.equal(got, want), (got - want).abs().max()  # the same bits
    else:
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)  # (the stand-in rounds in double)
    assert torch.ops.j2t.roi_align(x, rois[:0], scale, pooled_h, pooled_w, sampling, aligned).shape == \
        (0, 24, pooled_h, pooled_w)
    with pytest.raises(RuntimeError, match="float32 or float64 tensors only"):
        torch.ops.j2t.roi_align(x.half(), rois.half(), scale, pooled_h, pooled_w, sampling, aligned)
    rois[3, 0] = 2.0
    with pytest.raises(RuntimeError, match="box 3 names image 2 of a batch of 2"):
        torch.ops.j2t.roi_align(x, rois, scale, pooled_h, pooled_w, sampling, aligned)
    if sampling <= 0:  # a box of absurd size: its adaptive grid raises rather than allocating without bound
        rois[3] = torch.tensor([0.0, 0.0, 0.0, 1e30, 1e30])
        with pytest.raises(RuntimeError, match="box 3 is .* pixels a bin"):
            torch.ops.j2t.roi_align(x, rois, scale, pooled_h, pooled_w, sampling, aligned)


class Pooled(torch.nn.Module):
    def __init__(self, scale: float, pooled_h: int, pooled_w: int, sampling: int, aligned: bool) -> None:
        super().__init__()
        self.scale, self.pooled_h, self.pooled_w, self.sampling, self.aligned = \
            scale, pooled_h, pooled_w, sampling, aligned

    def forward(self, features, rois):
        pooled = torch.ops.torchvision.roi_align(torch.relu(features), rois, self.scale, self.pooled_h,
                                                 self.pooled_w, self.sampling, self.aligned)
        return pooled, pooled.mean(dim=(2, 3))


@pytest.mark.parametrize("scale, pooled_h, pooled_w, sampling, aligned", CASES)
def test_a_cpu_package_calls_the_runtimes_roi_align(scale, pooled_h, pooled_w, sampling, aligned, tmp_path):
    g = torch.Generator().manual_seed(1)
    make = lambda: (torch.randn(2, 24, 11, 9, generator=g), boxes(12, 2, 11, 9, scale, g))  # noqa: E731
    scripted = torch.jit.script(Pooled(scale, pooled_h, pooled_w, sampling, aligned))
    converted = jit2triton.convert(scripted, make(), device="cpu")
    report = converted.report()
    assert "j2t::roi_align x1" in report and "torchvision::roi_align" not in report, report
    path = tmp_path / "m.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for call in range(6):
        inputs = make()
        got, want = loaded(*inputs), scripted(*inputs)
        if TORCHVISION:
            assert torch.equal(got[0], want[0]), f"call {call}"
        assert_same(got, want, f"call {call}")


def test_float64_keeps_the_librarys_roi_align():
    g = torch.Generator().manual_seed(2)
    make = lambda: (torch.randn(1, 4, 8, 8, generator=g, dtype=torch.float64),  # noqa: E731
                    boxes(5, 1, 8, 8, 1.0, g).double())
    scripted = torch.jit.script(Pooled(1.0, 2, 2, 2, False))
    converted = jit2triton.convert(scripted, make(), device="cpu")
    assert "j2t::roi_align" not in converted.report()
    inputs = make()
    assert_same(converted(*inputs), scripted(*inputs))


def test_a_plan_naming_the_runtimes_op_needs_no_library():
    from jit2triton.deploy.policy import library_of
    from jit2triton.deploy.resolve import check_plan_ops
    assert library_of("j2t::roi_align") is None and library_of("torchvision::roi_align") == "torchvision"
    check_plan_ops({"steps": [{"kind": "call", "op": "j2t::roi_align"}]})  # (no library to import for it)


def test_the_reference_interpreter_finds_the_runtimes_op_in_a_fresh_process():
    """conversion's Executor (the culprit search) resolves plan ops by name: a j2t op loads the runtime first."""
    import subprocess
    import sys
    code = "from jit2triton.deploy.resolve import resolve_op; print(resolve_op('j2t::roi_align'))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "j2t.roi_align" in done.stdout, done.stderr[-2000:]


def scored_boxes(n: int, generator: torch.Generator, dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """n boxes over a 60x60 image with scores, among them equal scores, copies of one box, zero-area boxes and
    inverted ones (x2 < x1)."""
    xy = torch.rand(n, 2, generator=generator) * 50
    boxes = torch.cat([xy, xy + torch.rand(n, 2, generator=generator) * 25 - 2], 1)
    if n >= 8:
        boxes[: n // 8] = boxes[n // 8]
        boxes[n // 8: n // 4, 2:] = boxes[n // 8: n // 4, :2]
    scores = (torch.rand(n, generator=generator) * 4).round() / 4 * torch.rand(n, generator=generator).round()
    return boxes.to(dtype), scores.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_runtimes_nms_keeps_torchvisions_boxes(dtype):
    """j2t::nms and j2t::nms_unstable against torchvision's algorithm (reference_nms) with each sort on boxes with
    equal scores, and against the installed torchvision where scores differ (the order of equal scores is
    torchvision's version's: 0.26 sorts stably, 0.28 built for torch 2.13 does not)."""
    cpp_runtime.extension()
    g = torch.Generator().manual_seed(3)
    for n in (0, 1, 2, 17, 64, 300):
        for threshold in (0.0, 0.3, 0.45, 0.5, 0.7, 1.0, -1.0):
            boxes, scores = scored_boxes(n, g, dtype)
            for op, stable in ((torch.ops.j2t.nms, True), (torch.ops.j2t.nms_unstable, False)):
                got, want = op(boxes, scores, threshold), reference_nms(boxes, scores, threshold, stable)
                assert torch.equal(got, want), (n, threshold, stable, got, want)
            if TORCHVISION:
                scores = torch.randperm(n, generator=g).to(dtype) / max(n, 1)  # (no two equal)
                want = torch.ops.torchvision.nms(boxes, scores, threshold)
                for op in (torch.ops.j2t.nms, torch.ops.j2t.nms_unstable):
                    got = op(boxes, scores, threshold)
                    assert torch.equal(got, want), (n, threshold, got, want)
    with pytest.raises(RuntimeError, match="boxes should have 4 elements in dimension 1, got 5"):
        torch.ops.j2t.nms(torch.zeros(3, 5, dtype=dtype), torch.zeros(3, dtype=dtype), 0.5)
    with pytest.raises(RuntimeError, match="same number of elements in dimension 0, got 3 and 2"):
        torch.ops.j2t.nms(torch.zeros(3, 4, dtype=dtype), torch.zeros(2, dtype=dtype), 0.5)


@pytest.mark.parametrize("chosen", ["as installed", "none"])
def test_a_cpu_package_names_the_runtimes_nms_that_keeps_torchvisions_order(chosen, monkeypatch):
    """A plan names j2t::nms or j2t::nms_unstable, whichever keeps the installed torchvision's (or the stand-in's,
    a stable sort's) order of equal scores, or neither; the package matches TorchScript on 6 draws of boxes with ties."""
    from jit2triton.transpiler import native_ops
    native_ops.nms_variant.cache_clear()
    if chosen == "none":
        monkeypatch.setattr(native_ops, "_CHOSEN", {"torchvision::nms": lambda: ""})
    variant = native_ops._CHOSEN["torchvision::nms"]()
    if chosen != "none" and not variant:
        pytest.skip("the installed torchvision's order of equal scores is neither sort's")

    @torch.jit.script
    def postprocess(boxes, scores):
        keep = torch.ops.torchvision.nms(boxes, scores, 0.45)
        return boxes[keep] * 2.0, scores[keep]

    g = torch.Generator().manual_seed(4)
    converted = jit2triton.convert(postprocess, scored_boxes(120, g), device="cpu")
    ops = set(plan_ops(converted))
    named = ops & {"torchvision::nms", "j2t::nms", "j2t::nms_unstable"}
    assert named == {variant or "torchvision::nms"}, ops
    for _ in range(6):
        inputs = scored_boxes(120, g)
        assert_same(converted(*inputs), postprocess(*inputs))


def test_the_runtimes_nms_is_chosen_by_the_installed_torchvisions_order_of_ties():
    from jit2triton.transpiler.native_ops import nms_variant
    nms_variant.cache_clear()
    boxes = torch.arange(64.0)[:, None] * 10 + torch.tensor([0.0, 0.0, 5.0, 5.0])  # (disjoint: all kept)
    scores = (torch.arange(64) % 2).float()
    kept = torch.ops.torchvision.nms(boxes, scores, 0.5)
    stable = torch.equal(kept, torch.sort(scores, descending=True, stable=True)[1])
    unstable = torch.equal(kept, torch.sort(scores, descending=True)[1])
    assert nms_variant() == ("j2t::nms" if stable else "j2t::nms_unstable" if unstable else "")


def test_the_runtime_formats_text_without_streams():
    """On the GPU machine (g++ 13.3, torch 2.11) a std::ostringstream in an extension built there crashed the
    process, so c10::str and a TORCH_CHECK with arguments made every error of the runtime's ops a segmentation
    fault: messages are strings built with std::to_string (`fail`), or one literal; print formats numbers with
    snprintf, a trusted key is read with fread. Left: print's text of a tensor (c10's own printing, once)."""
    import glob
    import os
    import re
    root = os.path.join(os.path.dirname(cpp_runtime.__file__), "cpp")
    sources = {path: re.sub(r"//[^\n]*", "", open(path).read())  # the library and its Python extension
               for part in ("src", "include", "python")
               for path in glob.glob(os.path.join(root, part, "**", "*.[ch]*"), recursive=True)}
    assert any(path.endswith("native_ops.cpp") for path in sources) and len(sources) > 20, sources.keys()
    for path, code in sources.items():
        assert not re.search(r"stringstream|fstream|iostream|std::cout|std::cerr", code), path
        assert code.count("c10::str") == (1 if path.endswith("host_ops.cpp") else 0), path
        for check in re.findall(r"TORCH_CHECK\(.*?\);", code, re.S):
            assert re.fullmatch(r'TORCH_CHECK\([^"]*,\s*"[^"]*"\s*\);', check) \
                or check == "TORCH_CHECK(false, message);", (path, check)
