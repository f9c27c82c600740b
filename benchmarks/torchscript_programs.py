"""The programs a user holds only as a TorchScript `.pt` (issue 46): scripted torchvision detectors (random weights,
eval), torch_geometric GCN / GAT / GraphSAGE (traced, on a random graph), torchaudio front ends (Spectrogram and
MelSpectrogram, scripted) and a separator (HDemucs, traced), and the host-step programs of
benchmarks/host_programs.py (beam search, KV-cache decode, NMS post-process, list loops), against TorchScript and,
where it runs, torch.compile of the eager module.

Per program: converted once (seconds; generated-kernel, ATen-fallback and vendor-library node counts from the
package's summary()); the package as load() gives it (the C++ runtime) checked against TorchScript on one fresh
random input (largest error relative to each output's magnitude; for detection, boxes, scores and labels, a
different box count being an infinite error); then every contender timed in turns in one process under
torch.inference_mode(): each round, each contender (its reset method first, for a stateful program) makes `--calls`
calls, each timed alone by wall clock (on CUDA synchronised before and after); the first rounds warm up (TorchScript's
profiling executor optimises on the 2nd call, torch.compile compiles on the 1st, reduce-overhead records CUDA graphs);
the median per contender is reported. A program whose library is not installed is listed as skipped; one whose
conversion or compile fails shows its error in the table, and the run goes on.

    python benchmarks/torchscript_programs.py [--device cpu|cuda] [--programs nms,beam_search,...] [--rounds 20]
                                              [--calls 5] [--json out.json] [--quick] [--no-compile] [--threads N]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Callable, NamedTuple, Optional

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests"))
import jit2triton  # noqa: E402
from jit2triton.verify import exact_float32  # noqa: E402
from gpu_torchscript_programs import images, spread_scores, worst_error  # noqa: E402
from host_programs import HOST_PROGRAMS, Program  # noqa: E402

DIFFERS = 1e-3  # a relative error above this marks the package's answer as different from TorchScript's


# --- torchvision detection, scripted -------------------------------------------------------------------------------

DETECTORS = {  # short name: (torchvision constructor, its options: thresholds low enough that random weights keep boxes)
    "ssd300_vgg16": ("ssd300_vgg16", {}),
    "ssdlite": ("ssdlite320_mobilenet_v3_large", {}),
    "fasterrcnn_mobilenet": ("fasterrcnn_mobilenet_v3_large_320_fpn", {"box_score_thresh": 0.0}),
    "fcos": ("fcos_resnet50_fpn", {"score_thresh": 0.05}),
    "maskrcnn_v2": ("maskrcnn_resnet50_fpn_v2", {"box_score_thresh": 0.0}),
}


def detector(short: str) -> Callable[[str, bool], Program]:
    def build(device: str, quick: bool) -> Program:
        import torchvision
        name, options = DETECTORS[short]
        torch.manual_seed(0)
        eager = torchvision.models.get_model(name, weights=None, weights_backbone=None, **options)
        # random heads score every box alike, and near-ties come out in either order: spread the classifiers
        # (Mask R-CNN's box regressors too spread collapse every box, so only its classifier)
        spread_scores(eager, only=("cls",) if short == "maskrcnn_v2" else ())
        eager = eager.eval().to(device)
        size = 224 if quick else 320
        example = (images(0, device, size),)
        return Program(torch.jit.script(eager), example, example, eager=eager,
                       fresh=lambda: (images(1, device, size),))
    return build


# --- torch_geometric graph networks, traced on a random graph ------------------------------------------------------

def graph_network(kind: str) -> Callable[[str, bool], Program]:
    def build(device: str, quick: bool) -> Program:
        from torch_geometric.nn import GATConv, GCNConv, SAGEConv
        nodes, edges, features, classes = (64, 256, 16, 4) if quick else (2708, 10556, 128, 16)
        first, second = {
            "gcn": (lambda: GCNConv(features, 64), lambda: GCNConv(64, classes)),
            "gat": (lambda: GATConv(features, 8, heads=8), lambda: GATConv(64, classes, heads=1)),
            "graphsage": (lambda: SAGEConv(features, 64), lambda: SAGEConv(64, classes)),
        }[kind]

        class GraphNetwork(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.conv1, self.conv2 = first(), second()

            def forward(self, x: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
                x = torch.nn.functional.elu(self.conv1(x, edge_index))
                return torch.log_softmax(self.conv2(x, edge_index), -1)

        def graph(seed: int) -> tuple:
            g = torch.Generator().manual_seed(seed)
            return (torch.randn(nodes, features, generator=g).to(device),
                    torch.randint(0, nodes, (2, edges), generator=g).to(device))
        torch.manual_seed(0)
        eager = GraphNetwork().eval().to(device)
        example = graph(0)
        with torch.no_grad():  # (no trace check: scatter-add on CUDA sums in any order)
            traced = torch.jit.trace(eager, example, check_trace=False)
        return Program(traced, example, example, eager=eager, fresh=lambda: graph(1))
    return build


# --- torchaudio front ends and a separator, scripted ---------------------------------------------------------------

def audio(kind: str) -> Callable[[str, bool], Program]:
    def build(device: str, quick: bool) -> Program:
        try:
            import torchaudio
            transforms = torchaudio.transforms
        except ImportError:  # (the front ends only: audio_front_ends.py holds them as torchaudio writes them)
            import audio_front_ends as transforms
        torch.manual_seed(0)
        if kind == "hdemucs":
            eager = torchaudio.models.hdemucs_low(sources=["drums", "bass", "other", "vocals"])
            shape = (1, 2, 4096 if quick else 32000)  # stereo, 4 s at the 8 kHz hdemucs_low is made for
        elif kind == "melspectrogram":
            eager = transforms.MelSpectrogram(sample_rate=16000, n_fft=400, hop_length=160, n_mels=80)
            shape = (2, 4000) if quick else (8, 16000)
        else:
            eager = transforms.Spectrogram(n_fft=400, hop_length=160)
            shape = (2, 4000) if quick else (8, 16000)
        eager = eager.eval().to(device)
        example = (torch.randn(shape, device=device),)
        if kind == "hdemucs":  # (its decoder adds an Optional[Tensor] skip, which TorchScript cannot type: traced)
            with torch.no_grad():
                model = torch.jit.trace(eager, example, check_trace=False)
        else:
            model = torch.jit.script(eager)
        return Program(model, example, example, eager=eager, fresh=lambda: (torch.randn(shape, device=device),))
    return build


def host(name: str) -> Callable[[str, bool], Program]:
    return lambda device, quick: HOST_PROGRAMS[name](device)


class Entry(NamedTuple):
    title: str
    library: Optional[str]  # the package it needs beyond torch
    build: Callable[[str, bool], Program]


PROGRAMS: dict[str, Entry] = {
    "ssd300_vgg16": Entry("SSD300-VGG16, scripted", "torchvision", detector("ssd300_vgg16")),
    "ssdlite": Entry("SSDlite320-MobileNetV3, scripted", "torchvision", detector("ssdlite")),
    "fasterrcnn_mobilenet": Entry("Faster R-CNN MobileNetV3-320, scripted", "torchvision",
                                  detector("fasterrcnn_mobilenet")),
    "fcos": Entry("FCOS ResNet50, scripted", "torchvision", detector("fcos")),
    "maskrcnn_v2": Entry("Mask R-CNN v2 ResNet50, scripted", "torchvision", detector("maskrcnn_v2")),
    "gcn": Entry("GCN, traced", "torch_geometric", graph_network("gcn")),
    "gat": Entry("GAT, traced", "torch_geometric", graph_network("gat")),
    "graphsage": Entry("GraphSAGE, traced", "torch_geometric", graph_network("graphsage")),
    "spectrogram": Entry("Spectrogram, scripted", None, audio("spectrogram")),  # (audio_front_ends.py without it)
    "melspectrogram": Entry("MelSpectrogram, scripted", None, audio("melspectrogram")),
    "hdemucs": Entry("HDemucs (low), traced", "torchaudio", audio("hdemucs")),
    "beam_search": Entry("beam search, scripted", None, host("beam search")),
    "kv_cache": Entry("KV-cache decode step, scripted", None, host("KV-cache decode step")),
    "nms": Entry("NMS post-process, scripted", None, host("NMS post-process")),
    "list_loop": Entry("loop over List[Tensor], scripted", None, host("loop over List[Tensor]")),
    "refinement": Entry("traced + scripted refinement", None, host("traced + scripted refinement")),
    "int_list_ops": Entry("int and list ops (200 iterations)", None, host("int and list ops (200 iterations)")),
}


def one_line(err: BaseException) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    first = lines[0] if lines else ""
    sentence_end = first.find(". ", 40)  # (torch's messages run on with a stack trace on the same line)
    return f"{type(err).__name__}: {first[:sentence_end + 1 if 0 < sentence_end < 160 else 120]}"


class Contender(NamedTuple):
    call: Callable
    reset: Callable[[], None]


def contender(fn, program: Program) -> Contender:
    reset = getattr(fn, program.reset) if program.reset else (lambda: None)
    return Contender(fn, reset)


def torchscript_contender(program: Program) -> tuple[Contender, str]:
    """TorchScript as the user runs it; where its profiling executor's fuser fails on the optimised (2nd, 3rd) call
    (NNC's "Global alloc not supported yet" on Faster R-CNN, CUDA), its plain interpreter, and a note saying so."""
    model = contender(program.model, program)
    try:
        for _ in range(3):
            model.reset()
            model.call(*program.inputs)
        return model, ""
    except Exception as err:  # noqa: BLE001 - the note names it
        def plain(*inputs):
            with torch.jit.optimized_execution(False):
                return program.model(*inputs)
        return Contender(plain, model.reset), f"TorchScript's optimised executor fails ({one_line(err)}): plain interpreter"


def timed_rounds(contenders: dict[str, Contender], program: Program, device: str, rounds: int, calls: int,
                 warmup: int) -> dict[str, object]:
    """Median wall microseconds per call of each contender, the contenders taking turns round by round (the order
    rotating, so that none always follows the same one); a contender that raises drops out, its error kept."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    times: dict[str, list] = {label: [] for label in contenders}
    failed: dict[str, str] = {}
    labels = list(contenders)
    for turn in range(warmup + rounds):
        for label in labels[turn % len(labels):] + labels[:turn % len(labels)]:
            if label in failed:
                continue
            fn = contenders[label]
            try:
                fn.reset()
                for _ in range(calls):
                    sync()
                    start = time.perf_counter()
                    fn.call(*program.inputs)
                    sync()
                    if turn >= warmup:
                        times[label].append((time.perf_counter() - start) * 1e6)
            except Exception as err:  # noqa: BLE001 - its cell says it
                failed[label] = f"fails: {one_line(err)}"
    return {label: failed.get(label) or round(statistics.median(t), 1) for label, t in times.items()}


def compiled_contenders(program: Program, device: str, modes: list[str]) -> tuple[dict, dict]:
    """torch.compile of the eager module per mode, compiled by a first call before timing (its seconds reported);
    a mode that fails is reported by its error's first line."""
    compiled, report = {}, {}
    torch._dynamo.reset()
    for mode in modes:
        label = "compile RO" if mode == "reduce-overhead" else "compile"
        try:
            fn = torch.compile(program.eager, mode=None if mode == "default" else mode)
            entry = contender(fn, program)
            started = time.perf_counter()
            entry.reset()
            fn(*program.inputs)
            compiled[label] = entry
            report[label + " first call s"] = round(time.perf_counter() - started, 1)
        except Exception as err:  # noqa: BLE001 - the table says it
            report[label] = f"fails: {one_line(err)}"
    return compiled, report


def measure(name: str, args, folder: str) -> dict:
    entry = PROGRAMS[name]
    row: dict = {"program": name, "title": entry.title}
    if entry.library and importlib.util.find_spec(entry.library) is None:
        row["skipped"] = f"skipped: {entry.library} not installed"
        return row
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scripting and tracing the libraries' models warns at length
        program = entry.build(args.device, args.quick)
        contenders: dict[str, Contender] = {}
        with torch.inference_mode():
            contenders["TorchScript"], note = torchscript_contender(program)
        if note:
            row["note"] = note
        try:
            started = time.perf_counter()
            converted = jit2triton.convert(program.model, program.example, device=args.device, backend=args.backend)
            row["convert_s"] = round(time.perf_counter() - started, 1)
            summary = converted.summary()
            row.update(kernel_nodes=summary["native_nodes"], fallback_nodes=summary["fallback_nodes"],
                       unreached_nodes=summary.get("unreached_fallback_nodes", 0),
                       vendor_nodes=summary["extern_nodes"], host_nodes=summary["host_nodes"],
                       kernels=len(summary["kernels"]), verification=summary["verification"]["status"],
                       tf32=any(note.startswith("TF32 is on") for note in summary["verification"]["notes"]),
                       kernel_share=round(summary["native_nodes"] / max(1, summary["native_nodes"]
                                          + summary["fallback_nodes"] + summary["extern_nodes"]), 3),
                       # (the same, of the nodes a conversion run reached: code for other inputs left out)
                       reached_kernel_share=round(summary["native_nodes"] / max(1, summary["native_nodes"]
                                                  + summary["fallback_nodes"] + summary["extern_nodes"]
                                                  - summary.get("unreached_fallback_nodes", 0)), 3))
            path = os.path.join(folder, f"{name}.j2t")
            converted.save(path)
            package = jit2triton.load(path)
            row["runtime"] = package.runtime
            row.update(graph_regions(package.manifest))
            contenders["package"] = contender(package, program)
        except Exception as err:  # noqa: BLE001 - the table says it, and the run goes on
            row["package"] = f"conversion fails: {one_line(err)}"
        with torch.inference_mode():
            if "package" in contenders:
                try:
                    row["max_rel_error"], row["torchscript_spread"] = fresh_error(
                        program, contenders["TorchScript"], contenders["package"])
                    if row.get("tf32"):  # (verification's comparison: both sides in exact float32)
                        with exact_float32():
                            row["exact_rel_error"], _ = fresh_error(
                                program, contenders["TorchScript"], contenders["package"])
                except Exception as err:  # noqa: BLE001 - a package that cannot run a fresh input is not timed
                    row["package"] = f"fails on a fresh input: {one_line(err)}"
                    del contenders["package"]
            modes = [] if args.no_compile else ["default"] + (["reduce-overhead"] if args.device == "cuda" else [])
            compiled, report = compiled_contenders(program, args.device, modes) if program.eager else ({}, {})
            row.update(report)
            if args.device == "cpu" and not args.no_compile:
                row["compile RO"] = "not on the CPU"
            contenders.update(compiled)
            row.update(timed_rounds(contenders, program, args.device, args.rounds, args.calls, args.warmup))
    return row


def graph_regions(manifest: dict) -> dict:
    """How much of a CUDA plan runs as CUDA graphs: the whole plan, or its regions and the launches they hold."""
    if manifest.get("cuda_graph"):
        return {"cuda_graph": "whole plan"}
    from jit2triton.deploy.packaging.graph_regions import regions
    launches = [region["launches"] for region in regions(manifest["plan"])]
    return {"cuda_graph": f"{len(launches)} regions, {sum(launches)} launches"} if launches else {}


def fresh_error(program: Program, reference: Contender, package: Contender) -> tuple[float, float]:
    """(the package against TorchScript's plain interpreter on a fresh input, as verification compares; TorchScript's
    own spread on it: two plain runs, and its optimised executor (on CUDA, NNC's fused kernels round their own
    way), against the first). A detector's top-k and NMS turn such rounding into other boxes: where TorchScript
    differs from itself, the package's error says no more than that."""
    inputs = program.fresh()

    def plain() -> object:
        reference.reset()
        with torch.jit.optimized_execution(False):
            return program.model(*inputs)
    expected = plain()
    spread = worst_error(plain(), expected)
    reference.reset()
    spread = max(spread, worst_error(reference.call(*inputs), expected))
    package.reset()
    return worst_error(package.call(*inputs), expected), spread


def cell(row: dict, label: str) -> str:
    value = row.get(label)
    return "-" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def table_line(row: dict) -> str:
    if "skipped" in row:
        return f"| {row['title']} | {row['skipped']} | | | | | | | |"
    unreached = f" ({row['unreached_nodes']} unreached)" if row.get("unreached_nodes") else ""
    nodes = (f"{row['kernel_nodes']} / {row['fallback_nodes']}{unreached} / {row['vendor_nodes']}"
             if "kernel_nodes" in row else "-")
    error = row.get("max_rel_error")
    spread = row.get("torchscript_spread") or 0.0
    error_cell = "-" if error is None else f"{error:.1e}" + (
        f" (TorchScript itself: {spread:.1e})" if spread > DIFFERS else " (differs)" if error > DIFFERS else "")
    if "exact_rel_error" in row:
        error_cell += f" in TF32, {row['exact_rel_error']:.1e} in exact float32"
    if row.get("verification") not in (None, "passed", "matched up to rounding"):  # (an unverified package says so)
        error_cell += f"; verification {row['verification']}"
    timed = all(isinstance(row.get(label), float) for label in ("TorchScript", "package"))
    ratio = f"{row['TorchScript'] / row['package']:.2f}x" if timed else "-"
    runtime = f" ({row['runtime']} runtime)" if row.get("runtime", "cpp") != "cpp" else ""
    return (f"| {row['title']} | {cell(row, 'convert_s')} | {nodes} | {error_cell} | {cell(row, 'TorchScript')} | "
            f"{cell(row, 'package')}{runtime} | {ratio} | {cell(row, 'compile')} | {cell(row, 'compile RO')} |")


HEADER = ("| program | convert s | kernel / ATen / vendor nodes | max rel. error | TorchScript µs | package µs | "
          "vs TorchScript | compile µs | compile RO µs |\n|---|---|---|---|---|---|---|---|---|")


def environment(args) -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = "not installed"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=HERE, capture_output=True,
                            text=True).stdout.strip()
    device = torch.cuda.get_device_name() if args.device == "cuda" else f"CPU, {torch.get_num_threads()} thread{'s' if torch.get_num_threads() != 1 else ''}"
    return {"device": device, "torch": torch.__version__, "triton": triton_version, "commit": commit,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "rounds": args.rounds, "calls": args.calls,
            "warmup_rounds": args.warmup, "quick": args.quick, "torch.compile": not args.no_compile,
            "load_average_before": os.getloadavg()[0]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--programs", default="", help=f"comma-separated, of: {', '.join(PROGRAMS)} (default all)")
    parser.add_argument("--rounds", type=int, default=0, help="timed rounds (default 20, 3 with --quick)")
    parser.add_argument("--calls", type=int, default=0, help="calls per contender per round (default 5, 2 --quick)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--json", help="write the results here (rewritten after each program)")
    parser.add_argument("--quick", action="store_true", help="few rounds, the smallest sizes")
    parser.add_argument("--backend", help="convert's backend (default: the device's; aten: every op through ATen)")
    parser.add_argument("--no-compile", action="store_true", help="leave torch.compile out")
    parser.add_argument("--threads", type=int, default=0, help="torch's CPU threads (0: torch's default)")
    args = parser.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 20)
    args.calls = args.calls or (2 if args.quick else 5)
    names = [n for n in args.programs.split(",") if n] or list(PROGRAMS)
    unknown = [n for n in names if n not in PROGRAMS]
    if unknown:
        parser.error(f"unknown program(s) {', '.join(unknown)}: expected some of {', '.join(PROGRAMS)}")
    if args.threads:
        torch.set_num_threads(args.threads)
    torch._logging.set_logs(dynamo=logging.ERROR)  # (a graph break per data-dependent branch, logged at length)
    from jit2triton.deploy.cpp_runtime import extension
    extension()  # built (or found in the cache) before anything is timed
    setting = environment(args)
    rows: list = []

    def write_json() -> None:
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"setting": setting, "rows": rows}, f, indent=1)
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            print(f"{name} ...", file=sys.stderr, flush=True)
            try:
                rows.append(measure(name, args, folder))
            except Exception as err:  # noqa: BLE001 - building or TorchScript itself failed: say so, go on
                rows.append({"program": name, "title": PROGRAMS[name].title, "package": f"fails: {one_line(err)}"})
            print(table_line(rows[-1]), file=sys.stderr, flush=True)
            write_json()  # as it goes: a run cut short still leaves its rows
    setting["load_average_after"] = os.getloadavg()[0]
    print(f"\n{setting['device']}; torch {setting['torch']}, triton {setting['triton']}; git HEAD {setting['commit']}; "
          f"{setting['date']}; load average {setting['load_average_before']:.1f} before, "
          f"{setting['load_average_after']:.1f} after\nmedian wall µs per call over {args.rounds} rounds x "
          f"{args.calls} calls, contenders in turns, after {args.warmup} warm-up rounds, under torch.inference_mode()"
          f"{'; CUDA synchronised per call' if args.device == 'cuda' else ''}"
          f"{'; torch.compile left out' if args.no_compile else ''}; vs TorchScript: TorchScript µs over "
          f"the package's; max rel. error: the package against TorchScript's plain interpreter on a fresh random "
          f"input (where TorchScript's own runs differ by more than {DIFFERS:g}, the cell says by how much)\n")
    print(HEADER)
    for row in rows:
        print(table_line(row))
    for row in rows:
        if "note" in row:
            print(f"{row['title']}: {row['note']}")
        if "cuda_graph" in row:
            print(f"{row['title']}: CUDA graphs: {row['cuda_graph']}")
    write_json()
    return 0


if __name__ == "__main__":
    sys.exit(main())
