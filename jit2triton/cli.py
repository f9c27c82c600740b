"""The `jit2triton` command: convert, run, inspect, demo, cpp-dir."""
from __future__ import annotations

import importlib
import json
import os
import re
import statistics
import sys
import time
import warnings
from typing import Optional

import click

from jit2triton.emitters.backends import NAMES as BACKEND_NAMES

from .cli_checks import (EXIT_CODES, OUTPUTS_DIFFER, Group, OutputsDiffer, check_output, check_port,
                         check_precision_options, read_input_sets, read_inputs_file, set_debug)
from .errors import InputError
from .version import __version__

# torch is imported inside the commands that need it: `--help` and `--version` answer at once.


class _Progress:
    """Conversion progress on stderr, each line with the seconds since the first: a slow stage shows as the gap
    before the next line. A counted step ("pass observe 2/14", "compiling Triton kernels 3/40") is a bar redrawn
    in place on a terminal; elsewhere (a log) it is a plain line at the start, every tenth and the end. `quiet`:
    nothing."""

    COUNTED = re.compile(r"^(.*) (\d+)/(\d+)$")

    def __init__(self, quiet: bool = False) -> None:
        self.quiet = quiet
        self.tty = sys.stderr.isatty()
        self.open_bar = False
        self.bar_width = 0
        self.started = None

    def __call__(self, message: str) -> None:
        if self.quiet:
            return
        self.started = self.started or time.perf_counter()
        head = f"[jit2triton {time.perf_counter() - self.started:6.1f}s]"
        counted = self.COUNTED.match(message)
        if counted is None:
            self.end_bar()
            click.echo(f"{head} {message}", err=True)
            return
        what, done, total = counted.group(1), int(counted.group(2)), int(counted.group(3))
        if self.tty:
            filled = 30 * done // max(total, 1)
            bar = f"{head} {what} [{'#' * filled}{'.' * (30 - filled)}] {done}/{total}"
            # padded to the last bar's width: a shorter stage name must not leave the last one's tail
            click.echo("\r" + bar.ljust(self.bar_width), err=True, nl=False)
            self.bar_width = len(bar)
            self.open_bar = True
            if done >= total:
                self.end_bar()
        elif done in (1, total) or done * 10 // total != (done - 1) * 10 // total:
            click.echo(f"{head} {message}", err=True)

    def end_bar(self) -> None:
        if self.open_bar:
            click.echo("", err=True)
            self.open_bar, self.bar_width = False, 0


_progress = _Progress()


@click.group(cls=Group, epilog=EXIT_CODES)
@click.version_option(__version__, "--version", prog_name="jit2triton")
@click.option("--debug", is_flag=True, expose_value=False, is_eager=True, callback=set_debug,
              help="show the traceback of an error instead of its one line")
def main() -> None:
    """jit2triton: TorchScript models in, fused kernels out, in a one-file package."""


def _accuracy(rtol: Optional[float], atol: Optional[float]) -> Optional[dict]:
    given = {name: value for name, value in (("rtol", rtol), ("atol", atol)) if value is not None}
    return given or None


def _imports_option(command):
    """--import MODULE: a library whose ops the package calls, loaded before it (a TorchScript model calling
    torchvision::nms needs torchvision's ops registered, for torch.jit.load as for a package)."""
    return click.option("--import", "imports", multiple=True, metavar="MODULE",
                        help="import this Python module before loading: a library whose ops the package calls "
                             "(torchvision, for torchvision::nms); repeatable")(command)


def _import_modules(names: tuple) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as err:  # noqa: BLE001 - whatever stops the import, the user named the module
            raise click.BadParameter(f"cannot import {name!r} ({type(err).__name__}: {err})",
                                     param_hint="--import") from None


@main.command(short_help='Convert a TorchScript .pt into a .j2t package.')
@click.argument("model", type=click.Path(dir_okay=False))
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="package path (default: MODEL with .j2t)")
@click.option("--input", "input_specs", multiple=True,
              help="an example input: SHAPE[:DTYPE][:LOW-HIGH] (8x3x224x224:float16, 1x9:int64:0-30522, "
                   "scalar:float32) or int=3 / float=0.5; once per model input, in order. A name in the shape "
                   "(Bx128) is a dynamic dim declared with --dim; other sizes are fixed")
@click.option("--dim", "dim_specs", multiple=True,
              help="a dynamic dim named in --input shapes: NAME=MIN:MAX[:EXAMPLE] (B=1:64, S=8:512:128); the "
                   "package serves every size in the range (the example size, default the smallest above 1, is "
                   "the one conversion traces)")
@click.option("--dynamic-batch", is_flag=True,
              help="make the inputs' first (batch) axis dynamic where the model allows it, else keep it static "
                   "and say why (dynamic_shapes='auto'); instead of --dim")
@click.option("--narrow-dims", is_flag=True,
              help="narrow a --dim range the model does not run over end to end to the sizes that ran, and say so "
                   "(default: refuse it, naming the largest size that ran)")
@click.option("--inputs-file", type=click.Path(exists=True, dir_okay=False),
              help="example inputs saved with torch.save as a tuple or list of tensors")
@click.option("--verify-inputs", "verify_inputs_file", type=click.Path(exists=True, dir_okay=False),
              help="input sets of your own to verify on besides conversion's draws: a list of input tuples saved "
                   "with torch.save (--inputs-file holds the example inputs)")
@click.option("--timeout", type=click.FloatRange(min=0), default=600.0, show_default=True,
              help="seconds the conversion may take; past them it stops, naming the stage that took the time "
                   "(0: no limit)")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--backend", type=click.Choice(list(BACKEND_NAMES)), default=None,
              help="kernel generator (default: cpp on the CPU, triton on CUDA; aten: no generated kernels)")
@click.option("--no-verify", is_flag=True,
              help="skip comparing the package with the TorchScript model on the example and fresh inputs")
@click.option("--full-source-paths", is_flag=True,
              help="name source files in kernel comments by this machine's full paths (default: as imported)")
@click.option("--quiet", is_flag=True, help="print only the line naming the saved package (no progress, no report)")
@click.option("--sign", "signing_key", type=click.Path(exists=True, dir_okay=False),
              help="sign the package with this Ed25519 private key (from `jit2triton keygen`)")
@click.option("--choices", type=click.Choice(["timed", "fixed"]), default="timed", show_default=True,
              help="timed: choices such as oneDNN or ATen for a GEMM by timing both here (listed in the report); "
                   "fixed: the same answers on every machine, nothing timed (a reproducible build)")
@click.option("--precision", type=click.Choice(["fp32", "fp16", "bf16"]), default=None,
              help="compute a float32 model in float16 or bfloat16 (weights stored so; inputs and outputs keep the "
                   "model's dtypes), float32 kept where the op table or the accuracy needs it (default: the "
                   "model's own precision)")
@click.option("--rtol", type=float, default=None,
              help="with --precision: the largest error of an output relative to its largest magnitude "
                   "(default per precision: fp16 1e-2, bf16 5e-2); nodes move back to float32 until it holds")
@click.option("--atol", type=float, default=None, help="with --precision: the absolute error allowed beside --rtol")
@click.option("--io-precision", type=click.Choice(["model", "fp16", "bf16"]), default=None,
              help="with --precision: 'model' (the default) keeps the model's input and output dtypes; the same "
                   "as --precision takes and gives them in the reduced type")
@_imports_option
def convert(model, output, input_specs, dim_specs, dynamic_batch, narrow_dims, inputs_file, verify_inputs_file, timeout,
            device, backend, no_verify, full_source_paths, quiet, signing_key, choices, precision, rtol, atol,
            io_precision, imports) -> None:
    """Convert a TorchScript archive into a .j2t package."""
    from .api import convert as convert_model
    from .inputs import dynamic_axes, parse_dim_spec, parse_input_spec

    output = output or os.path.splitext(model)[0] + ".j2t"
    check_output(output, model)
    _import_modules(imports)
    check_precision_options(precision, rtol, atol, io_precision)
    if signing_key:  # a public key given by mistake fails here, not after the whole conversion
        from jit2triton.deploy.signing import sign
        sign(b"", signing_key)
    dims = {}
    for spec in dim_specs:
        dim, example = parse_dim_spec(spec)
        dims[dim.name] = (dim, example)
    inputs = [parse_input_spec(s, dims) for s in input_specs]
    dynamic_shapes = {i: {axis: dims[name][0] for axis, name in dynamic_axes(s).items()}
                      for i, s in enumerate(input_specs) if dynamic_axes(s)}
    unused = set(dims) - {name for s in input_specs for name in dynamic_axes(s).values()}
    if unused:
        raise InputError(f"--dim {sorted(unused)[0]} is named in no --input shape (write it there: "
                         f"--input {sorted(unused)[0]}x128:int64)")
    if dynamic_batch:
        if dynamic_shapes:
            raise InputError("--dynamic-batch chooses the dynamic dim itself: give it or --dim, not both")
        dynamic_shapes = "auto"
    if inputs_file:
        inputs += read_inputs_file(inputs_file)
    with warnings.catch_warnings():
        if not quiet:  # the progress lines say it already: once is enough
            from .precision import PrecisionWarning
            warnings.filterwarnings("ignore", message=r"precision=.* on a CPU without", category=PrecisionWarning)
        converted = convert_model(model, example_inputs=tuple(inputs), device=device, backend=backend,
                                  progress=_Progress(quiet), verify=not no_verify, full_source_paths=full_source_paths,
                                  dynamic_shapes=dynamic_shapes or None, choices=choices, narrow_dims=narrow_dims,
                                  precision=precision, accuracy=_accuracy(rtol, atol), io_precision=io_precision,
                                  timeout=timeout or None,
                                  verify_inputs=read_input_sets(verify_inputs_file) if verify_inputs_file else None)
    converted.save(output, signing_key=signing_key)
    if not quiet:
        click.echo(converted.report())
    click.echo(f"saved {output} ({os.path.getsize(output) / 1e6:.2f} MB{', signed' if signing_key else ''})")


@main.command(short_help="Make an Ed25519 key pair to sign packages with.")
@click.option("--out", "folder", required=True, type=click.Path(file_okay=False),
              help="folder for jit2triton.key (private, mode 0600) and jit2triton.pub")
@click.option("--force", is_flag=True, help="replace a key pair already there")
def keygen(folder, force) -> None:
    """Write a key pair: sign packages with the private key (`convert --sign DIR/jit2triton.key`), and load them
    with the public one (`load(path, trusted_keys=["DIR/jit2triton.pub"])`, `--trusted-key`, or the
    JIT2TRITON_TRUSTED_KEYS environment variable), which then refuses any package that key did not sign."""
    from jit2triton.deploy.signing import PRIVATE_KEY_FILE, PUBLIC_KEY_FILE, generate_keys

    existing = [os.path.join(folder, name) for name in (PRIVATE_KEY_FILE, PUBLIC_KEY_FILE)
                if os.path.exists(os.path.join(folder, name))]
    if existing and not force:  # in the command's words (the API's error names its `overwrite` argument)
        raise InputError(f"{existing[0]} exists; keep it, or pass --force to replace the key pair (packages signed "
                         "with the old key then need the old public key)")
    private, public = generate_keys(folder, overwrite=force)
    click.echo(f"wrote {private} (keep it secret: it signs packages)")
    click.echo(f"wrote {public} (give it to whoever loads them)")


@main.command(short_help="Sign a package with an Ed25519 private key.")
@click.argument("package", type=click.Path(dir_okay=False))
@click.option("--key", "signing_key", required=True, type=click.Path(exists=True, dir_okay=False),
              help="the private key (jit2triton.key from `jit2triton keygen`)")
@click.option("-o", "--output", type=click.Path(dir_okay=False), help="write the signed package here (default: in place)")
def sign(package, signing_key, output) -> None:
    """Sign a package that was saved unsigned (or re-sign it with another key): its checksums are checked first, so
    only an undamaged package is signed. A signature replaces any signature it had."""
    from jit2triton.deploy.package import read_package, save_package
    from jit2triton.deploy.signing import sign as sign_bytes

    output = output or package
    check_output(output, "" if output == package else package)
    sign_bytes(b"", signing_key)  # a public key given by mistake fails here, before the package is read
    save_package(read_package(package), output, signing_key)
    click.echo(f"signed {output} with {signing_key}")


@main.command("verify", short_help="Check a package's checksums and signature (no code loaded).")
@click.argument("package", type=click.Path(dir_okay=False))
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(dir_okay=False),
              help="the package must be signed by this Ed25519 public key (repeatable; JIT2TRITON_TRUSTED_KEYS too)")
def verify_signature(package, trusted_keys) -> None:
    """Check every member's sha256 and, with trusted keys, that one of them signed the package, as `load` does
    before anything in it is parsed: exit 0 when it would load, 2 with the reason when it would be refused."""
    from jit2triton.deploy.package import read_package
    from jit2triton.deploy.signing import trusted_key_paths

    contents = read_package(package, mmap=True, trusted_keys=trusted_keys)
    keys = trusted_key_paths(trusted_keys)
    if keys:
        click.echo(f"{package}: checksums hold, signed by a trusted key ({', '.join(keys)})")
    else:
        click.echo(f"{package}: checksums hold, {'signed' if contents.signed else 'not signed'} (signature not "
                   "checked: pass --trusted-key or set JIT2TRITON_TRUSTED_KEYS)")


@main.command(short_help='Run a package on random inputs (--check: vs TorchScript).')
@click.argument("package", type=click.Path(dir_okay=False))
@click.option("--check", "reference", type=click.Path(exists=True, dir_okay=False),
              help="the TorchScript model to compare outputs with: each output's worst error is printed, and the "
                   f"command exits with code {OUTPUTS_DIFFER} when one is beyond the tolerance (--rtol, --atol)")
@click.option("--rtol", type=click.FloatRange(min=0), default=None,
              help="with --check: the largest error allowed, relative to the output's largest magnitude (default "
                   "per dtype, as convert's verification: float32 1e-3, float16 3e-2, bfloat16 6e-2)")
@click.option("--atol", type=click.FloatRange(min=0), default=None,
              help="with --check: the absolute error allowed beside --rtol (default per dtype: float32 1e-5, "
                   "float16 1e-3, bfloat16 1e-2)")
@click.option("--runs", type=click.IntRange(min=1), default=20, show_default=True, help="timed calls after one warm-up")
@click.option("--seed", default=0, show_default=True)
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None, help="override the package's device")
@click.option("--runtime", type=click.Choice(["auto", "cpp"]), default="auto", show_default=True, hidden=True,
              help="kept for older scripts: every package runs in the C++ runtime")
@click.option("--shape", "shape_specs", multiple=True,
              help="sizes of the package's dynamic dims: DIM=N[,DIM=N] (B=4,S=128); default: the example's")
@click.option("--inputs-file", type=click.Path(exists=True, dir_okay=False),
              help="run on these inputs (a tuple of tensors saved with torch.save) instead of random ones")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads: torch's (torch.set_num_threads) and the generated kernels' (default: torch's)")
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(dir_okay=False),
              help="refuse the package unless this Ed25519 public key signed it (repeatable; see keygen)")
@_imports_option
def run(package, reference, rtol, atol, runs, seed, device, runtime, shape_specs, inputs_file, threads,
        trusted_keys, imports) -> None:
    """Run a package on random inputs; compare with the TorchScript model when --check is given. Both run under
    torch.inference_mode()."""
    import torch

    from .api import load
    from .compare import call_reference, check_outputs, load_reference
    from .inputs import parse_sizes, random_inputs

    if reference is None and (rtol is not None or atol is not None):
        raise click.UsageError("--rtol and --atol are the tolerance of --check: give --check MODEL.pt too")
    if inputs_file and shape_specs:
        raise click.UsageError("--shape sizes the random inputs; --inputs-file gives the inputs: give one of them")
    given = read_inputs_file(inputs_file) if inputs_file else None
    _import_modules(imports)
    if threads:
        torch.set_num_threads(threads)  # ATen's ops in the plan and the TorchScript model, as bench's --threads
    module = load(package, map_location=device, runtime=runtime, num_threads=threads, trusted_keys=trusted_keys)
    scripted = load_reference(reference, module.device) if reference else None
    signature = module.manifest["signature"]
    if given is not None:
        inputs = [x.to(module.device) if isinstance(x, torch.Tensor) else x for x in given]
    else:
        inputs = random_inputs(signature["inputs"], module.device, seed,
                               parse_sizes(shape_specs, signature.get("dims", {})))
    with torch.inference_mode():
        if scripted is not None:  # first, on inputs of its own (a model may change its inputs in place)
            copies = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
            expected = call_reference(scripted, copies, reference, module.signature())
        outputs = module(*inputs)
        times = []
        for _ in range(runs):
            start = time.perf_counter()
            module(*inputs)
            if module.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    click.echo(f"signature: {module.signature()}")
    click.echo(f"median time per call: {statistics.median(times) * 1e3:.3f} ms over {runs} run{'s' if runs > 1 else ''}, "
               f"{torch.get_num_threads()} thread{'s' if torch.get_num_threads() > 1 else ''}")
    if scripted is not None:
        checks = check_outputs(outputs, expected, rtol, atol)
        click.echo(f"max abs error against {reference}: {max(check.error for check in checks):.3e}")
        for check in checks:
            click.echo(f"  {check.line}")
        differ = [check.where for check in checks if check.differs]
        if differ:
            raise OutputsDiffer(f"{package} differs from {reference} beyond the tolerance at {', '.join(differ[:4])}"
                                f"{' ...' if len(differ) > 4 else ''}; is it the model the package was converted from?")
        click.echo(f"outputs match {reference} within the tolerance")


@main.command(short_help="Time a package: latency statistics, --against TorchScript, --profile.")
@click.argument("package", type=click.Path(dir_okay=False))
@click.option("--warmup-ms", type=click.FloatRange(min=0), default=200.0, show_default=True,
              help="warm up for this long before timing (at least 3 calls each, so TorchScript's profiling "
                   "executor has optimised)")
@click.option("--iterations", type=click.IntRange(min=1), default=None,
              help="timed calls (default: as many as --duration-s allows)")
@click.option("--duration-s", type=click.FloatRange(min=0, min_open=True), default=3.0, show_default=True,
              help="time calls for this long (unless --iterations)")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="CPU threads: torch's (torch.set_num_threads) and the generated kernels' (default: torch's)")
@click.option("--cuda-graphs", type=click.Choice(["on", "off"]), default="on", show_default=True,
              help="on CUDA: run a straight-line plan as one CUDA graph")
@click.option("--runtime", type=click.Choice(["auto", "cpp"]), default="auto", show_default=True, hidden=True,
              help="kept for older scripts: every package runs in the C++ runtime")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default=None, help="override the package's device")
@click.option("--shape", "shape_specs", multiple=True, help="sizes of dynamic dims: DIM=N[,DIM=N] (B=4,S=128)")
@click.option("--inputs-file", type=click.Path(exists=True, dir_okay=False),
              help="time on these inputs (a tuple of tensors saved with torch.save) instead of random ones")
@click.option("--against", type=click.Path(exists=True, dir_okay=False),
              help="a TorchScript .pt timed in turn with the package, call by call, on the same inputs")
@click.option("--profile", is_flag=True, help="then time each plan step in the runtime benchmarked (synchronised, no "
                                              "CUDA graphs) and show where the time goes, by TorchScript source line")
@click.option("--host-profile", is_flag=True, help="as --profile, but each step's host work only (not synchronised): "
                                                   "where a host-bound call on a GPU spends its time")
@click.option("--json", "json_path", type=click.Path(dir_okay=False),
              help="also write the results, every call's time and the machine's facts as JSON here")
@click.option("--seed", default=0, show_default=True, help="seed of the random inputs")
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(dir_okay=False),
              help="refuse the package unless this Ed25519 public key signed it (repeatable; see keygen)")
@_imports_option
def bench(package, warmup_ms, iterations, duration_s, threads, cuda_graphs, runtime, device, shape_specs,
          inputs_file, against, profile, host_profile, json_path, seed, trusted_keys, imports) -> None:
    """Time a package like trtexec: min, mean, median, p90, p99 and max latency and throughput on random inputs
    that fit its signature. Every path runs under torch.inference_mode(), as a deployment does."""
    from .bench import Bench, run_bench

    if json_path:
        check_output(json_path, package, "--json")
    _import_modules(imports)
    options = Bench(package, warmup_ms, iterations, duration_s, threads, cuda_graphs == "on", runtime, device,
                    shape_specs, against, profile, json_path, seed, trusted_keys, host_profile)
    run_bench(options, read_inputs_file(inputs_file) if inputs_file else None, click.echo)


@main.command(short_help="Serve packages over HTTP with Ray Serve: a model repository, replicas, dynamic batching.")
@click.argument("packages", nargs=-1, required=True, type=click.Path(exists=True))
@click.option("--replicas", type=click.IntRange(min=1), default=1, show_default=True,
              help="replicas of each model, each loading its package once")
@click.option("--max-batch", type=click.IntRange(min=1), default=32, show_default=True,
              help="most rows of a package's batch dim in one model call (1: no batching)")
@click.option("--batch-wait-ms", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="longest wait for a batch to fill")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="address the HTTP (and gRPC) server listens on (0.0.0.0: every interface); Ray's own processes "
                   "listen on loopback whatever it is")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option("--grpc-port", type=click.IntRange(1, 65535), default=None,
              help="also serve the KServe v2 gRPC protocol (tritonclient.grpc) on this port, at --host as HTTP is "
                   "(needs grpcio and tritonclient[grpc])")
@click.option("--runtime", type=click.Choice(["auto", "cpp"]), default="auto", show_default=True, hidden=True,
              help="kept for older scripts: every package runs in the C++ runtime")
@click.option("--num-gpus", type=click.FloatRange(min=0), default=0.0, show_default=True,
              help="GPUs per replica (a CUDA package needs 1)")
@click.option("--threads", type=click.IntRange(min=1), default=None, help="CPU threads per replica (default: torch's)")
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(dir_okay=False),
              help="refuse a package unless this Ed25519 public key signed it (repeatable; see keygen)")
@_imports_option
def serve(packages, replicas, max_batch, batch_wait_ms, host, port, grpc_port, runtime, num_gpus, threads,
          trusted_keys, imports) -> None:
    """Serve packages (.j2t files, or folders of them: a model repository) on a local Ray instance until Ctrl-C or
    SIGTERM, over the KServe v2 / Triton Inference Server protocol: each package is model NAME (its file name
    without .j2t) at /v2/models/NAME (infer, ready, config, stats), with the repository index and load/unload at
    /v2/repository; GET /metrics for Prometheus; GET / and POST / a simple JSON form when one model is served. With
    --grpc-port, the same protocol over gRPC too (GRPCInferenceService, as tritonclient.grpc calls it). To serve on
    a Ray cluster you already run, use jit2triton.serving.app."""
    from jit2triton.deploy.package import read_package
    from jit2triton.deploy.resolve import check_plan_ops

    try:
        from .serving import (Model, deploy_repository, plan_batching, repository_models, start_local,
                              stop_local, stop_signals)
        import ray  # noqa: F401
    except ImportError as err:
        raise click.ClickException(f"serving needs Ray Serve ({err}): pip install 'jit2triton[serve]'") from None
    if grpc_port is not None:
        from jit2triton.deploy.serving import grpc_endpoint

        if grpc_endpoint.MISSING:
            raise click.ClickException(grpc_endpoint.MISSING)
        if grpc_port == port:
            raise click.UsageError(f"--grpc-port and --port are both {port}: give gRPC a port of its own")
    options = {"runtime": runtime, "max_batch_size": max_batch, "batch_wait_timeout_s": batch_wait_ms / 1e3,
               "num_replicas": replicas, "num_gpus": num_gpus, "num_threads": threads, "trusted_keys": trusted_keys,
               "imports": imports,
               "logging_config": {"enable_access_log": sys.stdout.isatty()},  # a log file gets no line per request
               "graceful_shutdown_wait_loop_s": 0.5}  # a stopping replica checks every 0.5 s that its requests are done
    try:
        models: list[Model] = repository_models(list(packages), options)
    except ValueError as err:
        raise InputError(str(err)) from None
    # first, so a missing, damaged or unsigned package or a busy port is one clear line, not a failed replica or
    # a page of Ray's logs
    batchings = {}
    _import_modules(imports)  # (here, to check the packages' ops; each replica imports them too)
    for model in models:
        manifest = read_package(model.package, mmap=True, trusted_keys=trusted_keys).manifest
        methods = manifest.get("methods") if isinstance(manifest.get("methods"), dict) else {}
        for plan in [manifest["plan"]] + [m.get("plan") for m in methods.values() if isinstance(m, dict)]:
            check_plan_ops(plan)  # (a library's op not loaded: one line here, not a failed replica per package)
        if not manifest["device"].startswith("cpu") and not num_gpus:
            raise click.ClickException(f"{model.package} runs on {manifest['device']}: give each replica a GPU "
                                       "(--num-gpus 1)")
        batchings[model.name] = plan_batching(manifest["signature"], max_batch)
    check_port(host, port)
    if grpc_port is not None:
        check_port(host, grpc_port)
    from ray.exceptions import RayError

    stop = stop_signals()
    grpc_server = None
    try:
        start_local(host, port)
        deploy_repository(models, options["logging_config"])
        if grpc_port is not None:
            grpc_server = grpc_endpoint.start([m.name for m in models], host, grpc_port)
        address = host if ":" not in host else f"[{host}]"
        base = f"http://{address}:{port}"
        for model in models:
            batching = batchings[model.name]
            click.echo(f"serving {os.path.basename(model.package)} at {base}/v2/models/{model.name} with {replicas} "
                       f"replica{'s' if replicas > 1 else ''}, " + (
                           f"batching dim {batching.dim}, up to {batching.max_rows} rows per call" if batching.dim
                           else f"one request per call ({batching.why_not})"))
        click.echo(f"KServe v2: {base}/v2/models/NAME/infer; repository: POST {base}/v2/repository/index; "
                   f"statistics: {base}/v2/models/stats; metrics: {base}/metrics")
        if grpc_server is not None:
            click.echo(f"KServe v2 over gRPC: {address}:{grpc_port} (tritonclient.grpc.InferenceServerClient)")
        click.echo(f"try: curl -s {base}/v2/models/{models[0].name}   (Ctrl-C or SIGTERM stops)")
        stop.wait()
    except KeyboardInterrupt:
        pass
    except RuntimeError as err:  # Serve's report of replicas that could not start (each replica's error is in it)
        raise click.ClickException(f"the deployment did not start: {err}") from None
    except RayError as err:  # one of Ray's own processes died (its proxy, failing health checks on a starved machine)
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise click.ClickException(f"Ray Serve stopped: {type(err).__name__}: {reason} (Ray's logs are under "
                                   "/tmp/ray/session_latest/logs)") from None
    finally:
        stop.ignore()  # a second signal while draining does not cut the drain short
        if grpc_server is not None:
            grpc_server.stop(grace=10).wait()  # refuses new RPCs, finishes those it holds, before Serve drains
        stop_local()  # drains the replicas, then ends every process Ray started
    click.echo("stopped")


@main.command(short_help="Show a package's signature, report and kernels.")
@click.argument("package", type=click.Path(dir_okay=False))
@click.option("--kernels", is_flag=True, help="print the generated kernel sources")
@click.option("--plan", is_flag=True, help="print the execution plan as JSON, alone (for jq or json.load)")
@click.option("--ir", is_flag=True, help="print the typed IR the package was made from")
@click.option("--trusted-key", "trusted_keys", multiple=True, type=click.Path(dir_okay=False),
              help="refuse the package unless this Ed25519 public key signed it (repeatable; see keygen)")
def inspect(package, kernels, plan, ir, trusted_keys) -> None:
    """Show a package's manifest, signature and conversion report (loads no kernel code)."""
    from .api import Converted
    from jit2triton.deploy.package import read_package

    # read only: no library opened, nothing run
    module = Converted(read_package(package, mmap=True, trusted_keys=trusted_keys), runtime=None)
    manifest = module.manifest
    if plan:
        if kernels or ir:
            raise click.UsageError("--plan prints the plan as JSON alone: give --kernels or --ir in another call")
        from jit2triton.deploy.literals import encode, map_plan_literals
        click.echo(json.dumps(map_plan_literals(manifest["plan"], encode), indent=1, allow_nan=False))  # as stored
        return
    producer = manifest.get("producer") or {}  # (optional, as the report and the IR are: nothing runs by them)
    click.echo(f"package {package}: format v{manifest.get('format_version', '?')}, device {manifest['device']}, "
               f"backend {manifest['backend']}")
    click.echo(f"made with jit2triton {producer.get('jit2triton', '?')}, torch {producer.get('torch', '?')}, "
               f"triton {producer.get('triton') or '-'}, python {producer.get('python', '?')}")
    click.echo(f"signed: {_signed_line(module._contents.signed, trusted_keys)}")
    click.echo(f"signature: {module.signature()}")
    click.echo(f"weights: {len(module._contents.weights)} tensors")
    extra = module.extra_files()
    click.echo("extra files: " + (", ".join(f"{name} ({len(data)} bytes)" for name, data in sorted(extra.items()))
                                  or "none"))
    graphs = _cuda_graph_line(manifest)
    if graphs:
        click.echo(graphs)
    click.echo(module.report())
    if ir:
        click.echo(manifest.get("ir") or "the package holds no IR")
    if kernels:
        click.echo(module.code)


def _cuda_graph_line(manifest: dict) -> str:
    """How many CUDA graphs a CUDA package may hold and what memory they take (deploy/cpp/src/cuda_graph.cpp), or ""."""
    from jit2triton.deploy.packaging.graph_regions import regions as graph_regions
    from jit2triton.deploy.policy import MAX_GRAPHS

    if manifest["device"] != "cuda":
        return ""
    keyed = ("per input shape and scalar inputs" if manifest["signature"].get("dims") else "per scalar inputs") + (
        " and math mode (TF32, reduced-precision reductions, cuDNN's settings)")
    if manifest.get("cuda_graph"):
        return (f"CUDA graphs: the whole plan, one graph {keyed}, captured on a key's second call, at most "
                f"{MAX_GRAPHS}, the most frequent keys of recent calls (others step by step); each holds its own "
                "buffers, the memory of one call at its shape")
    regions = len(graph_regions(manifest["plan"]))
    timed = manifest.get("report", {}).get("cuda_graph", {})
    if not regions and timed.get("regions") is False:
        return (f"CUDA graphs: none (its regions took {timed['graph_us']:.0f} us a call at conversion, step by step "
                f"{timed['steps_us']:.0f} us: the plan runs step by step)")
    if not regions:
        return "CUDA graphs: none (the plan runs step by step)"
    return (f"CUDA graphs: {regions} regions, one graph {keyed} each, captured on a key's second sight, at most "
            f"{MAX_GRAPHS} per region, the most frequent keys of recent calls; a region's graphs share one memory pool "
            "(they never run at once)")


def _signed_line(signed: bool, trusted_keys) -> str:
    from jit2triton.deploy.signing import trusted_key_paths

    if not signed:
        return "no"
    if trusted_key_paths(trusted_keys):
        return "yes, by a trusted key"
    return "yes (not checked: pass --trusted-key or set JIT2TRITON_TRUSTED_KEYS)"


@main.command("cpp-dir", short_help="Print the C++ runtime's CMake folder.")
def cpp_dir() -> None:
    """Print the C++ runtime's CMake source folder (for add_subdirectory or cmake -S)."""
    from jit2triton import deploy  # not deploy.cpp_runtime (its ROOT), which imports torch: this answers at once

    click.echo(os.path.join(os.path.dirname(os.path.abspath(deploy.__file__)), "cpp"))


@main.command(short_help='Convert, save, load and check a bundled model.')
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option("--keep", type=click.Path(dir_okay=False), help="also keep the demo package at this path")
def demo(device, keep) -> None:
    """Convert a bundled model (a CNN block and an attention block), round-trip it and check it."""
    from .demo import run_demo

    if keep:
        check_output(keep, option="--keep")
    run_demo(device=device, keep=keep, echo=click.echo, progress=_progress)


if __name__ == "__main__":
    main()
