"""Every bad input gets a clear error from the jit2triton family, naming the problem and what to do."""
import os
import pickle

import pytest
import torch

import jit2triton
from package_tools import format_1_package, read_members, rewrite_package, torchscript_file, write_members


def test_missing_model_file(tmp_path):
    with pytest.raises(jit2triton.ModelLoadError, match="not found"):
        jit2triton.convert(str(tmp_path / "nope.pt"), example_inputs=(torch.randn(2),))


def test_file_that_is_not_an_archive(tmp_path):
    path = tmp_path / "garbage.pt"
    path.write_bytes(os.urandom(1000))
    with pytest.raises(jit2triton.ModelLoadError, match="not a TorchScript archive"):
        jit2triton.convert(str(path), example_inputs=(torch.randn(2),))


def test_eager_checkpoint_is_not_torchscript(tmp_path):
    path = tmp_path / "eager.pt"
    torch.save(torch.nn.Linear(2, 2), path)
    with pytest.raises(jit2triton.ModelLoadError, match="torch.jit.save"):
        jit2triton.convert(str(path), example_inputs=(torch.randn(2),))


def test_eager_module_is_refused_with_a_hint():
    with pytest.raises(jit2triton.ModelLoadError, match="trace or script it first"):
        jit2triton.convert(torch.nn.Linear(2, 2), example_inputs=(torch.randn(2),))


def test_wrong_number_of_example_inputs():
    traced = torch.jit.trace(lambda x, y: x + y, (torch.randn(2), torch.randn(2)))
    with pytest.raises(jit2triton.InputError, match="got 1 example inputs"):
        jit2triton.convert(traced, example_inputs=(torch.randn(2),))


def test_missing_package():
    with pytest.raises(jit2triton.PackageError, match="not found"):
        jit2triton.load("/no/such/model.j2t")


def test_truncated_package(small_package, tmp_path):
    path, _ = small_package
    data = path.read_bytes()
    truncated = tmp_path / "truncated.j2t"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(jit2triton.CorruptPackageError, match="truncated or corrupted"):
        jit2triton.load(truncated)


def test_corrupted_weights_fail_their_checksum(small_package, tmp_path):
    path, _ = small_package
    members = read_members(path)
    blob = bytearray(members["weights.bin"])
    blob[0] ^= 0xFF
    members["weights.bin"] = bytes(blob)
    corrupted = tmp_path / "corrupted.j2t"
    write_members(corrupted, members)  # a well-formed archive: only our checksum can catch it
    with pytest.raises(jit2triton.CorruptPackageError, match="'weights.bin' fails its checksum"):
        jit2triton.load(corrupted)


def test_newer_format_version(small_package, tmp_path):
    path, _ = small_package
    newer = tmp_path / "newer.j2t"
    rewrite_package(path, newer, edit_manifest=lambda m: m.update(format_version=99))
    with pytest.raises(jit2triton.PackageVersionError, match="upgrade jit2triton"):
        jit2triton.load(newer)


def test_incompatible_torch(small_package, tmp_path):
    path, _ = small_package
    old = tmp_path / "old_torch.j2t"
    rewrite_package(path, old, edit_manifest=lambda m: m["producer"].update(torch="1.13.1"))
    with pytest.raises(jit2triton.PackageVersionError, match="torch 1.13.1"):
        jit2triton.load(old)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_package_for_another_device(small_package, tmp_path):
    path, traced = small_package
    cuda = tmp_path / "cuda.j2t"
    rewrite_package(path, cuda, edit_manifest=lambda m: m.update(device="cuda"))
    with pytest.raises(jit2triton.PackageDeviceError, match="its GPU kernels cannot run on the CPU"):
        jit2triton.load(cuda)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_kernel_free_package_may_move_devices(tmp_path):
    traced = torch.jit.trace(lambda x: torch.relu(x) * 2, torch.randn(3))
    path, cuda = tmp_path / "aten.j2t", tmp_path / "cuda.j2t"
    jit2triton.convert(traced, example_inputs=(torch.randn(3),), backend="aten").save(path)
    rewrite_package(path, cuda, edit_manifest=lambda m: m.update(device="cuda"))
    with pytest.raises(jit2triton.PackageDeviceError, match="map_location='cpu'"):
        jit2triton.load(cuda)
    moved = jit2triton.load(cuda, map_location="cpu")  # no generated kernels inside, so it may move
    x = torch.randn(3)
    torch.testing.assert_close(moved(x), traced(x))


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_convert_for_cuda_without_a_gpu(small_package):
    _, traced = small_package
    with pytest.raises(jit2triton.PackageDeviceError, match="no CUDA device"):
        jit2triton.convert(traced, example_inputs=(torch.randn(2, 4), torch.randn(2, 3)), device="cuda")


def test_wrong_number_of_inputs(small_package):
    module = jit2triton.load(small_package[0])
    with pytest.raises(jit2triton.InputError, match=r"expected 2 inputs \(x, y\), got 1"):
        module(torch.randn(2, 4))


def test_one_input_is_one_input_in_the_count_message(tmp_path):
    model = torch.jit.trace(lambda x: x.relu(), (torch.randn(3),))
    jit2triton.convert(model, (torch.randn(3),)).save(tmp_path / "one.j2t")
    with pytest.raises(jit2triton.InputError, match=r"^expected 1 input \(x\), got 2; pass them in that order$"):
        jit2triton.load(tmp_path / "one.j2t")(torch.randn(3), torch.randn(3))


def test_wrong_shape_names_the_input(small_package):
    module = jit2triton.load(small_package[0])
    with pytest.raises(jit2triton.InputError, match=r"input 1 \('y'\): expected float32\[2, 3\] on cpu, got float32\[5, 3\]"):
        module(torch.randn(2, 4), torch.randn(5, 3))


def test_wrong_dtype_names_the_input(small_package):
    module = jit2triton.load(small_package[0])
    with pytest.raises(jit2triton.InputError, match=r"input 0 \('x'\): expected float32\[2, 4\] on cpu, got float16"):
        module(torch.randn(2, 4).half(), torch.randn(2, 3))


def test_wrong_device_names_the_input(small_package):
    module = jit2triton.load(small_package[0])
    with pytest.raises(jit2triton.InputError, match=r"input 0 \('x'\).* on meta"):
        module(torch.randn(2, 4, device="meta"), torch.randn(2, 3))


def test_not_a_tensor(small_package):
    module = jit2triton.load(small_package[0])
    with pytest.raises(jit2triton.InputError, match="expected a tensor"):
        module([1.0, 2.0], torch.randn(2, 3))


def test_loading_never_unpickles(small_package, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a package load tried to unpickle")

    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "Unpickler", refuse)
    monkeypatch.setattr(torch, "load", refuse)
    module = jit2triton.load(small_package[0])
    assert module(torch.randn(2, 4), torch.randn(2, 3)).shape == (2, 3)
    from jit2triton.deploy.cpp_runtime import carried_member
    assert sorted(read_members(small_package[0])) == ["binaries/kernels.so", "checksums.json", "kernels/kernels.cpp",
                                                      "manifest.json", carried_member()[0], "weights.bin"]


def test_an_op_failing_at_run_time_names_the_op_and_source():
    @torch.jit.script
    def pick(x, i: int):
        return x[i]

    module = jit2triton.convert(pick, example_inputs=(torch.randn(3), 1))
    with pytest.raises(jit2triton.Jit2TritonError, match=r"aten::select.int failed \(model source"):
        module(torch.randn(3), 7)


def test_a_scalar_input_that_sets_a_kernel_input_shape_is_served_not_misread():
    """Conversion runs the model at other values of `n` too: the sizes it sets are seen to vary, so no kernel is
    fitted to the example's (tests/test_fixed_sizes.py: the error where one was)."""
    @torch.jit.script
    def tile(x, n: int):
        return x.repeat(n + 1, 1) * 2.0 + 1.0

    module = jit2triton.convert(tile, example_inputs=(torch.randn(3, 4), 2))
    for n in (2, 0, 5):
        x = torch.randn(3, 4)
        torch.testing.assert_close(module(x, n), tile(x, n))


def test_a_torchscript_file_is_named_as_such(tmp_path):
    with pytest.raises(jit2triton.PackageError, match="is a TorchScript archive .* convert it with `jit2triton convert`"):
        jit2triton.load(torchscript_file(tmp_path))


def test_a_format_1_package_is_refused_with_what_to_do(small_package, tmp_path):
    with pytest.raises(jit2triton.PackageVersionError, match="format 1 .* convert the model again"):
        jit2triton.load(format_1_package(small_package[0], tmp_path))


def test_a_cpu_package_sent_to_a_gpu_says_what_to_do(small_package):
    with pytest.raises(jit2triton.PackageDeviceError) as refused:
        jit2triton.load(small_package[0], map_location="cuda")
    message = str(refused.value)
    assert "run only there" in message and "device='cuda'" in message and "device='cpu'" not in message


def test_a_saved_package_takes_its_mode_from_the_umask(small_package, tmp_path):
    import os
    module = jit2triton.load(small_package[0])
    old = os.umask(0o022)
    try:
        module.save(tmp_path / "shared.j2t")
    finally:
        os.umask(old)
    assert (tmp_path / "shared.j2t").stat().st_mode & 0o777 == 0o644


def test_a_killed_save_leaves_nothing_the_next_save_keeps(small_package, tmp_path):
    module = jit2triton.load(small_package[0])
    tmp_path = tmp_path / "saves"
    tmp_path.mkdir()
    stale = tmp_path / ".model.j2t.999999999.abc123.j2t-partial"  # a save whose process is gone
    stale.write_bytes(b"half a package")
    running = tmp_path / f".model.j2t.{__import__('os').getpid()}.xyz.j2t-partial"  # one still under way
    running.write_bytes(b"in progress")
    module.save(tmp_path / "model.j2t")
    assert not stale.exists() and running.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == [running.name, "model.j2t"]


@pytest.mark.parametrize("version", [0, -7, "2", 2.0, True, None])
def test_a_format_version_no_jit2triton_wrote_is_refused(small_package, tmp_path, version):
    edited = tmp_path / "edited.j2t"
    rewrite_package(small_package[0], edited, edit_manifest=lambda m: m.update(format_version=version))
    with pytest.raises(jit2triton.CorruptPackageError, match="names a package format no jit2triton wrote"):
        jit2triton.load(edited)


def test_a_package_from_another_torch_minor_version_is_refused(small_package, tmp_path):
    edited = tmp_path / "edited.j2t"
    rewrite_package(small_package[0], edited, edit_manifest=lambda m: m["producer"].update(torch="2.99.0"))
    with pytest.raises(jit2triton.PackageVersionError, match="made with torch 2.99.0"):
        jit2triton.load(edited)
    patch = tmp_path / "patch.j2t"
    release = ".".join(torch.__version__.split("+")[0].split(".")[:2])
    rewrite_package(small_package[0], patch, edit_manifest=lambda m: m["producer"].update(torch=release + ".99"))
    assert jit2triton.load(patch)(torch.randn(2, 4), torch.randn(2, 3)).shape == (2, 3)  # patch releases may differ


def test_string_formatting_in_a_plan_is_torchscripts_not_pythons():
    """A package's format string must not reach Python's str.format, which evaluates lookups written in it."""
    from jit2triton.deploy.host_ops import HOST_OPS
    fmt = HOST_OPS["aten::format"]
    assert fmt("a {} b {}", 1, "x") == "a 1 b x"
    assert fmt("{0.__class__.__init__.__globals__}", 1) == "{0.__class__.__init__.__globals__}"

    @torch.jit.script
    def describe(x: int) -> str:
        return "v={} w={}".format(x, x + 1)

    module = jit2triton.convert(describe, example_inputs=(3,))
    assert module(7) == describe(7) == "v=7 w=8"


def test_inputs_may_be_passed_by_name_as_torchscript_takes_them(small_package):
    path, traced = small_package
    module = jit2triton.load(path)
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    torch.testing.assert_close(module(x, y=y), traced(x, y))
    torch.testing.assert_close(module(y=y, x=x), traced(x, y))
    with pytest.raises(jit2triton.InputError, match="unknown input 'z'"):
        module(x, z=y)
    with pytest.raises(jit2triton.InputError, match="'x' was given by position and by name"):
        module(x, x=x)
    with pytest.raises(jit2triton.InputError, match="input 'x' has no default"):
        module(y=y)


@pytest.mark.parametrize("where", ["cpu", torch.device("cpu"), {"cpu": "cpu"}, {"cuda:0": "cuda:1"}, None])
def test_map_location_takes_torch_jit_loads_forms(small_package, where):
    path, traced = small_package
    module = jit2triton.load(path, map_location=where)
    assert module.device == torch.device("cpu")
    x, y = torch.randn(2, 4), torch.randn(2, 3)
    torch.testing.assert_close(module(x, y), traced(x, y))


def test_a_map_location_dict_applies_the_entry_for_the_packages_device(small_package):
    with pytest.raises(jit2triton.PackageDeviceError, match="compiled for the CPU and run only there"):
        jit2triton.load(small_package[0], map_location={"cpu": "cuda:1"})


def test_extra_files_travel_from_the_pt_into_the_package_as_with_torch_jit(tmp_path, cpp_runtime):
    model = torch.jit.trace(torch.nn.Linear(3, 2).eval(), torch.randn(1, 3))
    pt, package = tmp_path / "model.pt", tmp_path / "model.j2t"
    torch.jit.save(model, str(pt), _extra_files={"labels.json": b'["cat", "dog"]', "version.txt": "1.2"})
    jit2triton.convert(str(pt), (torch.randn(1, 3),)).save(package, _extra_files={"version.txt": "1.3"})
    wanted = {"labels.json": "", "version.txt": "", "missing.txt": "x"}
    jit2triton.load(package, _extra_files=wanted)
    reference = {"labels.json": "", "missing.txt": "x"}
    torch.jit.load(str(pt), _extra_files=reference)
    assert wanted["labels.json"] == reference["labels.json"] == b'["cat", "dog"]'
    assert wanted["version.txt"] == b"1.3"  # set at save, over the .pt's
    assert wanted["missing.txt"] == reference["missing.txt"] == b""


def test_provenance_names_the_first_frame_outside_torch_even_in_a_torch_named_sibling_package():
    """A traced node's stack starts inside torch (nn.Conv2d's forward); the line named is the model's own, and a
    model library installed beside torch (torchvision, torchaudio) is the model's code, not torch's."""
    from jit2triton.transpiler.from_torchscript import _source

    torch_dir = os.path.dirname(torch.__file__)
    resnet = torch_dir + "vision" + os.sep + os.path.join("models", "resnet.py")

    class TracedNode:
        def sourceRange(self):
            return (f"{os.path.join(torch_dir, 'nn', 'modules', 'conv.py')}(549): _conv_forward\n"
                    f"{resnet}(92): forward\n<stdin>(6): <module>\n")

        def __str__(self):
            return "%y : Tensor = aten::_convolution(%x)\n"

    source = _source(TracedNode(), full_path=True)
    assert (source.file, source.line) == (resnet, 92)


def test_a_node_torchscript_made_without_a_source_range_names_its_nearest_consumers_line():
    """Freezing on CUDA merges linears that read one input into one linear and slices, none with a source range."""
    from jit2triton.transpiler.from_torchscript import _sources_from_consumers
    from jit2triton.transpiler.ir import Block, Graph, Node, Source, Value

    x, merged, q, out = Value("x"), Value("merged"), Value("q"), Value("out")
    line = Source("model.py", 7, "q = self.q(x).view(b, s, h, d)")
    nodes = [Node("aten::linear", [x], [merged]), Node("aten::slice.Tensor", [merged], [q]),
             Node("aten::view", [q], [out], source=line)]
    _sources_from_consumers(Graph(Block([x], nodes, [out])))
    assert [n.source for n in nodes] == [line, line, line]


def test_a_map_location_dict_keyed_by_a_gpu_index_applies_to_a_cuda_package():
    from jit2triton.deploy.runtime_choice import resolve_map_location
    assert resolve_map_location({"cuda:0": "cuda:1"}, "cuda") == "cuda:1"
    assert resolve_map_location({"cuda:0": "cuda:1", "cuda": "cuda:2"}, "cuda") == "cuda:2"  # the exact key first
    assert resolve_map_location({torch.device("cuda", 0): "cpu"}, "cpu") is None
    with pytest.raises(jit2triton.PackageDeviceError, match="'gpu0' that is not a device"):
        resolve_map_location({"gpu0": "cuda:1"}, "cuda")


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_rewrite_that_changes_the_model_falls_back_to_torchscript_s_own_graph(dynamic, monkeypatch, tmp_path):
    """A bug in a rewrite before fusion must cost speed, not the conversion: the package is TorchScript's own graph
    through ATen, verified, and the report says why."""
    from jit2triton.transpiler import pipeline
    from jit2triton.transpiler.op_table import schema_of

    def wrong(graph, ctx):  # a deliberately broken rewrite: relu becomes neg
        for node in graph.walk():
            if node.op == "aten::relu":
                node.op, node.attrs["schema"] = "aten::neg", schema_of("aten::neg")
    monkeypatch.setattr(pipeline, "PASSES", [pipeline.Pass("wrong", wrong, "rewrite")] + pipeline.PASSES)
    model = torch.jit.trace(lambda x: torch.relu(x) * 2 + 1, (torch.randn(4, 8),))
    options = {"dynamic_shapes": {"x": {0: jit2triton.Dim("n", min=1, max=16)}}} if dynamic else {}
    converted = jit2triton.convert(model, (torch.randn(4, 8),), **options)
    assert converted.manifest["backend"] == "aten"
    notes = converted.manifest["report"]["verification"]["notes"]
    assert any("rewritten model does not match" in n for n in notes), notes
    path = tmp_path / "m.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    for n in ((4, 11) if dynamic else (4,)):
        x = torch.randn(n, 8)
        torch.testing.assert_close(loaded(x), model(x))


@pytest.mark.parametrize("where", ["optional rewrite", "required pass"])
def test_a_pass_that_crashes_costs_speed_not_the_conversion(where, monkeypatch, tmp_path):
    """An internal error in a pass before fusion never reaches the user (a TypeError in onednn_linear's timing,
    found on wav2vec2 with a dynamic length): a rewrite that only speeds the graph up is skipped, and the kernels
    stay; any other pass costs the kernels. The report says which pass failed."""
    from helpers import replace_pass

    def crash(graph, ctx):  # a deliberately broken pass, after half rewriting the graph
        for node in graph.walk():
            if node.op == "aten::relu":
                node.op = "aten::neg"
        raise TypeError("can't multiply sequence by non-int of type 'str'")
    name = "gemm_forms" if where == "optional rewrite" else "check_indices"
    replace_pass(monkeypatch, name, crash)
    model = torch.jit.trace(lambda x: torch.relu(x) * 2 + 1, (torch.randn(4, 8),))
    converted = jit2triton.convert(model, (torch.randn(4, 8),))
    notes = converted.manifest["report"]["verification"]["notes"]
    assert any(f"pass {name} failed (TypeError" in n for n in notes), notes
    if where == "optional rewrite":
        assert converted.manifest["backend"] == "cpp" and converted.manifest["kernels"]
    else:
        assert converted.manifest["backend"] == "aten"
    path = tmp_path / "m.j2t"
    converted.save(path)
    x = torch.randn(4, 8)
    torch.testing.assert_close(jit2triton.load(path)(x), model(x))


def test_a_pass_that_crashes_with_every_op_through_aten_is_a_clear_bug_report(monkeypatch):
    from helpers import replace_pass

    def crash(graph, ctx):
        raise KeyError(7)
    replace_pass(monkeypatch, "observe", crash)
    model = torch.jit.trace(lambda x: x + 1, (torch.randn(4),))
    with pytest.raises(jit2triton.ConversionError, match=r"pass observe failed \(KeyError: 7\).*a bug in jit2triton"):
        jit2triton.convert(model, (torch.randn(4),), backend="aten")
