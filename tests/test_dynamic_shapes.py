"""Dynamic shapes: one package serves every size in its declared ranges, checked against TorchScript at many sizes,
and refuses sizes outside them (or that break a relation between inputs) with an InputError naming the dim."""
from __future__ import annotations

import random
import re
import subprocess
import sys

import pytest
import torch

import jit2triton
from jit2triton import ConversionError, Dim, InputError
from jit2triton.transpiler.symbolic import SymSize, fit

from helpers import BACKENDS, FRESH_SEED, assert_close_on_gpu, assert_same, convert_for, copied, to_cpu, to_device


class Encoder(torch.nn.Module):
    """An attention block whose shape arithmetic reads the input's sizes (x.shape, view(b * s, ...), heads)."""

    def __init__(self, vocab: int = 50, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)
        self.norm = torch.nn.LayerNorm(hidden)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor):
        x = self.embed(ids)
        b, s, h = x.shape
        q, k, v = self.qkv(x).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        scores = q @ k.transpose(-1, -2) / (h // self.heads) ** 0.5
        scores = scores + (1.0 - mask[:, None, None, :]) * -1e4
        attended = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
        y = self.norm(x + torch.nn.functional.gelu(self.out(attended)))
        return (y.view(b * s, h) ** 2).sum(-1).view(b, s), y.mean(1)  # (a LayerNorm's plain sum is rounding noise)


def encoder_inputs(batch: int, seq: int, generator: torch.Generator) -> tuple:
    ids = torch.randint(0, 50, (batch, seq), generator=generator)
    mask = (torch.rand(batch, seq, generator=generator) < 0.8).float()
    mask[:, 0] = 1.0
    return ids, mask


BATCH, SEQ = Dim("batch", min=1, max=8), Dim("seq", min=1, max=48)
DYNAMIC = {"ids": {0: BATCH, 1: SEQ}, "mask": {0: BATCH, 1: SEQ}}


@pytest.fixture(scope="module")
def encoder():
    torch.manual_seed(0)
    return torch.jit.trace(Encoder().eval(), encoder_inputs(2, 6, torch.Generator().manual_seed(0)))


def sizes_to_try(count: int = 6, seed: int = FRESH_SEED) -> list[tuple[int, int]]:
    """The ranges' ends and random sizes inside them (conversion saw none of these but by chance)."""
    rng = random.Random(seed)
    return [(1, 1), (8, 48)] + [(rng.randint(1, 8), rng.randint(1, 48)) for _ in range(count - 2)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_one_package_serves_every_size_in_its_ranges(encoder, backend, tmp_path) -> None:
    example = encoder_inputs(2, 6, torch.Generator().manual_seed(0))
    converted = convert_for(encoder, example, backend, dynamic_shapes=DYNAMIC)
    # a wrong kernel must fail here, not only be taken out by verification (which keeps the answers right)
    assert converted.summary()["verification"]["kernels_removed"] == []
    if backend != "aten":  # kernels over the dynamic dims themselves, not only over static values
        assert len(converted.summary()["kernels"]) >= 5 and "dim_seq" in converted.code
    path = tmp_path / "encoder.j2t"
    converted.save(path)
    loaded = jit2triton.load(path)
    generator = torch.Generator().manual_seed(FRESH_SEED)
    for batch, seq in sizes_to_try():
        inputs = encoder_inputs(batch, seq, generator)
        expected = encoder(*copied(inputs))
        # on CUDA the third call at a shape replays the CUDA graph the second captured for that shape
        for name, module in (("converted", converted), ("loaded", loaded)) * (3 if backend == "cuda" else 1):
            actual = module(*to_device(copied(inputs), converted.device))
            if backend == "cuda":
                assert_close_on_gpu(to_cpu(actual), expected, f"{name} at batch={batch}, seq={seq}")
            else:
                assert_same(actual, expected, f"{name} at batch={batch}, seq={seq}")


@pytest.mark.parametrize("backend", [b for b in BACKENDS if getattr(b, "values", (b,))[0] != "triton"])
def test_the_cpp_runtime_serves_every_size_and_refuses_others(encoder, backend, tmp_path, cpp_runtime) -> None:
    example = encoder_inputs(2, 6, torch.Generator().manual_seed(0))
    path = tmp_path / "encoder.j2t"
    converted = convert_for(encoder, example, backend, dynamic_shapes=DYNAMIC)
    assert converted.summary()["verification"]["kernels_removed"] == [] and "dim_seq" in converted.code
    converted.save(path)
    module = jit2triton.load(path, runtime="cpp")
    generator = torch.Generator().manual_seed(FRESH_SEED + 1)
    for batch, seq in sizes_to_try(seed=5):
        inputs = encoder_inputs(batch, seq, generator)
        expected = encoder(*copied(inputs))
        if backend == "cuda":  # the Triton kernels' grids and size arguments set per call by the C++ launcher;
            for _ in range(3):  # the third call replays the CUDA graph the second captured for this shape
                actual = module(*to_device(copied(inputs), converted.device))
                assert_close_on_gpu(to_cpu(actual), expected, f"batch={batch}, seq={seq}")
        else:
            assert_same(module(*copied(inputs)), expected, f"batch={batch}, seq={seq}")
    python = jit2triton.load(path)
    for bad in [encoder_inputs(9, 4, generator), encoder_inputs(2, 49, generator),
                (encoder_inputs(2, 5, generator)[0], encoder_inputs(2, 6, generator)[1])]:
        bad = to_device(bad, converted.device)
        with pytest.raises(InputError) as from_cpp:
            module(*bad)
        with pytest.raises(InputError) as from_python:
            python(*bad)
        assert str(from_cpp.value) == str(from_python.value)


def test_out_of_range_and_unequal_sizes_are_refused_naming_the_dim(encoder) -> None:
    example = encoder_inputs(2, 6, torch.Generator().manual_seed(0))
    converted = jit2triton.convert(encoder, example, dynamic_shapes=DYNAMIC, backend="aten")
    generator = torch.Generator().manual_seed(3)
    with pytest.raises(InputError, match=r"axis 0 is dim batch, whose range is 1\.\.8; got 9"):
        converted(*encoder_inputs(9, 4, generator))
    ids, _ = encoder_inputs(2, 5, generator)
    _, mask = encoder_inputs(2, 7, generator)
    with pytest.raises(InputError, match=r"input 1 \('mask'\): axis 1 is dim seq, which is 5 in input 0 \('ids'\) "
                                         r"axis 1; got 7"):
        converted(ids, mask)
    with pytest.raises(InputError, match="expected int64"):
        converted(ids.float(), mask[:, :5])


def test_dict_and_nested_outputs_name_their_dims(tmp_path) -> None:
    class Heads(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
            flat = x.reshape(-1, x.shape[-1])
            return {"scores": x.softmax(-1), "pooled": x.sum(1)}, [flat * 2.0]

    example = (torch.randn(3, 4, 5),)
    model = torch.jit.script(Heads())
    converted = jit2triton.convert(model, example, dynamic_shapes=[{0: Dim("B", max=9), 1: Dim("S", max=12)}])
    expected = "(x: float32[B, S, 5]) -> Tuple[Dict{scores: float32[B, S, 5], pooled: float32[B, 5]}, " \
               "List[float32[B*S, 5]]]"
    assert converted.signature() == expected
    converted.save(tmp_path / "heads.j2t")
    assert jit2triton.load(tmp_path / "heads.j2t").signature() == expected
    x = torch.randn(7, 2, 5)
    assert_same(converted(x.clone()), model(x.clone()), "at B=7, S=2")


def test_the_signature_report_and_ir_name_the_dims(encoder) -> None:
    example = encoder_inputs(2, 6, torch.Generator().manual_seed(0))
    converted = jit2triton.convert(encoder, example, dynamic_shapes=DYNAMIC)
    assert converted.signature() == ("(ids: int64[batch, seq], mask: float32[batch, seq]) -> "
                                     "Tuple[float32[batch, seq], float32[batch, 32]]")
    assert converted.summary()["dynamic_dims"] == {"batch": {"min": 1, "max": 8, "example": 2},
                                                   "seq": {"min": 1, "max": 48, "example": 6}}
    assert "dynamic dim seq: 1..48 (converted at 6)" in converted.report()
    assert "float32[batch, seq, 3, 4, 8]" in converted.manifest["ir"]  # the qkv view's shape kept symbolic
    # the view(b * s, h), by sizes read at run time, is inside a kernel
    assert any("aten::view" in k["ops"] for k in converted.summary()["kernels"])
    verification = converted.summary()["verification"]
    assert verification["status"] == "passed" and verification["input_sets"] >= 4  # the ranges' ends too


def test_dims_by_position_and_as_lists(encoder) -> None:
    example = encoder_inputs(2, 6, torch.Generator().manual_seed(0))
    converted = jit2triton.convert(encoder, example, dynamic_shapes=[[BATCH, SEQ], (BATCH, SEQ)], backend="aten")
    inputs = encoder_inputs(3, 11, torch.Generator().manual_seed(4))
    assert_same(converted(*copied(inputs)), encoder(*copied(inputs)))


@pytest.mark.parametrize("dynamic_shapes, message", [
    ({"idz": {0: BATCH}}, "names input 'idz'"),
    ({"ids": {2: BATCH}}, "has 2 dims; dynamic_shapes names axis 2"),
    ({"ids": {0: Dim("batch", min=3, max=8)}}, "is 2 in the example inputs, outside its Dim batch's range 3..8"),
    ({"ids": {0: BATCH, 1: BATCH}}, "axes that share a Dim must have equal sizes"),
    ({"ids": {0: BATCH}, "mask": {0: Dim("batch", max=4)}}, "two different Dims are named 'batch'"),
    ({"ids": {0: 8}}, "must be a jit2triton.Dim"),
    ([None, None, None], "has 3 entries, the model 2 inputs"),
])
def test_bad_dynamic_shapes_are_refused(encoder, dynamic_shapes, message) -> None:
    example = encoder_inputs(2, 6, torch.Generator().manual_seed(0))
    with pytest.raises(ConversionError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        jit2triton.convert(encoder, example, dynamic_shapes=dynamic_shapes)


@pytest.mark.parametrize("args, message", [(("2b",), "identifier"), (("b", 0), "min must be"),
                                           (("b", 4, 2), "max must be an int >= min")])
def test_bad_dims_are_refused(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        Dim(*args)


class Flatten(torch.nn.Module):
    def forward(self, x):
        return x * torch.ones(2, 1, 1)  # traced: the 2 is a constant, so the batch dim cannot change


def test_a_model_that_specialises_on_a_dim_is_refused_at_convert_time() -> None:
    traced = torch.jit.trace(Flatten(), torch.randn(2, 3, 4))
    with pytest.raises(ConversionError, match=r"does not run at b=8: `return x \* torch.ones.*specialises on b"):
        jit2triton.convert(traced, (torch.randn(2, 3, 4),), dynamic_shapes={"x": {0: Dim("b", max=8)}})
    # the dim that does not matter to the constant is free
    converted = jit2triton.convert(traced, (torch.randn(2, 3, 4),), dynamic_shapes={"x": {1: Dim("n", max=8)}})
    x = torch.randn(2, 7, 4)
    assert_same(converted(x), traced(x))


def test_sizes_are_fitted_to_the_simplest_polynomial() -> None:
    draws = [{"b": 2, "s": 6}, {"b": 3, "s": 7}, {"b": 5, "s": 23}, {"b": 1, "s": 11}, {"b": 7, "s": 2}]
    cases = {lambda b, s: b: "b", lambda b, s: 768 * b * s: "768*b*s", lambda b, s: s + 1: "s + 1",
             lambda b, s: 12 * b * s * s: "12*b*s*s", lambda b, s: b * s + s: "b*s + s", lambda b, s: 64: "64",
             lambda b, s: 2 * s - 1: "2*s - 1"}
    for size, text in cases.items():
        assert str(fit([size(**d) for d in draws], draws)) == text
    assert fit([(d["s"] + 1) // 2 for d in draws], draws) is None  # not a polynomial: an opaque size
    assert SymSize.of([(2, ("s",)), (-2, ("s",))]) == 0
    assert SymSize.of([(3, ("s", "b")), (1, ())]) == SymSize.of([(1, ()), (3, ("b", "s"))])
    assert SymSize.of([(3, ("s", "b"))]).evaluate({"b": 2, "s": 5}) == 30


def test_cli_converts_with_dims_and_runs_at_chosen_sizes(tmp_path) -> None:
    torch.manual_seed(0)
    model = torch.jit.trace(Encoder().eval(), encoder_inputs(2, 6, torch.Generator().manual_seed(0)))
    pt, package = tmp_path / "encoder.pt", tmp_path / "encoder.j2t"
    model.save(pt)
    cli = [sys.executable, "-m", "jit2triton.cli"]
    done = subprocess.run(cli + ["convert", str(pt), "--input", "BxS:int64:0-50", "--input", "BxS:float32:1-2",
                                 "--dim", "B=1:8", "--dim", "S=1:48:6", "-o", str(package)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "dynamic dim S: 1..48 (converted at 6)" in done.stdout
    done = subprocess.run(cli + ["run", str(package), "--shape", "B=3,S=17", "--check", str(pt), "--runs", "1"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "signature: (ids: int64[B, S], mask: float32[B, S])" in done.stdout
    error = float(done.stdout.split("max abs error against")[1].split(":")[1].split()[0])
    assert error < 1e-4
    done = subprocess.run(cli + ["run", str(package), "--shape", "B=30"], capture_output=True, text=True)
    assert done.returncode == 2 and "axis 0 is dim B, whose range is 1..8; got 30" in done.stderr
    done = subprocess.run(cli + ["convert", str(pt), "--input", "BxS:int64:0-50", "--input", "BxS:float32",
                                 "--dim", "B=1:8"], capture_output=True, text=True)
    assert done.returncode == 2 and "'S' is neither a size nor a dim declared with --dim" in done.stderr


class LoopedBlock(torch.nn.Module):
    """Control flow around GPU work: on CUDA the loop body runs as a graph region (deploy/packaging/graph_regions.py), whose
    kernels take the dynamic dims too; its graphs must be specialised to them."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(width, 2 * width), torch.nn.Linear(2 * width, width)

    def forward(self, x: torch.Tensor, steps: int) -> torch.Tensor:
        for _ in range(steps):
            h = torch.nn.functional.gelu(self.up(x)).softmax(-1)
            x = torch.tanh(self.down(h) * 2.0) + x.mean(-1, keepdim=True)
        return x


@pytest.mark.parametrize("backend", BACKENDS)
def test_graph_regions_over_dynamic_dims(backend, tmp_path, cpp_runtime) -> None:
    torch.manual_seed(0)
    model = torch.jit.script(LoopedBlock().eval())
    dims = {"x": {0: Dim("rows", max=64), 1: Dim("cols", max=24)}}
    converted = convert_for(model, (torch.randn(4, 3, 16), 2), backend, dynamic_shapes=dims)
    assert converted.summary()["verification"]["kernels_removed"] == [] and "dim_rows" in converted.code
    if backend == "cuda":
        def kinds(steps):
            for step in steps:
                yield step["kind"]
                for block in step.get("blocks", ()):
                    yield from kinds(block["steps"])
        assert "graph" in set(kinds(converted.manifest["plan"]["steps"])), "no graph region to test"
    path = tmp_path / "looped.j2t"
    converted.save(path)
    module = jit2triton.load(path)
    generator = torch.Generator().manual_seed(FRESH_SEED)
    for rows, cols, steps in [(1, 1, 3), (64, 24, 2), (5, 7, 3), (5, 9, 3), (30, 7, 1)]:
        x = torch.randn(rows, cols, 16, generator=generator)
        expected = model(x.clone(), steps)
        # on CUDA the loop body's region is captured the second time its key is seen, then replayed
        for _ in range(3 if backend == "cuda" else 1):
            actual = module(*to_device((x.clone(), steps), converted.device))
            if backend == "cuda":
                assert_close_on_gpu(to_cpu(actual), expected, f"{rows}x{cols}, {steps} steps")
            else:
                assert_same(actual, expected, f"{rows}x{cols}, {steps} steps")


def test_auto_makes_the_batch_dynamic_where_the_model_allows_it() -> None:
    class PerRow(torch.nn.Module):
        def forward(self, x, scale):
            return torch.tanh(x * scale).sum(-1)

    class BakedBatch(torch.nn.Module):  # the view's size holds the example's batch: it specialises on batch
        def forward(self, x, scale):
            return (x * scale).reshape(12, 5).sum(0)

    example = (torch.randn(3, 4, 5), torch.randn(3, 4, 1))
    generator = torch.Generator().manual_seed(FRESH_SEED)
    per_row = torch.jit.trace(PerRow(), example)
    converted = jit2triton.convert(per_row, example, dynamic_shapes="auto")
    assert converted.signature() == "(x: float32[batch, 4, 5], scale: float32[batch, 4, 1]) -> float32[batch, 4]"
    assert "static_dims" not in converted.summary()
    for batch in (1, 2, 11):
        inputs = (torch.randn(batch, 4, 5, generator=generator), torch.randn(batch, 4, 1, generator=generator))
        assert_same(converted(*copied(inputs)), per_row(*copied(inputs)), f"batch={batch}")

    baked = torch.jit.trace(BakedBatch(), example)
    converted = jit2triton.convert(baked, example, dynamic_shapes="auto")
    assert "batch" not in converted.signature()
    assert "dim batch kept static (dynamic_shapes='auto')" in converted.report()
    assert "specialises" in converted.summary()["static_dims"]["batch"]
    with pytest.raises(InputError):
        converted(torch.randn(2, 4, 5), torch.randn(2, 4, 1))
    with pytest.raises(ConversionError, match="'sometimes' is not known"):
        jit2triton.convert(baked, example, dynamic_shapes="sometimes")


class ShapeOps(torch.nn.Module):
    """Views, slices, selects and iotas whose sizes follow the dynamic dims, as transformers write them."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("positions", torch.randn(64, 8))

    def forward(self, x):
        b, s, h = x.shape
        y = (x + self.positions[:s]).view(b * s, h) * 2.0  # a slice of a static dim to a dynamic length; a view
        steps = torch.arange(s).float()  # by sizes known only at run time
        return y.view(b, s, h).sum(-1) + steps, x.select(1, -1) * 3.0, x[:, 1:].exp()


@pytest.mark.parametrize("backend", ["cpp", BACKENDS[1]])
def test_views_slices_and_iotas_over_dynamic_sizes_become_kernels(backend) -> None:
    example = (torch.randn(2, 5, 8),)
    model = torch.jit.trace(ShapeOps(), example)
    seq = Dim("seq", min=2, max=64)
    converted = convert_for(model, example, backend, dynamic_shapes=[{0: Dim("batch", max=8), 1: seq}])
    assert converted.summary()["verification"]["kernels_removed"] == []
    fallbacks = converted.summary()["fallback_ops"]
    for op in ("aten::view", "aten::slice.Tensor", "aten::select.int", "aten::arange"):
        assert op not in fallbacks, (op, converted.summary()["fallback_reasons"])
    # the sizes they were given at run time are not carried into kernels that never read them
    assert not any(n["op"] == "aten::scalar_tensor" for n in converted.manifest["nodes"])
    generator = torch.Generator().manual_seed(FRESH_SEED)
    for batch, length in [(1, 2), (8, 64), (3, 17), (5, 9)]:
        x = torch.randn(batch, length, 8, generator=generator)
        assert_same(converted(x.clone()), model(x.clone()), f"batch={batch}, seq={length}")
    # a range past the buffer: the slice would run off its dim, and the model cannot add the two; refused at convert
    with pytest.raises(ConversionError, match="does not run at seq=100.*largest seq that ran is 64"):
        jit2triton.convert(model, example, backend="cpp", dynamic_shapes=[{1: Dim("seq", min=2, max=100)}])


class StridedConvThenLinear(torch.nn.Module):
    """wav2vec2's feature encoder in small: a strided conv makes a length that is a floor division of the input's
    (no polynomial: an opaque size), and a GEMM reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(4, 16, 3, stride=2)
        self.fc = torch.nn.Linear(16, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(self.conv(x).transpose(1, 2)))


def test_a_gemm_over_an_opaque_size_converts_and_matches(tmp_path) -> None:
    """GEMM-form and oneDNN timing happen at the example's sizes; an opaque size has none to time at (it was a
    TypeError inside onednn_linear). The GEMM keeps ATen's form and the package serves every length."""
    torch.manual_seed(0)
    model = torch.jit.trace(StridedConvThenLinear().eval(), (torch.randn(2, 4, 40),))
    length = Dim("length", min=8, max=128)
    converted = jit2triton.convert(model, (torch.randn(2, 4, 40),), dynamic_shapes=[{2: length}])
    assert not converted.manifest["report"]["verification"]["notes"]  # no pass failed on the way
    # the conv's length is bound at run time from its output, so the GELU after the GEMM is a kernel
    assert converted.manifest["plan"]["bound_dims"] and "aten::gelu" not in converted.summary()["fallback_ops"]
    converted.save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t")
    generator = torch.Generator().manual_seed(FRESH_SEED)
    for n in (8, 9, 33, 77, 128):
        x = torch.randn(2, 4, n, generator=generator)
        torch.testing.assert_close(loaded(x), model(x))


class StridedConvNet(torch.nn.Module):
    """A small conv net over a dynamic image size: strided convs make floor divisions of H and W (opaque sizes),
    and the activations, a residual, a global pool and a channel sum over them should still be kernels."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.down = torch.nn.Conv2d(8, 8, 3, stride=2)
        self.same = torch.nn.Conv2d(8, 8, 3, padding=1)

    def forward(self, x):
        y = torch.nn.functional.silu(self.stem(x))
        z = self.down(y * 2.0 + 1.0).relu()
        z = z + self.same(z).sigmoid() * z  # the same opaque size on both sides of the residual
        return z.mean((2, 3)), (z.sigmoid() * z).sum(1), y.var(1)


@pytest.mark.parametrize("backend", ["cpp", BACKENDS[1]])
def test_ops_over_opaque_sizes_become_kernels_with_sizes_bound_at_run_time(backend, tmp_path) -> None:
    """#31 item 4: a size no polynomial explains is read at run time from the ATen tensor that has it (the
    strided conv's output) into the call's size table; the ops over it lower into kernels."""
    torch.manual_seed(0)
    example = (torch.randn(2, 3, 32, 32),)
    model = torch.jit.trace(StridedConvNet().eval(), example)
    height, width = Dim("H", min=16, max=64), Dim("W", min=16, max=64)
    converted = convert_for(model, example, backend, dynamic_shapes=[{2: height, 3: width}], choices="fixed")
    assert converted.manifest["plan"].get("bound_dims"), "no size was bound"
    assert converted.summary()["verification"]["kernels_removed"] == []
    fallbacks = converted.summary()["fallback_ops"]
    for op in ("aten::silu", "aten::relu", "aten::sigmoid", "aten::mean.dim", "aten::sum.dim_IntList",
               "aten::var.correction"):
        assert op not in fallbacks, (op, converted.summary()["fallback_reasons"])
    runtimes = [converted]
    if backend == "cpp":  # the C++ runtime binds them too
        converted.save(tmp_path / "m.j2t")
        runtimes.append(jit2triton.load(tmp_path / "m.j2t", runtime="cpp"))
    generator = torch.Generator().manual_seed(FRESH_SEED)
    for h, w in [(16, 16), (33, 47), (64, 63), (17, 40)]:
        x = to_device((torch.randn(2, 3, h, w, generator=generator),), "cuda" if backend == "cuda" else "cpu")
        expected = model(*to_device(x, "cpu"))
        for runtime in runtimes:
            assert_same(to_cpu(runtime(*x)), expected, f"H={h}, W={w}")


class Boxes(torch.nn.Module):
    """LayoutLM's box embeddings in small: widths x1 - x0 index a table, so each box needs x0 <= x1."""

    def __init__(self) -> None:
        super().__init__()
        self.width = torch.nn.Embedding(64, 8)

    def forward(self, ids, boxes):
        return self.width(boxes[..., 2] - boxes[..., 0]) * ids[..., None]


def box_inputs(batch: int, generator: torch.Generator) -> tuple:
    boxes = torch.randint(0, 15, (batch, 5, 4), generator=generator).cumsum(-1)  # x0 <= y0 <= x1 <= y1 < 64
    return torch.randint(1, 9, (batch, 5), generator=generator), boxes


@pytest.mark.parametrize("dynamic_shapes", ["auto", "dim"])
def test_integer_inputs_redrawn_at_other_sizes_keep_their_structure(dynamic_shapes) -> None:
    """Conversion runs the model at other sizes of the dynamic dims; it drew integer inputs uniformly over the
    example's range, which made boxes with x1 < x0 and a negative index: "auto" then fell back to static and a
    declared Dim was refused, blaming the model. Integer inputs are now the example's own values, redrawn along
    the dynamic axes."""
    model = torch.jit.trace(Boxes().eval(), box_inputs(2, torch.Generator().manual_seed(0)))
    batch = Dim("batch", min=1, max=8)
    options = "auto" if dynamic_shapes == "auto" else [{0: batch}, {0: batch}]
    converted = jit2triton.convert(model, box_inputs(2, torch.Generator().manual_seed(0)),
                                   dynamic_shapes=options)
    assert "batch" in converted.signature()
    generator = torch.Generator().manual_seed(FRESH_SEED)
    for n in (1, 3, 8):
        inputs = box_inputs(n, generator)
        torch.testing.assert_close(converted(*inputs), model(*inputs))


class EveryThirtySecond(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x[..., ::32]) * 2  # a size of ceil(H / 32): 1 until H passes 32


def test_a_size_that_grows_past_1_only_late_in_the_range_is_not_taken_for_static() -> None:
    """Shape inference saw every draw give size 1 (draws stay small), fitted a static 1, and the kernels built for it
    disagreed at the range's end, where verification took every one out (EfficientNet with a dynamic image size).
    Conversion now also observes the ranges' largest sizes."""
    model = torch.jit.trace(EveryThirtySecond(), (torch.randn(2, 8),))
    converted = jit2triton.convert(model, (torch.randn(2, 8),), dynamic_shapes=[{1: Dim("h", min=1, max=200)}])
    assert not converted.manifest["report"]["verification"]["kernels_removed"]
    generator = torch.Generator().manual_seed(FRESH_SEED)
    for h in (1, 8, 33, 65, 200):
        x = torch.randn(2, h, generator=generator)
        torch.testing.assert_close(converted(x), model(x))


class UpTo150(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("w", torch.randn(150))

    def forward(self, x):
        return x * 3 + self.w[: x.shape[1]]  # raises past 150


def test_a_range_wider_than_the_model_is_refused_or_narrowed() -> None:
    """A range the model does not run over end to end is refused at convert time, naming the largest size that ran
    (it used to convert with a note and fail at call time); narrow_dims=True narrows it to that size."""
    model = torch.jit.trace(UpTo150(), (torch.randn(2, 8),))
    with pytest.raises(ConversionError, match="Dim h is declared 1..200.*largest h that ran is 150"):
        jit2triton.convert(model, (torch.randn(2, 8),), dynamic_shapes=[{1: Dim("h", min=1, max=200)}])
    converted = jit2triton.convert(model, (torch.randn(2, 8),), dynamic_shapes=[{1: Dim("h", min=1, max=200)}],
                                   narrow_dims=True)
    assert converted.manifest["signature"]["dims"]["h"]["max"] == 150
    generator = torch.Generator().manual_seed(FRESH_SEED)
    for h in (1, 9, 150):
        x = torch.randn(2, h, generator=generator)
        torch.testing.assert_close(converted(x), model(x))
    with pytest.raises(InputError, match="h"):
        converted(torch.randn(2, 151))


class PositionsOfStaticSeq(torch.nn.Module):
    def forward(self, ids):
        positions = torch.arange(ids.size(1))  # the seq dim: static while the batch is dynamic
        return (ids * 2 + positions)[:, : ids.size(1) - 1]


def test_a_static_dim_s_size_folds_while_the_batch_is_dynamic() -> None:
    """`x.size(1)` of a tensor whose batch is dynamic but whose dim 1 is static is a constant: the arange and the
    slice it bounds lower into kernels (with only the batch dynamic they ran through ATen, "computed at run
    time", while a static or fully dynamic conversion lowered them)."""
    model = torch.jit.trace(PositionsOfStaticSeq(), (torch.randint(0, 9, (2, 7)),))
    converted = jit2triton.convert(model, (torch.randint(0, 9, (2, 7)),), dynamic_shapes="auto")
    assert "batch" in converted.signature()
    fallbacks = converted.summary()["fallback_ops"]
    assert "aten::arange" not in fallbacks and "aten::slice.Tensor" not in fallbacks, fallbacks
    for n in (1, 5):
        ids = torch.randint(0, 9, (n, 7), generator=torch.Generator().manual_seed(FRESH_SEED + n))
        torch.testing.assert_close(converted(ids), model(ids))


def test_verification_s_fresh_inputs_keep_integer_structure() -> None:
    """Verification's fresh draw picks integers uniformly over the example's range; where TorchScript refuses that
    (boxes with x1 < x0 index an embedding below 0), it retries with the example's integer rows in a random order
    instead of leaving the draw uncompared, and a note that TorchScript raised names the op's own error."""
    model = torch.jit.trace(Boxes().eval(), box_inputs(4, torch.Generator().manual_seed(0)))
    converted = jit2triton.convert(model, box_inputs(4, torch.Generator().manual_seed(0)))
    verification = converted.manifest["report"]["verification"]
    assert verification["input_sets"] == 2 and not verification["notes"], verification
    from jit2triton.verify import _first_line
    try:
        model(torch.ones(1, 5, dtype=torch.long), torch.full((1, 5, 4), 99))
    except Exception as err:  # noqa: BLE001
        assert "index out of range" in _first_line(err), _first_line(err)


class FilledBySize(torch.nn.Module):
    def forward(self, x, ids):
        z = torch.zeros(x.shape[0], x.shape[1]) + torch.ones(x.shape)
        n = ids.new_ones(ids.shape) * 3 + ids.new_zeros((ids.shape[0], 7)).sum(-1, keepdim=True)
        return z * x + torch.full((x.shape[0], 1), 2.5) + x.new_full(x.shape, 0.5), n


@pytest.mark.parametrize("backend", BACKENDS)
def test_tensors_made_from_a_dynamic_size_list_lower_into_kernels(backend) -> None:
    """zeros/ones/full and their new_* forms take a size list computed at run time over a dynamic batch; the
    output's fitted shape stands for it, so they fuse (they ran through ATen, "computed at run time")."""
    assert_fuses_over_a_dynamic_batch(FilledBySize(), lambda n: (torch.randn(n, 7), torch.randint(0, 9, (n, 7))),
                                      backend)


def assert_fuses_over_a_dynamic_batch(module, make, backend: str) -> None:
    """Converted with "auto" (a dynamic batch), `module` runs with no op through ATen and matches TorchScript at
    batches the conversion did not see."""
    model = torch.jit.trace(module, make(3))
    converted = convert_for(model, make(3), backend, dynamic_shapes="auto")
    assert "batch" in converted.signature() and not converted.summary()["fallback_ops"], converted.report()
    for n in (1, 5):
        args = make(n)
        got = converted(*(to_device(args, "cuda") if backend == "cuda" else args))
        assert_same(to_cpu(got), model(*args))


class SplitStaticDim(torch.nn.Module):
    def forward(self, x):
        a, b = x.split(x.shape[1] // 2, dim=1)
        first, rest = torch.split(x, [1, x.shape[1] - 1], dim=1)
        u, v = x.chunk(2, 1)
        return a * 2 + b + u * v, rest.sum(1) + first[:, 0]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_split_of_a_static_dim_becomes_slices_while_the_batch_is_dynamic(backend) -> None:
    """split/chunk along a static dim of a tensor whose batch is dynamic become one slice per piece, which fuse
    (they ran through ATen when any dim of the input was dynamic)."""
    assert_fuses_over_a_dynamic_batch(SplitStaticDim(), lambda n: (torch.randn(n, 8),), backend)


class ShuffleAndGroupNorm(torch.nn.Module):
    """ShuffleNet's channel shuffle (a view, a transpose, a reshape) and a GroupNorm over a dynamic image: indices
    taken apart by the dynamic width and height and joined again."""

    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.GroupNorm(4, 16)

    def forward(self, x):
        b, c, h, w = x.shape
        shuffled = x.view(b, 4, c // 4, h, w).transpose(1, 2).reshape(b, c, h, w)
        return torch.relu(self.norm(shuffled)) * 2


def test_views_over_a_dynamic_image_read_densely_and_match(tmp_path) -> None:
    """The C++ kernels' innermost loops divide by no dynamic size (the index rules join what a view split: on one
    CPU thread the shuffle alone went from 1.72 to 0.012 ms, TorchScript 0.044, benchmarks/index_rules.py), and the
    package matches TorchScript at sizes across the ranges."""
    torch.manual_seed(0)
    model = torch.jit.trace(ShuffleAndGroupNorm().eval(), (torch.randn(2, 16, 12, 10),))
    dims = ({2: Dim("H", min=2, max=40), 3: Dim("W", min=2, max=40)},)
    converted = jit2triton.convert(model, (torch.randn(2, 16, 12, 10),), backend="cpp", dynamic_shapes=dims)
    loops = [body.split("\n      }")[0] for body in converted.code.split("#pragma omp simd")[1:]]
    assert loops and not [loop for loop in loops if re.search(r"[/%] \(?dim_[HW]", loop)], loops
    converted.save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t")
    for h, w in ((2, 2), (40, 40), (12, 10), (7, 33), (31, 5), (16, 16)):
        x = torch.randn(2, 16, h, w)
        assert_same(loaded(x), model(x), f"{h}x{w}")
