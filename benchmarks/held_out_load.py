"""Held-out transformers models on this CPU, quiet and loaded (issue #36): a package (the C++ runtime) against
torch.jit (traced, frozen), both in inference mode, 2 threads, in interleaved rounds, median ms per call; first on
the machine as it is, then with a busy process on each core competing. Random weights (no downloads).

    python benchmarks/held_out_load.py
"""
from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time

import torch

import jit2triton


def busy(stop) -> None:
    """A competing process: spins until told to stop."""
    count = 0
    while not stop.is_set():
        count += 1


class Positional(torch.nn.Module):
    """A transformers model called as a deployed one is: positional tensors in, a tuple out."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs):
        return self.model(*inputs, return_dict=False)


def models():
    import transformers as t
    torch.manual_seed(0)
    ids, mask = torch.randint(0, 1000, (2, 32)), torch.ones(2, 32, dtype=torch.int64)
    yield "BERT-base 2x32", t.BertModel(t.BertConfig(attn_implementation="eager")), (ids, mask)
    yield "DistilBERT 2x32", t.DistilBertModel(t.DistilBertConfig(attn_implementation="eager")), (ids, mask)
    yield ("ViT 4 layers 1x224", t.ViTModel(t.ViTConfig(num_hidden_layers=4, attn_implementation="eager")),
           (torch.randn(1, 3, 224, 224),))


def timed(paths: dict, example: tuple, rounds: int = 7, calls: int = 10) -> dict[str, float]:
    times: dict[str, list[float]] = {name: [] for name in paths}
    with torch.inference_mode():
        for run in paths.values():
            for _ in range(3):
                run(*example)
        for _ in range(rounds):
            for name, run in paths.items():
                started = time.perf_counter()
                for _ in range(calls):
                    run(*example)
                times[name].append((time.perf_counter() - started) / calls * 1e3)
    return {name: statistics.median(t) for name, t in times.items()}


def loaded(paths: dict, example: tuple) -> dict[str, float]:
    stop = multiprocessing.Event()
    competitors = [multiprocessing.Process(target=busy, args=(stop,)) for _ in range(2)]
    for process in competitors:
        process.start()
    try:
        return timed(paths, example)
    finally:
        stop.set()
        for process in competitors:
            process.join()


def main() -> None:
    torch.set_num_threads(2)
    print("| model | torch.jit quiet | jit2triton quiet | ratio | torch.jit loaded | jit2triton loaded | ratio |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name, model, example in models():
            with torch.no_grad():
                reference = torch.jit.freeze(torch.jit.trace(Positional(model.eval()), example, strict=False).eval())
            path = os.path.join(folder, "model.j2t")
            jit2triton.convert(reference, example).save(path)
            paths = {"torch.jit": reference, "jit2triton": jit2triton.load(path)}
            quiet, busy_ = timed(paths, example), loaded(paths, example)
            print(f"| {name} | {quiet['torch.jit']:.1f} | {quiet['jit2triton']:.1f} | "
                  f"{quiet['torch.jit'] / quiet['jit2triton']:.2f}x | {busy_['torch.jit']:.1f} | "
                  f"{busy_['jit2triton']:.1f} | {busy_['torch.jit'] / busy_['jit2triton']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
