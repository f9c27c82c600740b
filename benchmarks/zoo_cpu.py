"""Every zoo model (tests/models.py) and real architectures on the CPU: torch.jit against a package loaded the
default way (the C++ runtime), in one process, on the same inputs; median of interleaved
calls after warm-up. Prints a table and the geometric means of the speed-ups over torch.jit.

    python benchmarks/zoo_cpu.py [--set zoo|real|all] [--calls 200] [--only PART,PART] [--compile] [--profile N]

`--only` keeps the rows whose names contain one of the comma-separated parts.

`--compile` adds eager and torch.compile columns for the rows whose Python module exists (the real set: the zoo's
models are TorchScript only, as a user holding only a .pt has them, so neither eager nor torch.compile can run them).
`--profile N` then shows where the time goes in the N rows least ahead of torch.jit: each plan step timed, by the
TorchScript source lines it covers (as `jit2triton bench --profile`).

`real`: transformers BERT, GPT-2, ViT and ConvNeXt at mid-size configs with random weights (no downloads; sizes
below), and tests/real_models.py's conv-net, mixer, dense-block and detection-head patterns.
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
import jit2triton  # noqa: E402
from models import MODELS  # noqa: E402


_EAGER: dict[int, torch.nn.Module] = {}  # id(traced) -> the module it was traced from, for --compile


def _zoo():
    for spec in MODELS:
        model, example = spec.build()
        yield spec.name, model, example, spec.fresh_inputs()[0]


def _traced(model, inputs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(model.eval(), inputs, strict=False, check_trace=False)
    _EAGER[id(traced)] = model
    return traced


class _ByName(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model(input_ids=input_ids, attention_mask=attention_mask)


def _transformers_mid():
    """Mid-size transformers models: big enough that kernels, not call overhead, decide."""
    import transformers as t

    def tokens():
        mask = torch.ones(2, 64, dtype=torch.long)
        mask[0, 50:] = 0  # padding in the first sequence
        return torch.randint(0, 1000, (2, 64)), mask

    def image(size):
        return (torch.randn(1, 3, size, size),)

    mid = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, intermediate_size=1024,
               torchscript=True)
    bert = t.BertModel(t.BertConfig(vocab_size=1000, max_position_embeddings=128, **mid))
    yield "transformers BERT 256x4, 2x64", _traced(bert, tokens()), tokens(), tokens()
    gpt2 = t.GPT2LMHeadModel(t.GPT2Config(vocab_size=1000, n_positions=128, n_embd=256, n_layer=4, n_head=4,
                                          torchscript=True, use_cache=False))
    yield "transformers GPT-2 256x4, 2x64", _traced(_ByName(gpt2), tokens()), tokens(), tokens()
    vit = t.ViTModel(t.ViTConfig(image_size=64, patch_size=8, num_channels=3, **mid))
    yield "transformers ViT 256x4, 64px", _traced(vit, image(64)), image(64), image(64)
    convnext = t.ConvNextModel(t.ConvNextConfig(num_channels=3, hidden_sizes=[48, 96, 192, 384],
                                                depths=[2, 2, 4, 2], image_size=128, torchscript=True))
    yield "transformers ConvNeXt 48-384, 128px", _traced(convnext, image(128)), image(128), image(128)


def _real():
    yield from _transformers_mid()
    import real_models
    from real_models import REAL_MODELS, TRANSFORMERS_MODELS
    real_models._trace = lambda model, make_inputs: (_traced(model, make_inputs()), make_inputs)  # keeps the eager
    for name, build in REAL_MODELS.items():
        if name not in TRANSFORMERS_MODELS:  # (those at tiny configs; above at mid-size ones)
            model, draw = build()
            yield name, model, draw(), draw()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--only", default="")
    parser.add_argument("--set", choices=["zoo", "real", "all"], default="zoo")
    parser.add_argument("--compile", action="store_true", help="eager and torch.compile too, where there is a module")
    parser.add_argument("--profile", type=int, default=0, metavar="N", help="profile the N rows least ahead")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    only = set(filter(None, (part.strip() for part in args.only.split(","))))
    folder = tempfile.mkdtemp()
    labels = (["eager", "torch.compile"] if args.compile else []) + ["torch.jit", "default"]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; ms per call, median of {args.calls}")
    print(f"{'model':36s} " + " ".join(f"{label:>13s}" for label in labels) +
          f" {'jit/default':>12s}" + (f" {'compile/default':>16s}" if args.compile else ""))
    ratios = {"default": [], "compile": []}
    profiles = []  # (torch.jit / default, name, package, inputs)
    rows = {"zoo": [_zoo], "real": [_real], "all": [_zoo, _real]}[args.set]
    for name, model, example, call in (row for source in rows for row in source()):
        if only and not any(part in name for part in only):  # a part of a name picks it (names hold commas)
            continue
        torch.manual_seed(0)
        path = os.path.join(folder, f"model{len(ratios['default'])}.j2t")
        jit2triton.convert(model, example_inputs=example).save(path)
        paths = {"torch.jit": model, "default": jit2triton.load(path)}
        eager = _EAGER.get(id(model)) if args.compile else None
        if eager is not None:
            paths = {"eager": eager, "torch.compile": torch.compile(eager), **paths}
        times = {label: [] for label in paths}
        with torch.no_grad():
            for _ in range(10):  # the first torch.compile call compiles
                for fn in paths.values():
                    fn(*call)
            for _ in range(args.calls):
                for label, fn in paths.items():
                    start = time.perf_counter()
                    fn(*call)
                    times[label].append(time.perf_counter() - start)
        ms = {label: statistics.median(t) * 1e3 for label, t in times.items()}
        ratios["default"].append(ms["torch.jit"] / ms["default"])
        profiles.append((ms["torch.jit"] / ms["default"], name, path, call))
        line = f"{name:36s} " + " ".join(f"{ms[label]:13.4f}" if label in ms else f"{'-':>13s}" for label in labels)
        line += f" {ms['torch.jit'] / ms['default']:11.2f}x"
        if "torch.compile" in ms:
            ratios["compile"].append(ms["torch.compile"] / ms["default"])
            line += f" {ms['torch.compile'] / ms['default']:15.2f}x"
        print(line, flush=True)
    names = {"default": "torch.jit / default", "compile": "torch.compile / default"}
    for label, values in ratios.items():
        if values:
            geomean = math.exp(sum(map(math.log, values)) / len(values))
            print(f"geomean {names[label]}: {geomean:.2f}x (min {min(values):.2f}x, {len(values)} models)")
    for ratio, name, path, call in sorted(profiles, key=lambda row: row[0])[:args.profile]:
        print(f"\n{name} ({ratio:.2f}x torch.jit): time per plan step over {args.calls} calls")
        for line in _profile(path, call, args.calls):
            print(line)


def _profile(path: str, inputs: tuple, calls: int) -> list[str]:
    from jit2triton.bench import _Row, format_profile, profile_rows
    module = jit2triton.load(path)
    with torch.no_grad():
        module(*inputs)  # a warm call outside the profile
        module._runtime.set_profiling(True)
        for _ in range(calls):
            module(*inputs)
    steps = [_Row(node, seconds, runs) for node, seconds, runs in module._runtime.step_times()]
    return format_profile(profile_rows(steps, module.manifest["nodes"], module.manifest["kernels"], calls))


if __name__ == "__main__":
    main()
