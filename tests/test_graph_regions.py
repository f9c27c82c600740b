"""CUDA graph regions: the straight-line runs of a plan with control flow (deploy/packaging/graph_regions.py).

On the CPU: which steps form a region, what it reads and hands out, and that a plan with regions runs them as their
steps and still matches TorchScript. On a GPU: the C++ runtime captures regions and replays them
(inside a loop, once per iteration), seen as graph launches in torch's profiler, and still matches TorchScript
(`cuda_graphs=False` runs them as their steps).
"""
from __future__ import annotations

import pytest
import torch

import jit2triton
from jit2triton.deploy.packaging.graph_regions import group_regions, has_regions, without_regions

from package_tools import rewrite_package
from helpers import assert_same_outputs, build, copied, fresh_calls, on_gpu, to_device
from models import MODELS

DECODER = next(s for s in MODELS if s.name == "scripted_recurrent_decoder")


def cpu_package(spec, tmp_path):
    source, reference, example = build(spec, tmp_path)
    converted = jit2triton.convert(source, example_inputs=example, device="cpu")
    path = tmp_path / f"{spec.name}.j2t"
    converted.save(path)
    return converted.manifest, path, reference, example


def steps_of(steps):
    for step in steps:
        yield step
        for block in step.get("blocks", ()):
            yield from steps_of(block["steps"])
        yield from steps_of(step.get("steps", ()))


def test_a_loop_body_becomes_one_region_with_the_counter_outside(tmp_path) -> None:
    manifest, *_ = cpu_package(DECODER, tmp_path)
    plan = group_regions(manifest["plan"], manifest["nodes"])
    loop = next(s for s in plan["steps"] if s["kind"] == "loop")
    body = loop["blocks"][0]
    kinds = [s["kind"] for s in body["steps"]]
    assert kinds.count("graph") == 1, kinds
    region = next(s for s in body["steps"] if s["kind"] == "graph")
    assert region["launches"] >= 4
    inside = [manifest["nodes"][s["node"]]["op"] for s in region["steps"]]
    before = [manifest["nodes"][s["node"]]["op"] for s in body["steps"][:kinds.index("graph")]]
    # the counter's arithmetic and the view it picks stay outside: the graph sees a tensor of one layout
    assert "aten::select.int" in before and "aten::remainder.int" in before, before
    assert not any(op.startswith("aten::append") for op in inside)
    # a list the region reads is made inside it (a graph's inputs are tensors and scalars)
    assert not any(op == "prim::ListConstruct" for op in before)
    # it hands out what is read after it, the two carried states and the appended output, and nothing else
    after = body["steps"][kinds.index("graph") + 1:]
    read_after = {r[1] for s in after for r in s["args"] if r[0] == "s"}
    read_after |= {r[1] for r in body["outputs"] if r[0] == "s"}
    assert set(region["outs"]) == read_after & {slot for s in region["steps"] for slot in s["outs"]}
    assert len(region["outs"]) == 3
    # it reads (as its inputs) exactly the slots its steps read before they write them
    read_first, written = [], set()
    for s in region["steps"]:
        read_first += [r[1] for r in s["args"] if r[0] == "s" and r[1] not in written and r[1] not in read_first]
        written.update(s["outs"])
    assert [r[1] for r in region["args"]] == read_first


def view_taken_before_the_write(x):
    """A write that stays in place (as in test_functionalize.py): a view taken before it must see it. Beside it, work
    of its own that a region may hold."""
    a = x * 2.0
    v = a[0]
    a.mul_(3.0)
    b = x.t() @ x  # (four GEMMs: four launches whatever fuses)
    b = torch.tanh(b @ b) * 0.5
    b = torch.tanh(b @ b) * 0.5
    b = torch.tanh(b @ b) * 0.5
    return v + 1.0, a, b


def test_a_region_holds_no_step_near_an_in_place_write() -> None:
    """A region copies its inputs in and its outputs out: a write inside one would write the copy, and a view that
    left one would no longer see a write to its base. So the write, the views of what it writes and their readers
    stay out; the rest of the plan still forms regions."""
    manifest = jit2triton.convert(torch.jit.script(view_taken_before_the_write),
                                  example_inputs=(torch.randn(4, 6),)).manifest
    steps = list(steps_of(manifest["plan"]["steps"]))
    writer = next(s for s in steps if s.get("mutates") == "tensor")
    near = {i for i, node in enumerate(manifest["nodes"]) if node.get("near_write")}
    assert writer["node"] in near
    view = next(s for s in steps if manifest["nodes"][s["node"]]["op"].startswith("aten::select"))
    assert view["node"] in near  # (the view taken before the write, and whatever reads it)
    grouped = list(steps_of(group_regions(manifest["plan"], manifest["nodes"])["steps"]))
    regions = [s for s in grouped if s["kind"] == "graph"]
    assert regions, "the work away from the write formed no region"
    assert not any(s["node"] in near for region in regions for s in region["steps"])


def write_through_a_list(x):
    t = torch.sin(x)
    items = [t, torch.cos(x)]
    u = items[0]
    u.add_(1.0)
    return t * 2.0


def test_a_tensor_written_through_a_list_item_is_near_the_write() -> None:
    """An item taken out of a list may be any tensor put in it: writing the item writes them."""
    manifest = jit2triton.convert(torch.jit.script(write_through_a_list), example_inputs=(torch.randn(4, 6),)).manifest
    steps = list(steps_of(manifest["plan"]["steps"]))
    made = next(s for s in steps if manifest["nodes"][s["node"]]["op"] == "prim::ListConstruct")
    makers = [s for s in steps if set(s["outs"]) & {r[1] for r in made["args"] if r[0] == "s"}]
    assert makers and all(manifest["nodes"][s["node"]].get("near_write") for s in makers)


def test_regions_put_back_as_their_steps_give_the_plan_again(tmp_path) -> None:
    """What the conversion's timing does where step by step was faster (packaging/cuda_graph_choice.py)."""
    manifest, *_ = cpu_package(DECODER, tmp_path)
    grouped = group_regions(manifest["plan"], manifest["nodes"])
    assert has_regions(grouped) and not has_regions(manifest["plan"])
    assert without_regions(grouped) == manifest["plan"]


def test_a_write_that_reaches_an_input_keeps_the_plan_from_one_whole_graph() -> None:
    """A whole-plan graph copies its inputs in: a write to an input (or a view of it) would write the copy. A write to
    a tensor of the plan's own is as good inside the graph as outside it."""
    from jit2triton.loaders import load_script
    from jit2triton.transpiler import pipeline
    from jit2triton.transpiler.from_torchscript import from_torchscript

    def planned(fn):
        script = load_script(torch.jit.script(fn))
        return pipeline.plan(from_torchscript(script.graph, script.input_names, script.name, False))

    assert planned(view_taken_before_the_write).writes_inputs is False
    assert planned(writes_beside_regions).writes_inputs is True


def test_list_appends_are_container_writes(tmp_path) -> None:
    manifest, *_ = cpu_package(DECODER, tmp_path)
    appends = [s for s in steps_of(manifest["plan"]["steps"]) if s.get("op", "").startswith("aten::append")]
    assert appends and all(s["mutates"] == "container" for s in appends)


def test_regions_run_as_their_steps_off_the_gpu_and_match_torchscript(tmp_path) -> None:
    pytest.importorskip("ninja")
    manifest, path, reference, example = cpu_package(DECODER, tmp_path)
    grouped = tmp_path / "grouped.j2t"

    def regroup(m):
        m["plan"] = group_regions(m["plan"], m["nodes"])

    rewrite_package(path, grouped, edit_manifest=regroup)
    loaded = jit2triton.load(grouped)
    assert any(s["kind"] == "graph" for s in steps_of(loaded.manifest["plan"]["steps"]))
    for call in fresh_calls(DECODER, example):
        assert_same_outputs(loaded(*copied(call)), reference(*copied(call)), DECODER)


# ---- on a GPU --------------------------------------------------------------------------------------------------

def graph_launches(call) -> int:
    """How many CUDA graphs `call()` launched, as torch's profiler saw the runtime API."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sum(e.count for e in prof.key_averages() if "cudaGraphLaunch" in e.key)


def fixed_package(fn, example: tuple, tmp_path, device: str = "cuda", **load_options):
    """(fn scripted, its package loaded): converted with choices fixed, so its regions are the ones the plan's shape
    makes, not the ones a timing on this machine keeps."""
    scripted = torch.jit.script(fn)
    path = tmp_path / f"{fn.__name__}.j2t"
    jit2triton.convert(scripted, example_inputs=example, device=device, choices="fixed").save(path)
    return scripted, jit2triton.load(path, **load_options)


@on_gpu
@pytest.mark.parametrize("graphs", [True, False])
def test_gpu_regions_are_captured_replayed_and_match_torchscript(graphs, tmp_path) -> None:
    source, reference, example = build(DECODER, tmp_path)
    path = tmp_path / "decoder.j2t"
    # (choices fixed: the regions as the plan's shape makes them, not as a timing on this machine chooses)
    jit2triton.convert(source, example_inputs=to_device(example, "cuda"), device="cuda", choices="fixed").save(path)
    pytest.importorskip("ninja")
    loaded = jit2triton.load(path, cuda_graphs=graphs, runtime="cpp")
    assert not loaded.manifest["cuda_graph"]  # a loop: the plan cannot run whole as one graph
    assert any(s["kind"] == "graph" for s in steps_of(loaded.manifest["plan"]["steps"]))
    tolerant = type(DECODER)(**{**DECODER.__dict__, "rtol": 2e-5, "atol": 2e-5})
    for call in fresh_calls(DECODER, example):
        expected = reference(*copied(call))
        for _ in range(2):
            actual = loaded(*to_device(call, "cuda"))
            assert_same_outputs(actual.cpu(), expected, tolerant)
    launched = graph_launches(lambda: loaded(*to_device(call, "cuda")))
    if graphs:
        assert launched > 0, "no region was captured"
    else:
        assert launched == 0


def writes_beside_regions(x, n: int):
    """In-place writes (one to a view of the input, which the caller must see) beside GEMM chains that regions hold,
    before and inside a loop."""
    y = x * 2.0
    v = y[0]
    y.mul_(3.0)
    x[1].add_(1.0)
    b = x.t() @ x
    for _ in range(n):
        b = torch.tanh(b @ b) * 0.5
        b = torch.tanh(b @ b) * 0.5
        b = torch.tanh(b @ b) * 0.5
        b = torch.tanh(b @ b) * 0.5
    return v + 1.0, y, b


@on_gpu
def test_gpu_regions_beside_in_place_writes_match_torchscript(tmp_path) -> None:
    pytest.importorskip("ninja")
    scripted, loaded = fixed_package(writes_beside_regions, (torch.randn(16, 32, device="cuda"), 2), tmp_path)
    assert any(s["kind"] == "graph" for s in steps_of(loaded.manifest["plan"]["steps"]))
    for n in (1, 3, 3, 2, 4, 1):
        x = torch.randn(16, 32)
        ours, theirs = x.cuda(), x.clone()
        expected = scripted(theirs, n)
        for actual, want in zip(loaded(ours, n), expected):
            torch.testing.assert_close(actual.cpu(), want, rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(ours.cpu(), theirs, rtol=0, atol=0)  # the input, written in place, as TorchScript
    assert graph_launches(lambda: loaded(torch.randn(16, 32, device="cuda"), 3)) > 0, "no region was captured"


@on_gpu
def test_gpu_conversion_times_regions_against_steps(tmp_path) -> None:
    """Each replay copies a region's inputs in and outputs out: the conversion times the plan with its regions as
    graphs and step by step, and keeps what was faster (packaging/cuda_graph_choice.py)."""
    pytest.importorskip("ninja")
    scripted = torch.jit.script(writes_beside_regions)
    converted = jit2triton.convert(scripted, example_inputs=(torch.randn(16, 32, device="cuda"), 2), device="cuda")
    timed = converted.manifest["report"].get("cuda_graph", {})
    assert "regions" in timed and "steps_us" in timed and "graph_us" in timed, timed
    assert has_regions(converted.manifest["plan"]) == timed["regions"]
    x = torch.randn(16, 32)
    for actual, want in zip(converted(x.cuda(), 3), scripted(x.clone(), 3)):
        torch.testing.assert_close(actual.cpu(), want, rtol=2e-5, atol=2e-5)


def masked_steps(x, n: int):
    """A loop body a graph cannot hold: boolean-mask indexing syncs with the host to size its result. (Divided by
    a constant, not `y.numel()`: a kernel taking a host number stays out of regions, test_scalar_arguments.py. The
    kept values leave the loop, so their count is not bound in it, transpiler/bind_sizes.py: a bound count's
    binding step and the kernels over it stay out of regions, and no region would be left to fail.)"""
    y = x
    kept = x[x > 0]
    for _ in range(n):
        y = torch.sin(y) * 1.5
        kept = y[y > 0]
        y = torch.cos(y) + kept.sum() / 2048.0
        y = torch.tanh(y) * torch.sigmoid(y) - 0.25
    return y + kept.sum() / 4096.0


@on_gpu
def test_a_region_whose_capture_fails_runs_step_by_step(tmp_path) -> None:
    pytest.importorskip("ninja")
    scripted, loaded = fixed_package(masked_steps, (torch.randn(64, 32, device="cuda"), 3), tmp_path)
    assert any(s["kind"] == "graph" for s in steps_of(loaded.manifest["plan"]["steps"]))
    for n in (1, 4, 4):
        x = torch.randn(64, 32)
        torch.testing.assert_close(loaded(x.cuda(), n).cpu(), scripted(x, n), rtol=2e-5, atol=2e-5)
    assert graph_launches(lambda: loaded(torch.randn(64, 32, device="cuda"), 4)) == 0, (
        "a region that syncs with the host was captured")


def test_steps_that_make_cpu_tensors_and_host_side_effects_stay_out_of_regions(tmp_path) -> None:
    manifest, *_ = cpu_package(DECODER, tmp_path)
    every_node = frozenset(range(len(manifest["nodes"])))
    plan = group_regions(manifest["plan"], manifest["nodes"], on_host=every_node)
    assert not any(s["kind"] == "graph" for s in steps_of(plan["steps"]))


def test_literals_inside_a_region_are_stored_and_read_back() -> None:
    """A region's steps keep constants a JSON manifest cannot hold as they are (a device, a dtype, a tuple): they
    are tagged on save and read back on load, as at the plan's top level (a BERT on CUDA failed to save)."""
    import json
    from jit2triton.deploy.literals import decode, encode, map_plan_literals
    inner = {"kind": "call", "op": "aten::tensor", "args": [["c", 0.0], ["c", torch.device("cuda", 0)],
                                                            ["c", torch.float16], ["c", (1, 2)]], "outs": [1]}
    plan = {"steps": [{"kind": "graph", "steps": [inner], "args": [], "outs": [1]}], "outputs": [["s", 1]]}
    stored = json.loads(json.dumps(map_plan_literals(plan, encode)))
    assert map_plan_literals(stored, decode) == plan


def test_graph_places_go_to_the_frequent_keys_of_recent_calls() -> None:
    """More shapes than graph places (a server seeing many lengths): captured on a key's second sighting while
    places are free; then a newcomer takes the place of the least-seen graph only once it was seen more, so the
    frequent shapes keep graphs and a stream of one-off shapes never captures; counts age, so traffic that moves on
    moves the graphs with it."""
    pytest.importorskip("ninja")
    from jit2triton.deploy.cpp_runtime import extension
    calls = []

    def captured() -> tuple[list, set]:  # (captures in order, keys holding graphs) after `calls`, in the C++ runtime
        captures, held = extension().graph_admission(calls, 2, 40)
        return captures, set(held)

    def call(key) -> None:
        calls.append(key)

    for key in ["a", "b", "a", "b", "a", "b"]:  # two hot shapes: captured on their second calls
        call(key)
    captures, graphs = captured()
    assert captures == ["a", "b"]
    for key in range(20):  # one-off shapes: no capture, no eviction
        call(str(key))
    captures, graphs = captured()
    assert graphs == {"a", "b"} and len(captures) == 2
    for _ in range(3):  # "c" becomes hot: seen as often as the graphs' keys, it waits...
        call("c")
    captures, graphs = captured()
    assert "c" not in graphs
    call("c")  # ... and takes the place of the least-seen graph once it out-counts it
    captures, graphs = captured()
    assert "c" in graphs and len(graphs) == 2 and captures[-1] == "c"
    for _ in range(60):  # the traffic moves to "c" and "d": after the counts age, "d" gets a place too
        call("c")
        call("d")
    assert captured()[1] == {"c", "d"}


def conv_steps(x, w, n: int):
    """Convolutions in a loop (cuDNN's: TF32 when torch allows it), two a step: regions replayed per iteration."""
    for _ in range(n):
        x = torch.relu(torch.nn.functional.conv2d(x, w, padding=1)) * 0.5
        x = torch.tanh(torch.nn.functional.conv2d(x, w, padding=1)) + x
    return x


@on_gpu
def test_gpu_a_region_captured_without_tf32_is_not_replayed_with_it(tmp_path) -> None:
    """A graph keeps the kernels cuDNN and cuBLAS chose when it was captured: the graph key holds the math modes, so
    after TF32 comes on the regions run TF32 kernels, as step by step does, and not the float32 ones captured
    before (the benchmark's exact-float32 check left FCOS's regions in float32: 0.80x TorchScript, 1.10x now)."""
    pytest.importorskip("ninja")
    w = torch.randn(64, 64, 3, 3, device="cuda") / 24
    _, graphs = fixed_package(conv_steps, (torch.randn(1, 64, 32, 32, device="cuda"), w, 2), tmp_path)
    steps = jit2triton.load(tmp_path / "conv_steps.j2t", cuda_graphs=False)
    assert has_regions(graphs.manifest["plan"])
    x = torch.randn(1, 64, 32, 32, device="cuda")
    before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32

    def tf32(on: bool) -> None:
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = on
    try:
        tf32(False)
        for _ in range(3):  # (captured on its key's second sighting)
            graphs(x, w, 3)
        exact = steps(x, w, 3)
        tf32(True)
        fast = steps(x, w, 3)
        moved = (fast - exact).abs().max().item()
        if moved == 0:
            pytest.skip("TF32 changes nothing here")
        for _ in range(3):
            replayed = graphs(x, w, 3)
        assert (replayed - fast).abs().max().item() <= moved / 10, "a graph captured without TF32 was replayed"
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before


def writes_its_input(x, w):
    """Straight-line GPU work that writes its input in place first: the caller must see the write."""
    x.mul_(2.0)
    y = torch.tanh(x @ w)
    y = torch.tanh(y @ w)
    y = torch.tanh(y @ w)
    return torch.tanh(y @ w) + x


@on_gpu
def test_gpu_a_plan_writing_its_input_is_not_one_whole_graph(tmp_path) -> None:
    """A whole-plan graph writes its copy of the input; such a plan runs as regions and steps, and the caller's
    tensor is written, call after call, as TorchScript writes it."""
    pytest.importorskip("ninja")
    w = torch.randn(32, 32, device="cuda") / 6
    scripted, loaded = fixed_package(writes_its_input, (torch.randn(16, 32, device="cuda"), w), tmp_path)
    assert not loaded.manifest["cuda_graph"]
    for _ in range(6):
        x = torch.randn(16, 32, device="cuda")
        ours, theirs = x.clone(), x.clone()
        torch.testing.assert_close(loaded(ours, w), scripted(theirs, w), rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
