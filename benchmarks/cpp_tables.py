"""The C++ renderer's tables (emitters/cpp.py, `table`): BatchNorm + hardswish on channels-last activations, with
an argmax after it (a discrete output keeps BatchNorm out of folding, so its kernel computes ATen's formula),
converted with tables and without, against TorchScript: one thread, under inference mode, after warm-up, the three
taking turns, median µs per call.

    python benchmarks/cpp_tables.py [--rounds 30]
"""
import argparse
import statistics
import time

import torch

import jit2triton
from jit2triton.emitters import cpp

SHAPES = [(1, 16, 160, 160), (1, 120, 40, 40), (1, 480, 20, 20)]


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
    print("| shape (channels-last) | TorchScript µs | with tables µs | without tables µs | TorchScript / with |")
    print("|---|---|---|---|---|")
    for shape in SHAPES:
        model = torch.jit.script(BatchNormHardswish(shape[1]).eval())
        x = torch.randn(*shape).contiguous(memory_format=torch.channels_last)
        packages = {}
        size = cpp.TABLE_SIZE
        for name, table_size in (("with", size), ("without", 0)):
            cpp.TABLE_SIZE = table_size  # (read when the kernels are rendered)
            packages[name] = jit2triton.convert(model, (x,), backend="cpp")
        cpp.TABLE_SIZE = size
        contenders = {"TorchScript": model, **packages}
        times = {name: [] for name in contenders}
        with torch.inference_mode():
            for run in contenders.values():
                for _ in range(5):
                    run(x)
            for _ in range(args.rounds):
                for name, run in contenders.items():
                    start = time.perf_counter()
                    for _ in range(5):
                        run(x)
                    times[name].append((time.perf_counter() - start) / 5 * 1e6)
        median = {name: statistics.median(t) for name, t in times.items()}
        print(f"| {'x'.join(map(str, shape))} | {median['TorchScript']:.1f} | {median['with']:.1f} | "
              f"{median['without']:.1f} | {median['TorchScript'] / median['with']:.2f}x |")


if __name__ == "__main__":
    main()
