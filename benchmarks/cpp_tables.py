"""The C++ renderer's per-row work: BatchNorm + hardswish with an argmax after it (a discrete output keeps BatchNorm
out of folding, so its kernel computes ATen's formula), against TorchScript: on channels-last activations with the
renderer's tables (emitters/cpp.py, `table`) and without, and on NCHW ones with its short sweeps (SHORT_SWEEP: the
last two dims swept in each row where the last is short) and without. One thread, under inference mode, after
warm-up, the three taking turns, median µs per call.

    python benchmarks/cpp_tables.py [--rounds 30]
"""
import argparse
import statistics
import time

import torch

import jit2triton
from jit2triton.emitters import cpp

SHAPES = [(1, 16, 160, 160), (1, 120, 40, 40), (1, 480, 20, 20)]
# per layout: the renderer's knob, its value that turns it off, and what the table calls it
KNOBS = {"channels-last": ("TABLE_SIZE", 0, "tables"), "NCHW": ("SHORT_SWEEP", 0, "short sweeps")}


class BatchNormHardswish(torch.nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(channels)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)
            self.bn.weight.uniform_(0.5, 2)

    def forward(self, x):
        y = torch.nn.functional.hardswish(self.bn(x))
        return y, y.amax(1).flatten(1).argmax(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    for layout, (knob, off, what) in KNOBS.items():
        print(f"\n| shape ({layout}) | TorchScript µs | with {what} µs | without {what} µs | TorchScript / with |")
        print("|---|---|---|---|---|")
        for shape in SHAPES:
            print(_row(shape, layout, knob, off, args.rounds))


def _row(shape: tuple, layout: str, knob: str, off: int, rounds: int) -> str:
    model = torch.jit.script(BatchNormHardswish(shape[1]).eval())
    x = torch.randn(*shape)
    if layout == "channels-last":
        x = x.contiguous(memory_format=torch.channels_last)
    packages = {}
    on = getattr(cpp, knob)
    for name, value in (("with", on), ("without", off)):
        setattr(cpp, knob, value)  # (read when the kernels are rendered)
        try:
            packages[name] = jit2triton.convert(model, (x,), backend="cpp")
        finally:
            setattr(cpp, knob, on)
    contenders = {"TorchScript": model, **packages}
    times = {name: [] for name in contenders}
    with torch.inference_mode():
        for run in contenders.values():
            for _ in range(5):
                run(x)
        for _ in range(rounds):
            for name, run in contenders.items():
                start = time.perf_counter()
                for _ in range(5):
                    run(x)
                times[name].append((time.perf_counter() - start) / 5 * 1e6)
    median = {name: statistics.median(t) for name, t in times.items()}
    return (f"| {'x'.join(map(str, shape))} | {median['TorchScript']:.1f} | {median['with']:.1f} | "
            f"{median['without']:.1f} | {median['TorchScript'] / median['with']:.2f}x |")


if __name__ == "__main__":
    main()
