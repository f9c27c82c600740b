"""jit2triton against the CPU tools a deployment engineer would pick instead (issue #37): torch.jit, ONNX Runtime
(the same traced .pt exported with torch.onnx.export, where it exports), torch.compile with freezing=True
(Inductor's CPU path with prepacked weights) and jit2triton, in one process, taking turns call by call, each in
inference mode with the same number of threads. Prints median ms per call and each peer's time over jit2triton's.

    python benchmarks/cpu_peers.py [--threads 2] [--calls 100] [--rounds 3] [--burst 1] [--only PART,PART]
                                   [--json FILE] [--omp-wait-policy passive|active]

Models: transformers BERT-base, DistilBERT, ViT (4 layers), GPT-2, ResNetModel and ConvNeXt at their default
configs with random weights (no downloads), and benchmarks/workloads.py's edge conv net (conv-BN, depthwise,
squeeze-excite) at 2x3x64x64. A peer that fails on a model (an export ORT cannot run, a graph Inductor cannot
compile) gets a `-` and the reason below the table; the others still run. Needs the `bench` extra
(onnxruntime, onnx, onnxscript).

OpenMP's wait policy matters on a shared machine. torch.jit, torch.compile and jit2triton run their parallel loops
on OpenMP (libgomp), whose threads spin at each loop's end waiting for the others; with more runnable threads
than cores, a spinning thread takes the core its partner needs, and a 2-thread call can take several times a
1-thread one (DistilBERT 2x32 on this project's 2-core machine at load average 6: 380-570 ms a call at 2 threads,
87-104 with OMP_WAIT_POLICY=passive, 88-95 at 1 thread). ONNX Runtime's own pool is not OpenMP and does not
suffer so. --omp-wait-policy sets OMP_WAIT_POLICY for this process (libgomp reads it when it loads, so the
script starts itself again with it set); the load average is printed before and after.

The peers take their turns in a new random order each time: a peer that always runs right after another runs in
the caches and the OpenMP threads that one left, and on a millisecond model that alone moved a package's median by
40% (see `_time`). By default each turn is one call, so every call finds caches another peer filled; `--burst N`
makes each turn N calls back to back, as a model serving requests back to back runs.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import statistics
import sys
import tempfile
import time
import warnings
from typing import Callable, Iterator

import torch

sys.path.insert(0, os.path.dirname(__file__))
import jit2triton  # noqa: E402
from workloads import edge_convnet  # noqa: E402

PEERS = ("torch.jit", "ONNX Runtime", "torch.compile freezing", "jit2triton")


class _Positional(torch.nn.Module):
    """A transformers model called with positional inputs, returning its first output (the last hidden state)."""

    def __init__(self, model: torch.nn.Module, names: tuple[str, ...]) -> None:
        super().__init__()
        self.model, self.names = model, names

    def forward(self, *inputs):
        return self.model(**dict(zip(self.names, inputs)), return_dict=False)[0]


def _models() -> Iterator[tuple[str, torch.nn.Module, tuple]]:
    """(name, eager module in eval mode, inputs) for every row."""
    import transformers as t

    def tokens(batch: int, seq: int, vocab: int) -> tuple:
        return torch.randint(0, vocab, (batch, seq)), torch.ones(batch, seq, dtype=torch.long)

    yield "edge conv-BN/depthwise/SE net, 2x64^2", edge_convnet(), (torch.randn(2, 3, 64, 64),)
    yield "ResNet (ResNetModel), 2x128^2", _Positional(t.ResNetModel(t.ResNetConfig()), ("pixel_values",)), \
        (torch.randn(2, 3, 128, 128),)
    yield "ConvNeXt, 2x128^2", _Positional(t.ConvNextModel(t.ConvNextConfig()), ("pixel_values",)), \
        (torch.randn(2, 3, 128, 128),)
    text = ("input_ids", "attention_mask")
    yield "BERT-base, 2x32", _Positional(t.BertModel(t.BertConfig()), text), tokens(2, 32, 30522)
    yield "DistilBERT, 2x32", _Positional(t.DistilBertModel(t.DistilBertConfig()), text), tokens(2, 32, 30522)
    vit = t.ViTModel(t.ViTConfig(num_hidden_layers=4))
    yield "ViT (4 layers), 1x224^2", _Positional(vit, ("pixel_values",)), (torch.randn(1, 3, 224, 224),)
    gpt2 = t.GPT2Model(t.GPT2Config(use_cache=False))
    yield "GPT-2, 1x40", _Positional(gpt2, ("input_ids",)), (torch.randint(0, 50257, (1, 40)),)


def _torch_jit(traced: torch.jit.ScriptModule, inputs: tuple) -> Callable[[], object]:
    return lambda: traced(*inputs)


def _onnx_runtime(traced: torch.jit.ScriptModule, inputs: tuple, threads: int, folder: str) -> Callable[[], object]:
    import onnxruntime as ort
    path = os.path.join(folder, "model.onnx")
    with warnings.catch_warnings(), torch.no_grad(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")  # (and a failed export's whole TorchScript graph, printed to stderr)
        torch.onnx.export(traced, inputs, path, dynamo=False)  # a ScriptModule: the TorchScript exporter
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    feed = {i.name: x.numpy() for i, x in zip(session.get_inputs(), inputs)}
    return lambda: session.run(None, feed)


def _torch_compile(eager: torch.nn.Module, inputs: tuple) -> Callable[[], object]:
    import torch._inductor.config as inductor
    inductor.freezing = True
    compiled = torch.compile(eager)
    with torch.inference_mode():
        compiled(*inputs)  # compiles here, so a failure is this peer's, before timing
    return lambda: compiled(*inputs)


def _jit2triton(traced: torch.jit.ScriptModule, inputs: tuple, folder: str) -> Callable[[], object]:
    path = os.path.join(folder, "model.j2t")
    jit2triton.convert(traced, inputs).save(path)
    loaded = jit2triton.load(path)
    return lambda: loaded(*inputs)


def _peers(eager, inputs, threads: int, folder: str) -> tuple[dict[str, Callable], dict[str, str]]:
    """Each peer's call on `inputs`, and why each peer that could not run does not."""
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(eager, inputs, strict=False, check_trace=False)
    buffer = io.BytesIO()  # every peer starts from the same saved .pt, as a user holding one would
    torch.jit.save(traced, buffer)
    buffer.seek(0)
    traced = torch.jit.load(buffer)
    makers = {"torch.jit": lambda: _torch_jit(traced, inputs),
              "ONNX Runtime": lambda: _onnx_runtime(traced, inputs, threads, folder),
              "torch.compile freezing": lambda: _torch_compile(eager, inputs),
              "jit2triton": lambda: _jit2triton(traced, inputs, folder)}
    calls, failed = {}, {}
    for peer, make in makers.items():
        try:
            calls[peer] = make()
        except Exception as err:  # noqa: BLE001 - a peer that cannot run this model is reported, not fatal
            failed[peer] = f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"
    return calls, failed


def _time(calls: dict[str, Callable], count: int, rounds: int, burst: int = 1) -> dict[str, float]:
    """Median ms per call of each peer: `rounds` rounds, each of `count` calls per peer taken in turns, `burst`
    calls a turn (each sample their mean), in a new random order each turn: a peer that always ran right after
    another ran in the caches and OpenMP threads that one left (two copies of one edge-net package, 1.65 against
    2.36 ms at 2 threads, when the order only rotated and so one always followed the other)."""
    labels = list(calls)
    samples: dict[str, list[float]] = {label: [] for label in labels}
    with torch.inference_mode():
        for _ in range(5):
            for call in calls.values():
                call()
        shuffled = random.Random(0)
        for _ in range(rounds * max(1, count // burst)):
            shuffled.shuffle(labels)
            for label in labels:
                start = time.perf_counter()
                for _ in range(burst):
                    calls[label]()
                samples[label].append((time.perf_counter() - start) / burst)
    return {label: statistics.median(t) * 1e3 for label, t in samples.items()}


def _load() -> str:
    return " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists("/proc/loadavg") else "?"


def _with_wait_policy(policy: str) -> None:
    """Start this script again with OMP_WAIT_POLICY=`policy`, unless it already runs with it."""
    if policy and os.environ.get("OMP_WAIT_POLICY", "").lower() != policy:
        os.environ["OMP_WAIT_POLICY"] = policy
        os.execv(sys.executable, [sys.executable, *sys.argv])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=100, help="calls per peer per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burst", type=int, default=1,
                        help="calls a peer makes each turn: 1 (the default) leaves each call the caches the other "
                             "peers left; more, as a model serving calls back to back finds them (see below)")
    parser.add_argument("--only", default="", help="keep rows whose names contain one of these comma-separated parts")
    parser.add_argument("--json", default="", help="also write the table here")
    parser.add_argument("--omp-wait-policy", choices=("passive", "active"), default="",
                        help="OpenMP threads sleep (passive) or spin (active) while waiting; default: libgomp's own")
    args = parser.parse_args()
    _with_wait_policy(args.omp_wait_policy)
    torch.set_num_threads(args.threads)
    os.environ.setdefault("OMP_NUM_THREADS", str(args.threads))
    only = [part.strip() for part in args.only.split(",") if part.strip()]
    folder = tempfile.mkdtemp()
    policy = os.environ.get("OMP_WAIT_POLICY", "libgomp's default")
    load_before = _load()
    print(f"torch {torch.__version__}, {args.threads} threads each, OMP_WAIT_POLICY {policy}; median ms per call "
          f"of {args.rounds} rounds x {args.calls} calls, taken in turns of {args.burst}; load average {load_before}")
    print(f"{'model':40s}" + "".join(f"{p:>24s}" for p in PEERS) + f"{'best peer / jit2triton':>24s}")
    table, notes = [], []
    for name, eager, inputs in _models():
        if only and not any(part in name for part in only):
            continue
        torch.manual_seed(0)
        calls, failed = _peers(eager.eval(), inputs, args.threads, folder)
        ms = _time(calls, args.calls, args.rounds, args.burst)
        ahead = min((v for p, v in ms.items() if p != "jit2triton"), default=None)
        line = f"{name:40s}" + "".join(f"{ms[p]:24.3f}" if p in ms else f"{'-':>24s}" for p in PEERS)
        line += f"{ahead / ms['jit2triton']:23.2f}x" if ahead and "jit2triton" in ms else f"{'-':>24s}"
        print(line, flush=True)
        notes += [f"{name}: {peer} did not run ({why})" for peer, why in failed.items()]
        table.append({"model": name, "ms": ms, "failed": failed})
    for note in notes:
        print(note)
    load_after = _load()
    print(f"load average after: {load_after}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "burst": args.burst, "torch": torch.__version__,
                       "omp_wait_policy": policy, "load_average": [load_before, load_after], "rows": table},
                      f, indent=1)


if __name__ == "__main__":
    main()
