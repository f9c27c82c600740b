"""`jit2triton bench` compares inference with inference: TorchScript runs under torch.inference_mode() after its
profiling executor has optimised, interleaved with the package; --threads holds for torch too; the JSON carries
every call's time and the facts of the machine."""
import json

import pytest
import torch
from click.testing import CliRunner

from jit2triton.cli import main

from helpers import on_gpu


@pytest.fixture(scope="module")
def conv(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bench")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4), torch.nn.ReLU()).eval()
    path = folder / "conv.pt"
    torch.jit.save(torch.jit.trace(model, torch.randn(2, 3, 8, 8)), path)
    package = folder / "conv.j2t"
    done = CliRunner().invoke(main, ["convert", str(path), "-o", str(package), "--input", "2x3x8x8", "--quiet"])
    assert done.exit_code == 0, done.output
    return folder


class _Recorder:
    """Stands in for the TorchScript model bench loads: notes the grad mode and threads of every call."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def eval(self):
        return self

    def __call__(self, *inputs):
        self.calls.append({"grad": torch.is_grad_enabled(), "inference": torch.is_inference_mode_enabled(),
                           "threads": torch.get_num_threads(), "inputs": inputs})
        return self.model(*inputs)


@pytest.fixture
def recorded(monkeypatch):
    load = torch.jit.load
    seen = []

    def recording_load(*args, **kwargs):
        seen.append(_Recorder(load(*args, **kwargs)))
        return seen[-1]
    monkeypatch.setattr(torch.jit, "load", recording_load)
    return seen


def test_torchscript_is_timed_in_inference_mode_after_its_warm_up_with_the_threads_asked(conv, recorded):
    threads = torch.get_num_threads()
    out = conv / "bench.json"
    result = CliRunner().invoke(main, ["bench", str(conv / "conv.j2t"), "--against", str(conv / "conv.pt"),
                                       "--warmup-ms", "0", "--iterations", "4", "--threads", "1",
                                       "--json", str(out)])
    assert result.exit_code == 0, result.output
    calls = recorded[0].calls
    assert calls and not any(c["grad"] for c in calls), "TorchScript ran with autograd on"
    assert all(c["inference"] for c in calls) and all(c["threads"] == 1 for c in calls)
    assert len(calls) == 1 + 3 + 4  # the inputs' check, the warm-up (the profiling executor's two and one more), 4
    assert torch.get_num_threads() == threads  # restored
    # (the first bench of a fresh machine builds the C++ runtime first, and says so on stderr)
    header = next(line for line in result.output.splitlines() if not line.startswith("jit2triton: building"))
    assert "1 thread," in header and "torch.inference_mode()" in header and "CUDA graphs" not in header
    data = json.loads(out.read_text())
    assert data["mode"] == "torch.inference_mode()" and data["threads"] == 1 and data["cuda_graphs"] is None
    assert data["versions"]["torch"] == torch.__version__ and data["device_name"]
    assert [len(data["times_ms"][label]) for label in ("jit2triton", "torch.jit")] == [4, 4]
    assert data["stats"]["torch.jit"]["min_ms"] == min(data["times_ms"]["torch.jit"])


def test_bench_times_the_inputs_given_in_a_file(conv, recorded):
    inputs = (torch.randn(2, 3, 8, 8),)
    torch.save(inputs, conv / "inputs.pt")
    out = conv / "given.json"
    result = CliRunner().invoke(main, ["bench", str(conv / "conv.j2t"), "--against", str(conv / "conv.pt"),
                                       "--inputs-file", str(conv / "inputs.pt"), "--iterations", "2",
                                       "--warmup-ms", "0", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert all(torch.equal(c["inputs"][0], inputs[0]) for c in recorded[0].calls)
    assert json.loads(out.read_text())["inputs"] == "given (--inputs-file)"


def _profiled(conv, flag: str):
    """`bench` of the conv package for 3 calls with `flag` (--profile or --host-profile): (its output, its JSON)."""
    out = conv / f"{flag.strip('-')}.json"
    result = CliRunner().invoke(main, ["bench", str(conv / "conv.j2t"), "--iterations", "3", "--warmup-ms", "0",
                                       flag, "--json", str(out)])
    assert result.exit_code == 0, result.output
    return result.output, json.loads(out.read_text())


def test_the_profile_times_the_runtime_the_statistics_came_from(conv, cpp_runtime):
    output, data = _profiled(conv, "--profile")
    assert data["runtime"] == data["profile_runtime"] == "cpp"
    line = next(line for line in output.splitlines() if line.startswith("profile:"))
    assert "the cpp runtime, 5 calls" in line
    rows = data["profile"]
    assert rows and all(r["what"] != "?" and r["nodes"] for r in rows), rows  # each row names manifest nodes
    assert abs(sum(r["share"] for r in rows) - 1) < 1e-6 and all(r["steps_per_call"] >= 1 for r in rows)
    assert 0 < sum(r["ms_per_call"] for r in rows) <= data["profiled_call_ms"]


def test_the_host_profile_names_itself_and_times_every_step(conv, cpp_runtime):
    output, data = _profiled(conv, "--host-profile")
    assert data["host_profile"] is True and data["profile"], data
    assert any(line.startswith("host profile: the cpp runtime, 5 calls") for line in output.splitlines())


@on_gpu
def test_the_host_profile_does_not_wait_for_the_gpu(tmp_path):
    """A kernel over 64M floats takes the GPU about 100 us; issuing it takes the host a few: the synchronised
    profile charges the first, the host profile the second."""
    import jit2triton

    class SinCos(torch.nn.Module):
        def forward(self, t):
            return torch.sin(t) ** 2 + torch.cos(t) ** 2

    x = torch.randn(1 << 26, device="cuda")
    traced = torch.jit.trace(SinCos(), (x,))
    jit2triton.convert(traced, (x,), device="cuda").save(tmp_path / "m.j2t")
    loaded = jit2triton.load(tmp_path / "m.j2t", cuda_graphs=False)
    per_step = {}
    for host_only in (False, True):
        loaded(x)
        loaded._runtime.set_profiling(True, host_only=host_only)
        for _ in range(20):
            loaded(x)
        torch.cuda.synchronize()
        per_step[host_only] = max(seconds / runs for _, seconds, runs in loaded._runtime.step_times())
        loaded._runtime.set_profiling(False)
    assert per_step[True] < per_step[False] / 3, per_step
