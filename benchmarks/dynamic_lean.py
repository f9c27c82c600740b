"""Dynamic shapes on the GPU (issue #31), measured as the issue measured them: BERT-base fp32 (transformers, random
weights) converted with dynamic dims B in 1..64 and S in 8..512, once at each `--convert-at` size, timed at every
`--sizes` size against a static package converted at that size, TorchScript and
`torch.compile(mode="reduce-overhead", dynamic=True)`; wall microseconds per call, back to back after warm-up, all
under torch.inference_mode() in one process. Then a conv net with a dynamic image size, whose sizes after the first
strided conv are bound at run time: its fallback ops and its speed against TorchScript.

    python benchmarks/dynamic_lean.py [--convert-at 1,16 --convert-at 8,128] [--sizes 1,16 8,128 ...] [--no-compile]

Every path's output is checked against TorchScript before it is timed. JSON to --json (default $OUT/dyn_lean.json
where $OUT is set), rewritten after every row so a run cut short keeps what it measured.
"""
import argparse
import json
import os
import tempfile
import time

import torch

import jit2triton

DEFAULT_SIZES = ["1,16", "8,128", "4,77", "32,256", "2,512"]


def wall_us(fn, calls: int = 100) -> float:
    """Microseconds per call, back to back (what a serving loop pays), after warm-up."""
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class Bert(torch.nn.Module):
    """transformers' BertModel with positional (ids, mask) inputs and tuple outputs, as a traced .pt has them."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig, BertModel
        self.m = BertModel(BertConfig(attn_implementation="eager"))

    def forward(self, ids, mask):
        return self.m(ids, attention_mask=mask, return_dict=False)


def bert_inputs(batch: int, seq: int):
    ids = torch.randint(0, 30522, (batch, seq), device="cuda")
    mask = torch.ones(batch, seq, dtype=torch.int64, device="cuda")
    mask[:, seq - seq // 4:] = 0  # padded tails, as a batch of unequal sentences has
    return ids, mask


def saved_and_loaded(package, folder: str, name: str):
    path = os.path.join(folder, f"{name}.j2t")
    package.save(path)
    return jit2triton.load(path)


def bert_rows(convert_at: list, sizes: list, compile_too: bool, record) -> None:
    torch.manual_seed(0)
    model = Bert().cuda().eval()
    with torch.no_grad():
        traced = torch.jit.trace(model, bert_inputs(1, 16), strict=False)
    dims = [jit2triton.Dim("b", min=1, max=64), jit2triton.Dim("s", min=8, max=512)]
    spec = [{0: dims[0], 1: dims[1]}] * 2
    with tempfile.TemporaryDirectory() as folder:
        dynamic = {}
        for at in convert_at:
            started = time.perf_counter()
            package = jit2triton.convert(traced, bert_inputs(*at), device="cuda", dynamic_shapes=spec)
            record("bert_convert_s", f"{at}", round(time.perf_counter() - started, 1))
            dynamic[f"dynamic@{at[0]}x{at[1]}"] = saved_and_loaded(package, folder, f"dyn{at[0]}x{at[1]}")
        compiled = torch.compile(model, dynamic=True, mode="reduce-overhead") if compile_too else None
        with torch.inference_mode():
            for size in sizes:
                inputs = bert_inputs(*size)
                static = saved_and_loaded(jit2triton.convert(traced, inputs, device="cuda"), folder, "static")
                paths = {**dynamic, "static": static, "torchscript": traced}
                if compiled is not None:
                    paths["reduce-overhead(dynamic)"] = compiled
                expected = first(traced(*inputs))
                row = {}
                for label, fn in paths.items():
                    try:
                        err = (first(fn(*inputs)) - expected).abs().max().item()
                        row[label] = {"us": round(wall_us(lambda: fn(*inputs)), 1), "max_err": err}
                    except Exception as e:  # one failing path must not hide the others' numbers
                        row[label] = {"error": repr(e)[:300]}
                record("bert", f"{size[0]}x{size[1]}", row)


def convnet_rows(record) -> None:
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Conv2d(3, 32, 3, stride=2, padding=1)
            self.b = torch.nn.Conv2d(32, 32, 3, stride=2, padding=1, groups=32)
            self.c = torch.nn.Conv2d(32, 64, 1)

        def forward(self, x):
            y = torch.nn.functional.silu(self.a(x))
            z = torch.nn.functional.silu(self.b(y))
            z = z * torch.sigmoid(z.mean((2, 3), keepdim=True))
            return self.c(z).relu().mean((2, 3))

    net = Net().cuda().eval()
    example = torch.randn(2, 3, 96, 96, device="cuda")
    traced = torch.jit.trace(net, example)
    dims = {2: jit2triton.Dim("H", 64, 256), 3: jit2triton.Dim("W", 64, 256)}
    package = jit2triton.convert(traced, (example,), device="cuda", dynamic_shapes=[dims])
    record("convnet", "fallback_ops", package.summary()["fallback_ops"])
    with tempfile.TemporaryDirectory() as folder, torch.inference_mode():
        loaded = saved_and_loaded(package, folder, "convnet")
        for hw in [(96, 96), (131, 200), (256, 255)]:
            x = torch.randn(2, 3, *hw, device="cuda")
            record("convnet", f"{hw[0]}x{hw[1]}", {"max_err": (loaded(x) - traced(x)).abs().max().item(),
                                                    "package_us": round(wall_us(lambda: loaded(x)), 1),
                                                    "torchscript_us": round(wall_us(lambda: traced(x)), 1)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--convert-at", action="append", help="B,S of a dynamic conversion (repeatable)")
    parser.add_argument("--sizes", nargs="+", default=DEFAULT_SIZES, help="B,S sizes to time")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile reduce-overhead(dynamic)")
    parser.add_argument("--skip-convnet", action="store_true")
    parser.add_argument("--json", default=os.path.join(os.environ.get("OUT", "."), "dyn_lean.json"))
    args = parser.parse_args()
    pair = lambda text: tuple(int(v) for v in text.split(","))  # noqa: E731
    results: dict = {}

    def record(section: str, key: str, value) -> None:
        results.setdefault(section, {})[key] = value
        print(section, key, json.dumps(value, default=str), flush=True)
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=str)

    for section, run in [("bert", lambda: bert_rows([pair(a) for a in args.convert_at or ["1,16"]],
                                                    [pair(s) for s in args.sizes], not args.no_compile, record)),
                         ("convnet", None if args.skip_convnet else lambda: convnet_rows(record))]:
        if run is None:
            continue
        try:
            run()
        except Exception as e:
            record(section, "error", repr(e)[:500])


if __name__ == "__main__":
    main()
