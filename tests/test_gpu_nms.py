"""torchvision's NMS as ATen's sort and two generated kernels (transpiler/gpu_nms.py, emitters/triton_nms.py): the
kernels keep torchvision's boxes in its order, at every count, and a converted detector's post-process gives
TorchScript's boxes. On the CPU the kernels run under Triton's interpreter against torchvision's CUDA arithmetic
written out in Python; on the GPU against torchvision itself, on boxes placed where its rounding decides."""
from __future__ import annotations

import functools

import pytest
import torch

import jit2triton
from jit2triton.emitters import triton_nms
from jit2triton.transpiler import gpu_nms, native_ops, nms_facts, pipeline
from jit2triton.transpiler import kernel_ir as K
from jit2triton.transpiler.symbolic import SymSize

from helpers import on_cpu, on_gpu


def kept_by_kernels(boxes: torch.Tensor, scores: torch.Tensor, threshold: float, symbolic: bool,
                    form: str = "fma_later") -> torch.Tensor:
    """The kernels' kept indices: rendered as a package renders them (over a size bound at run time, or a fixed
    count, the overlap rounded as `form`), launched on the boxes' device."""
    from jit2triton.emitters.compile_triton import FP_FUSION, kernel_function
    n = boxes.shape[0]
    count = SymSize.symbol("s0") if symbolic else n
    ranked = K.KernelBuffer("boxes", "float32", (count, 4), (4, 1))
    words = K.KernelBuffer("words", "int8", (count * count + 8 * count,), (1,))
    keep = K.KernelBuffer("keep", "bool", (count,), (1,))
    mask = triton_nms.render_nms_mask(K.NmsMaskKernel("nms_mask", (), [ranked], [words], [], threshold=threshold,
                                                      iou_form=form))
    walk = triton_nms.render_nms_walk(K.NmsWalkKernel("nms_walk", (), [words], [keep], []))
    order = scores.sort(stable=True, dim=0, descending=True)[1]
    sorted_boxes = boxes.index_select(0, order).contiguous()
    bits = torch.empty(n * n + 8 * n, dtype=torch.int8, device=boxes.device)
    flags = torch.empty(n, dtype=torch.bool, device=boxes.device)
    sizes = [n] if symbolic else []
    # (without FMA contraction, as packages compile every kernel: compile_triton.FP_FUSION)
    kernel_function(mask.source, mask.name)[(-(-n // 64),)](sorted_boxes, bits, *sizes, XBLOCK=64,
                                                            enable_fp_fusion=FP_FUSION)
    kernel_function(walk.source, walk.name)[(1,)](bits, flags, *sizes, XBLOCK=1, enable_fp_fusion=FP_FUSION)
    return order[flags]


def _fma(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """float32 a * b + c rounded once (the product is exact in float64)."""
    return (a.double() * b.double() + c.double()).float()


def torchvision_cuda_nms(boxes: torch.Tensor, scores: torch.Tensor, threshold: float, fma: bool = True) -> torch.Tensor:
    """torchvision's CUDA nms written out: a stable descending sort, then greedily each box not overlapped past the
    threshold by a kept one, the overlap in its devIoU's float arithmetic (the later box's area an FMA into the
    earlier's: what nms_facts found on an H200); `fma` False: its CPU kernel's, every op rounded."""
    order = scores.sort(stable=True, dim=0, descending=True)[1]
    b = boxes[order]
    t = torch.tensor(threshold, dtype=torch.float32)
    kept: list[int] = []
    for i in range(len(b)):
        if kept:
            a = b[torch.tensor(kept)]
            width = (torch.minimum(a[:, 2], b[i, 2]) - torch.maximum(a[:, 0], b[i, 0])).clamp(min=0)
            height = (torch.minimum(a[:, 3], b[i, 3]) - torch.maximum(a[:, 1], b[i, 1])).clamp(min=0)
            inter = width * height
            area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
            area_b = (b[i, 2] - b[i, 0], b[i, 3] - b[i, 1])
            denominator = (_fma(*area_b, area_a) if fma else area_a + area_b[0] * area_b[1]) - inter
            if bool(((inter.double() / denominator.double()).float() > t).any()):
                continue
        kept.append(i)
    return order[torch.tensor(kept, dtype=torch.int64)]


def random_boxes(n: int, spread: float, generator: torch.Generator, device: str = "cpu"):
    xy = torch.rand(n, 2, generator=generator) * 100
    wh = torch.rand(n, 2, generator=generator) * 100 * spread + 1
    return torch.cat([xy, xy + wh], 1).to(device), torch.rand(n, generator=generator).to(device)


def near_threshold_pairs(k: int, threshold: float, generator: torch.Generator) -> torch.Tensor:
    """k pairs [2k, 4] of boxes whose overlap is within a few float32 steps of the threshold, each pair far from
    the others (nms_facts' pairs: the earlier boxes, then the later)."""
    return torch.cat(nms_facts.threshold_pairs(k, threshold, generator))


@on_cpu
@pytest.mark.parametrize("symbolic", [False, True])
def test_kernels_keep_torchvisions_boxes_at_every_count(symbolic):
    g = torch.Generator().manual_seed(5)
    for n, spread in ((0, 1.0), (1, 1.0), (3, 0.5), (63, 0.3), (64, 0.3), (65, 0.3), (130, 0.05), (200, 1.5)):
        boxes, scores = random_boxes(n, spread, g)
        scores[: n // 4] = scores[n // 4: 2 * (n // 4)]  # tied scores: the sort's order decides
        expected = torchvision_cuda_nms(boxes, scores, 0.5)
        assert 0 < len(expected) < n or n < 64, (n, len(expected))  # (some suppressed, some kept)
        assert torch.equal(kept_by_kernels(boxes, scores, 0.5, symbolic), expected), n


def telling_pairs(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes and scores of box pairs whose keep decision the overlap's rounding turns: each pair's later box is
    kept in one form and suppressed in another (nms_facts' probe pairs, those on which the forms disagree)."""
    earlier, later = nms_facts.telling_pairs(20000, 0.5, torch.Generator().manual_seed(7))
    count = len(earlier)
    scores = torch.cat([torch.full((count,), 2.0), torch.full((count,), 1.0)])
    return torch.cat([earlier, later]).to(device), scores.to(device)


@on_cpu
def test_kernels_round_the_overlap_as_they_are_told():
    """On pairs whose keep decision turns on the overlap's rounding, the kernels follow the form they are given:
    the FMA form as torchvision's CUDA code and the plain one as its CPU code (each fails with the other)."""
    boxes, scores = telling_pairs()
    assert len(boxes) >= 20  # (10 pairs or more)
    expected = {form: torchvision_cuda_nms(boxes, scores, 0.5, fma=fma) for form, fma in (("fma_later", True),
                                                                                            ("plain", False))}
    assert not torch.equal(expected["fma_later"], expected["plain"])
    for form, kept in expected.items():
        assert torch.equal(kept_by_kernels(boxes, scores, 0.5, symbolic=False, form=form), kept), form


@on_cpu
def test_the_overlaps_form_is_asked_of_torchvision():
    """nms_facts finds the form the installed NMS rounds by: here a stand-in computing each form in turn."""
    for fma, form in ((False, "plain"), (True, "fma_later")):
        library = torch.library.Library("j2t_test_nms", "DEF")
        library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        library.impl("nms", lambda b, s, t, fma=fma: torchvision_cuda_nms(b, s, t, fma=fma), "CPU")
        assert nms_facts.iou_form_of(torch.ops.j2t_test_nms.nms, "cpu") == form
        del library


def _torchvision_nms() -> None:
    """torchvision's NMS op, or where torchvision is not installed a stand-in of its name and schema computing its
    CPU kernel's answer. Registered when a test first asks (after collection: a stand-in another test module makes
    at import is kept, and its tests see their own)."""
    try:
        import torchvision  # noqa: F401
    except ImportError:
        if not hasattr(torch.ops.torchvision, "nms"):
            library = torch.library.Library("torchvision", "FRAGMENT")
            library.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            library.impl("nms", lambda b, s, t: torchvision_cuda_nms(b, s, t, fma=False), "CPU")
            _torchvision_nms.library = library  # (kept alive: the op goes with it)


@functools.lru_cache(maxsize=None)
def scripted(name: str):
    """The test programs, scripted once the op they call exists."""
    _torchvision_nms()

    def post_process(boxes, scores):
        keep = scores > 0.2
        b, s = boxes[keep], scores[keep]
        kept = torch.ops.torchvision.nms(b, s, 0.5)
        return b[kept] * 2.0, s[kept]

    def nms_of_inputs(boxes, scores):
        return torch.ops.torchvision.nms(boxes, scores, 0.5)

    def nms_of_kernels(boxes, scores):  # (a kernel's exact outputs: what it reads is ATen's bit for bit)
        return torch.ops.torchvision.nms(boxes * 2.0, scores * 1.0, 0.5)

    programs = {"post_process": post_process, "nms_of_inputs": nms_of_inputs, "nms_of_kernels": nms_of_kernels}
    return torch.jit.script(programs[name])


@pytest.fixture
def generated_nms(monkeypatch):
    monkeypatch.setattr(gpu_nms, "MODE", "generated")


@on_cpu
def test_a_converted_post_process_gives_torchscripts_boxes_at_every_count(generated_nms, tmp_path):
    """Six calls on fresh boxes, in the converted module and in the package loaded again."""
    post_process = scripted("post_process")
    g = torch.Generator().manual_seed(11)
    converted = jit2triton.convert(post_process, random_boxes(120, 0.4, g), backend="triton")
    summary = converted.summary()
    assert {"nms0_mask", "nms0_walk"} <= {k["name"] for k in summary["kernels"]}, summary["kernels"]
    assert "torchvision::nms" not in summary["fallback_ops"]
    converted.save(str(tmp_path / "post.j2t"))
    loaded = jit2triton.load(str(tmp_path / "post.j2t"))
    counts = set()
    for spread in (0.4, 1.0, 0.2, 0.05, 2.0, 0.7):  # (120 boxes each: the kept count varies with the data)
        inputs = random_boxes(120, spread, g)
        expected = post_process(*inputs)
        counts.add(len(expected[1]))
        for module in (converted, loaded):
            for got, want in zip(module(*inputs), expected):
                assert torch.equal(got, want), spread
    assert len(counts) >= 4, counts


@on_cpu
@pytest.mark.parametrize("name", ["post_process", "nms_of_inputs"])
def test_a_wrong_nms_kernel_is_taken_out(generated_nms, monkeypatch, name):
    """Verification takes out a walk made wrong on purpose (every box kept), whether the NMS reads kernels' outputs
    or the model's inputs: the call is torchvision's again and the package's boxes TorchScript's. (The walk's flags
    have no value in ATen's plan: verification runs torchvision's NMS on the package's own inputs to it.)"""
    monkeypatch.setattr(triton_nms, "_WALK", triton_nms._WALK.replace("take = ((gone >> i) & 1) == 0",
                                                                         "take = gone == gone"))
    model = scripted(name)
    g = torch.Generator().manual_seed(13)
    converted = jit2triton.convert(model, random_boxes(120, 0.4, g), backend="triton")
    summary = converted.summary()
    assert not {"nms0_mask", "nms0_walk"} & {k["name"] for k in summary["kernels"]}
    assert [k["kernel"] for k in summary["verification"]["kernels_removed"]] == ["nms0_walk"], summary["verification"]
    inputs = random_boxes(120, 0.4, g)
    got, want = converted(*inputs), model(*inputs)
    for got, want in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert torch.equal(got, want)


@on_gpu
def test_gpu_kernels_keep_torchvisions_boxes():
    """Against torchvision's CUDA nms itself: random boxes at many counts, and pairs whose decision turns on the
    overlap's rounding (a wrong overlap form fails this), in the form nms_facts asks torchvision for."""
    torchvision = pytest.importorskip("torchvision")
    form = nms_facts.torchvision_iou_form("cuda")
    assert form is not None
    g = torch.Generator().manual_seed(17)
    for n, spread in ((0, 1.0), (1, 1.0), (65, 0.3), (300, 0.2), (1000, 0.5), (5000, 0.3)):
        boxes, scores = random_boxes(n, spread, g, "cuda")
        expected = torchvision.ops.nms(boxes, scores, 0.5)
        assert torch.equal(kept_by_kernels(boxes, scores, 0.5, symbolic=True, form=form), expected), n
    for threshold in (0.5, 0.45, 0.7):
        boxes = near_threshold_pairs(4000, threshold, g).cuda()
        scores = torch.cat([torch.full((4000,), 2.0), torch.full((4000,), 1.0)]).cuda()
        expected = torchvision.ops.nms(boxes, scores, threshold)
        assert torch.equal(kept_by_kernels(boxes, scores, threshold, symbolic=True, form=form), expected), threshold
    boxes, scores = telling_pairs("cuda")  # (where the forms disagree: a wrong form fails here)
    for threshold in (0.5,):
        expected = torchvision.ops.nms(boxes, scores, threshold)
        assert torch.equal(kept_by_kernels(boxes, scores, threshold, symbolic=True, form=form), expected), threshold


@on_gpu
def test_gpu_converted_post_process_gives_torchscripts_boxes():
    pytest.importorskip("torchvision")
    post_process = scripted("post_process")
    g = torch.Generator().manual_seed(19)
    example = random_boxes(2000, 0.3, g, "cuda")
    converted = jit2triton.convert(post_process, example, device="cuda")
    assert {"nms0_mask", "nms0_walk"} <= {k["name"] for k in converted.summary()["kernels"]}
    for spread in (0.3, 1.0, 0.1, 3.0, 0.5, 2.0):
        inputs = random_boxes(2000, spread, g, "cuda")
        for got, want in zip(converted(*inputs), post_process(*inputs)):
            assert torch.equal(got, want), spread


@on_cpu
def test_an_nms_over_a_count_no_run_binds_binds_it(generated_nms, monkeypatch):
    """A count no run binds (FCOS's and SSD's candidates, a cat of per-level lists made in a loop, on the GPU
    machine): here, the mask's count left opaque. The rewrite's sort binds it, and the kernels take it."""
    monkeypatch.setattr(pipeline, "bind_opaque_sizes", lambda graph, recorder, dims: {})
    post_process = scripted("post_process")
    g = torch.Generator().manual_seed(29)
    converted = jit2triton.convert(post_process, random_boxes(120, 0.4, g), backend="triton")
    assert [k["name"] for k in converted.summary()["kernels"] if k["name"].startswith("nms")] == \
        ["nms0_mask", "nms0_walk"]
    assert not any(k["name"].startswith("k") and "index" in k["name"] for k in converted.summary()["kernels"])
    counts = set()
    for spread in (0.4, 1.0, 0.1):
        inputs = random_boxes(120, spread, g)
        expected = post_process(*inputs)
        counts.add(len(expected[1]))
        for got, want in zip(converted(*inputs), expected):
            assert torch.equal(got, want), spread
    assert len(counts) == 3, counts


@on_cpu
def test_an_nms_over_more_boxes_than_the_mask_allows_stays_torchvisions(generated_nms, monkeypatch):
    """The mask takes n * n bytes: a call that may hold more than MAX_BOXES boxes keeps torchvision's."""
    monkeypatch.setattr(gpu_nms, "MAX_BOXES", 100)
    nms_of_inputs = scripted("nms_of_inputs")
    g = torch.Generator().manual_seed(23)
    converted = jit2triton.convert(nms_of_inputs, random_boxes(120, 0.4, g), backend="triton")
    assert not any(k["name"].startswith("nms") for k in converted.summary()["kernels"])
    inputs = random_boxes(120, 0.4, g)
    assert torch.equal(converted(*inputs), nms_of_inputs(*inputs))


def test_an_nms_deciding_otherwise_on_the_same_inputs_is_not_put_down_to_rounding(monkeypatch):
    """The runtime's own CPU NMS made to order tied scores the other way: it reads exactly what ATen's plan reads,
    so its other answer is no rounding, and the package must not ship it as "matched up to rounding" (it did)."""
    model = scripted("nms_of_kernels")
    corner = torch.arange(512, dtype=torch.float32)[:, None] * 10
    boxes, scores = torch.cat([corner, corner, corner + 5, corner + 5], 1), (torch.arange(512) % 4).float() / 4
    if torch.equal(scores.sort(stable=True, descending=True)[1], scores.sort(stable=False, descending=True)[1]):
        pytest.skip("ATen's unstable sort keeps these ties in order on this machine")
    right = native_ops.nms_variant()
    if not right:
        pytest.skip("no runtime NMS keeps this torchvision's order")
    monkeypatch.setitem(native_ops._CHOSEN, "torchvision::nms",
                        lambda: {"j2t::nms": "j2t::nms_unstable", "j2t::nms_unstable": "j2t::nms"}[right])
    converted = jit2triton.convert(model, (boxes, scores), backend="cpp")
    assert converted.summary()["verification"]["status"] != "matched up to rounding"
    assert torch.equal(converted(boxes, scores), model(boxes, scores))
