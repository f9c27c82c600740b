"""Convert-time verification: a package is run on the example inputs and on a fresh random draw of its signature
and compared with the TorchScript model itself, so a wrong kernel is found before a user ships it.

When the outputs disagree, deploy/packaging/culprit.py finds the generated kernel to take out.
"""
from __future__ import annotations

import contextlib
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch

from jit2triton.deploy.policy import CHECK_ABSOLUTE_TOLERANCE, CHECK_EXACT_FRACTION, CHECK_RELATIVE_TOLERANCE
from jit2triton.loaders.graph_nodes import all_nodes
from jit2triton.transpiler.op_table import lookup

from .draw_rules import DrawRules
from .errors import ConversionError, InputError, Jit2TritonError, PackageError, SizeChangedError, TimeBudgetError
from .inputs import random_inputs
from .reference_child import ReferenceCrashed

# Largest error allowed, relative to the largest magnitude of the reference tensor: generated kernels reassociate
# sums and use their own vector math, so they agree with ATen to rounding, not to the bit. Plus an absolute floor,
# as torch.testing has: an output that is only rounding noise (the std of values equal but for their last bit,
# ~1e-7) has no scale of its own to be relative to. Ints and bools: EXACT_FRACTION of the elements may flip (an
# argmax tie broken by a rounding difference). The numbers are policy's, which j2t-run --torchscript holds too.
RELATIVE_TOLERANCE, ABSOLUTE_TOLERANCE = CHECK_RELATIVE_TOLERANCE, CHECK_ABSOLUTE_TOLERANCE
EXACT_FRACTION = CHECK_EXACT_FRACTION
FRESH_SEED = 20260101
SEQUENCE_CALLS = 6  # a model with module state is also verified over this many calls, each from the last one's state
CROSS_DEVICE_SLACK = 10.0  # a CPU reference for a CUDA package: cuDNN convolutions use TF32 by default


@dataclass
class Mismatch:
    where: str  # "output[1]", "input x (written in place)"
    error: float  # relative to the reference's scale; inf for a structural difference
    detail: str

    def __str__(self) -> str:
        return f"{self.where}: {self.detail}"




def tf32_note(graph: Any, device: torch.device) -> Optional[str]:
    """Why verification runs TorchScript and the package with TF32 off, or None: on CUDA with TF32 on (cuDNN's
    convolutions by default, matmuls where the user allowed it), each run rounds through TF32's 10-bit mantissa in
    the algorithm cuDNN or cuBLAS picks per call (by alignment, workspace), so two runs part by about 1e-3 a layer
    (Mask R-CNN's masks: 7e-3 to 1e-2 with every op through ATen), and a detector's box count moves with it. Compared
    in exact float32 on both sides, what parts them is the package's own arithmetic, which is what is verified; at
    run time both round through TF32 as torch is set (the package's generated kernels never do)."""
    if device.type != "cuda":
        return None
    kinds = {"conv": torch.backends.cudnn.allow_tf32, "matmul": torch.backends.cuda.matmul.allow_tf32}
    if not any(kinds.get(lookup(node.kind()).tf32) for node in all_nodes(graph.block())):
        return None
    return ("TF32 is on for the model's convolutions or matmuls (torch.backends.cudnn.allow_tf32, "
            "torch.backends.cuda.matmul.allow_tf32), and two runs round through it differently, in the algorithm "
            "cuDNN or cuBLAS picks: verification ran TorchScript and the package with TF32 off, in exact float32, "
            "so what it compares is the package's own arithmetic; at run time both use TF32 as torch is set")


class exact_float32:
    """TF32 off for cuDNN's convolutions and cuBLAS's matmuls within a block, then both put back as they were."""

    def __enter__(self) -> None:
        self.before = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
        torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False

    def __exit__(self, *exc: Any) -> None:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.before


def tensor_error(actual: torch.Tensor, expected: torch.Tensor, slack: float = 1.0,
                 tolerance: Optional[tuple[float, float]] = None) -> tuple[float, str]:
    """(error, what differs): 0 when they agree within the dtype's tolerance (times `slack`), or within
    `tolerance` (relative, absolute: a reduced-precision package's accuracy) where given."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return math.inf, (f"got {actual.dtype} {list(actual.shape)}, TorchScript gives "
                          f"{expected.dtype} {list(expected.shape)}")
    if actual.layout != expected.layout:
        return math.inf, f"got a {actual.layout} tensor, TorchScript gives a {expected.layout} one"
    if expected.layout != torch.strided:  # (a sparse output: its values, as dense)
        actual, expected = actual.to_dense(), expected.to_dense()
    if actual.device != expected.device:
        actual = actual.to(expected.device)
    if expected.is_complex():
        actual, expected = torch.view_as_real(actual), torch.view_as_real(expected)
    if not expected.is_floating_point():
        differ = (actual != expected).float().mean().item() if expected.numel() else 0.0
        return (differ, f"{differ:.2%} of the elements differ") if differ > EXACT_FRACTION else (0.0, "")
    a, e = actual.double(), expected.double()
    if not torch.equal(torch.isnan(a), torch.isnan(e)) or not torch.equal(torch.isposinf(a), torch.isposinf(e)) \
            or not torch.equal(torch.isneginf(a), torch.isneginf(e)):
        return math.inf, "NaN or infinity at different positions"
    finite = torch.isfinite(e)
    if not finite.any():
        return 0.0, ""
    scale = max(e[finite].abs().max().item(), 1e-30)
    largest = (a - e)[finite].abs().max().item()
    name = str(expected.dtype).removeprefix("torch.")
    if tolerance is None:  # (an accuracy asked for is met as asked: no slack for another device's rounding)
        tolerance, floor = RELATIVE_TOLERANCE.get(name, 1e-3) * slack, ABSOLUTE_TOLERANCE.get(name, 1e-5) * slack
    else:
        tolerance, floor = tolerance
    if largest <= tolerance * scale + floor:
        return 0.0, ""
    error = largest / scale
    return error, f"max error {error:.3g} of the largest magnitude (tolerance {tolerance:g})"


def compare(actual: Any, expected: Any, where: str = "output", slack: float = 1.0,
            tolerance: Optional[tuple[float, float]] = None) -> list[Mismatch]:
    """Every place where `actual` differs from TorchScript's `expected` (structure, dtype, shape, values)."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(actual, torch.Tensor):
            return [Mismatch(where, math.inf, f"got {type(actual).__name__}, TorchScript gives a tensor")]
        error, detail = tensor_error(actual, expected, slack, tolerance)
        return [Mismatch(where, error, detail)] if error else []
    if isinstance(expected, (tuple, list)):
        if not isinstance(actual, (tuple, list)) or len(actual) != len(expected) or \
                getattr(type(actual), "_fields", None) != getattr(type(expected), "_fields", None):  # NamedTuples
            return [Mismatch(where, math.inf, f"got {_describe(actual)}, TorchScript gives {_describe(expected)}")]
        return [m for i, (a, e) in enumerate(zip(actual, expected))
                for m in compare(a, e, f"{where}[{i}]", slack, tolerance)]
    if isinstance(expected, dict):
        if not isinstance(actual, dict) or list(actual) != list(expected):
            return [Mismatch(where, math.inf, f"got {_describe(actual)}, TorchScript gives {_describe(expected)}")]
        return [m for k in expected for m in compare(actual[k], expected[k], f"{where}[{k!r}]", slack, tolerance)]
    if isinstance(expected, float) and isinstance(actual, float):
        if math.isclose(actual, expected, rel_tol=1e-6, abs_tol=1e-12) or (math.isnan(actual) and math.isnan(expected)):
            return []
    elif actual == expected and type(actual) is type(expected):
        return []
    return [Mismatch(where, math.inf, f"got {actual!r}, TorchScript gives {expected!r}")]


def _describe(x: Any) -> str:
    if isinstance(x, (tuple, list, dict)):
        return f"a {type(x).__name__} of {len(x)}"
    return type(x).__name__


def _first_line(err: Exception) -> str:
    """The line of an error that says what went wrong: for TorchScript's interpreter, whose first line is always
    "The following operation failed in the TorchScript interpreter.", the last one (the op's own error)."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return ""
    return (lines[-1] if len(lines) > 1 and "failed in the TorchScript interpreter" in lines[0] else lines[0])[:200]


def _with_example_integers(fresh: list, example: list) -> Optional[list]:
    """`fresh` with each integer or bool tensor replaced by the example's rows in a random order: ids, masks and
    boxes whose values hold structure a uniform draw breaks (LayoutLM's boxes need x0 <= x1), still fresh where
    they can be. None when there is no such input to replace."""
    generator = torch.Generator().manual_seed(FRESH_SEED)
    out, replaced = list(fresh), False
    for i, (x, e) in enumerate(zip(fresh, example)):
        if isinstance(x, torch.Tensor) and isinstance(e, torch.Tensor) and not x.dtype.is_floating_point \
                and x.shape == e.shape and e.dim() >= 1 and e.shape[0] > 0:
            out[i] = e.index_select(0, torch.randint(0, e.shape[0], (e.shape[0],), generator=generator)
                                    .to(e.device)).contiguous()
            replaced = True
    return out if replaced else None


def copy_value(value: Any) -> Any:
    """A copy of an input or state value that the model may write in place (a tensor's `add_`, a list's `append`, a
    dict's item) leaving the original as it was: tensors cloned, lists and dicts made anew, other values shared."""
    if isinstance(value, list):
        return [copy_value(v) for v in value]
    if isinstance(value, dict):
        return {k: copy_value(v) for k, v in value.items()}
    return value.detach().clone() if isinstance(value, torch.Tensor) else value


def _copies(inputs: list) -> list:
    return [copy_value(x) for x in inputs]


def run_where_the_weights_are(reference: Callable, inputs: list) -> tuple[Any, bool]:
    """(`reference(*inputs)`, False), or where that fails with GPU inputs, (the outputs of a run on the CPU
    copies, True): a model traced on the CPU and converted for CUDA keeps its weights on the CPU. Runs in
    TorchScript's plain interpreter (see Verifier.run_reference)."""
    with torch.jit.optimized_execution(False):
        try:
            return reference(*inputs), False
        except (ReferenceCrashed, TimeBudgetError):  # (a draw that crashed TorchScript: no second try on the CPU)
            raise
        except Exception:
            on_cpu = [x.cpu() if isinstance(x, torch.Tensor) else x for x in inputs]
            if all(x is y for x, y in zip(on_cpu, inputs)):
                raise
            return reference(*on_cpu), True


class Verifier:
    """The reference side of verification: TorchScript's outputs on the example inputs and on a fresh draw."""

    def __init__(self, reference: Callable, example_inputs: list, signature: list[dict], device: torch.device,
                 sizes: Optional[dict[str, int]] = None, other_sizes: Sequence[tuple[str, list]] = (),
                 extra_draws: Sequence[Sequence] = (), rules: Optional[DrawRules] = None,
                 tf32: Optional[str] = None):
        """`sizes`: the dynamic dims' sizes in the example inputs; `other_sizes`: (name, inputs) at other sizes in
        their ranges, which the package must accept (a refusal there is a failure, not a note); `extra_draws`: the
        user's own input sets (convert's `verify_inputs`); `rules`: where fresh values are valid (draw_rules.py);
        `tf32`: why TF32 would round the model's convolutions or matmuls (tf32_note): both sides then run without it.
        A draw that crashes TorchScript itself (the reference runs it in a child process first) is skipped and
        named in the notes; a crash on the example inputs is a ConversionError."""
        self.rules = rules
        self.reference = reference
        self.slack = 1.0  # 10 when TorchScript runs on another device (a CPU model converted for CUDA: TF32 convs)
        self.tf32 = tf32
        self.tolerance: Optional[tuple[float, float]] = None  # (rtol, atol) of a reduced-precision package
        self.notes: list[str] = [tf32] if tf32 else []
        self.cases: list[tuple[str, list, Any]] = []
        self.must_accept = {name for name, _ in other_sizes}
        self.failed: list[str] = []  # the cases the last check() found mismatches on
        self.failed_inputs: list[list] = []  # the plan's inputs (state included) where they failed
        # (calls, TorchScript's (outputs, state) after each): one sequence, for a model with module state
        self.sequence: Optional[tuple[list, list]] = None
        draws = [("the example inputs", example_inputs)]
        try:
            fresh = random_inputs(signature, device, FRESH_SEED, sizes)
            draws.append(("fresh random inputs", rules.apply(fresh, FRESH_SEED, sizes) if rules else fresh))
        except InputError as err:
            self.notes.append(f"no fresh inputs ({err})")
        draws += list(other_sizes)
        for name, inputs in draws + [(f"your input set {i}", list(x)) for i, x in enumerate(extra_draws, 1)]:
            try:
                expected = self.run_reference(inputs)
            except ReferenceCrashed as crashed:
                if name == "the example inputs":
                    raise ConversionError(
                        f"TorchScript crashed on the example inputs: {crashed}, in a child process that ran them "
                        "for verification. The model itself fails on them: check the example inputs") from None
                self.notes.append(f"{name} crashed TorchScript itself: {crashed}; skipped")
                retried = self.with_example_integers(inputs, example_inputs) if name == "fresh random inputs" \
                    else None
                if retried is None:
                    continue
                name, inputs, expected = retried
            except TimeBudgetError:
                raise
            except Exception as err:  # the model refuses this draw (an assert on its values): nothing to compare
                retried = self.with_example_integers(inputs, example_inputs) if name == "fresh random inputs" \
                    else None
                if retried is None:
                    self.notes.append(f"TorchScript raised on {name} ({type(err).__name__}: {_first_line(err)}); "
                                      "not compared")
                    continue
                name, inputs, expected = retried
            if name == "the example inputs" and compare(self.run_reference(inputs), expected):
                self.notes.append("the model's outputs vary between calls on the same inputs (random ops): "
                                  "outputs not compared")
                self.cases = []
                return
            self.cases.append((name, _copies(inputs), expected))  # (shape inference may write the inputs)
        if hasattr(reference, "sequence") and self.cases:
            self.sequence = self.sequence_of_calls(signature, device, sizes, example_inputs)

    def sequence_of_calls(self, signature: list[dict], device: torch.device, sizes: Optional[dict[str, int]],
                          example: list) -> Optional[tuple[list, list]]:
        """SEQUENCE_CALLS calls (the example, then fresh draws) and TorchScript's outputs and written state after each,
        run one after another from the saved state; None where TorchScript refuses them."""
        calls = [_copies(example)]
        for i in range(1, SEQUENCE_CALLS):
            try:
                drawn = random_inputs(signature, device, FRESH_SEED + i, sizes)
                drawn = self.rules.apply(drawn, FRESH_SEED + i, sizes) if self.rules else drawn
            except InputError:
                drawn = example
            calls.append(drawn)
        for attempt in (calls, [calls[0]] + [_with_example_integers(c, example) or c for c in calls[1:]]):
            try:
                with torch.jit.optimized_execution(False), self.exact():
                    expected = self.reference.sequence([_copies(c) for c in attempt])
            except TimeBudgetError:
                raise
            except ReferenceCrashed as crashed:
                refused = f"a sequence of calls crashed TorchScript itself ({crashed})"
                continue
            except Exception as err:  # noqa: BLE001 - the model refuses a call of the sequence (an assert on state)
                refused = f"TorchScript raised on a sequence of calls ({type(err).__name__}: {_first_line(err)})"
                continue
            return [_copies(c) for c in attempt], expected
        self.notes.append(f"{refused}; calls after the first not compared")
        return None

    def with_example_integers(self, fresh: list, example: list) -> Optional[tuple[str, list, Any]]:
        """(name, inputs, TorchScript's outputs) for `fresh` with its integer inputs taken from the example's rows,
        or None when there are none to take or TorchScript refuses those too."""
        inputs = _with_example_integers(fresh, example)
        if inputs is None:
            return None
        try:
            return "fresh random inputs (integer inputs: the example's rows)", inputs, self.run_reference(inputs)
        except TimeBudgetError:
            raise
        except Exception:  # noqa: BLE001 - the model refuses them as well, or crashes: the caller notes the first
            return None

    def run_reference(self, inputs: list) -> Any:
        """TorchScript's outputs on `inputs`, on the device the model's weights live on: a model traced on the CPU
        and converted for CUDA runs there (its outputs are compared on the CPU).

        The reference runs in TorchScript's plain interpreter, without its graph optimizations: on CUDA, from the
        second call, the profiling executor hands fusion groups to its fuser, which compiled a DenseNet-121's
        for over six minutes; the model's semantics are the interpreter's, and the reference is only run a few
        times."""
        with self.exact():
            result, on_cpu = run_where_the_weights_are(self.reference, _copies(inputs))
        if on_cpu:
            self.slack = CROSS_DEVICE_SLACK
        return result

    def check(self, run: Callable) -> list[Mismatch]:
        """Mismatches of `run` (a loaded package) against TorchScript, over every case and, for a model with state,
        over a sequence of calls; `failed` names the cases they came from, `failed_inputs` the plan's inputs there."""
        with self.exact():
            found = self.check_cases(run)
            self.failed_inputs = [getattr(run, "plan_inputs", list)(inputs) for name, inputs, _ in self.cases
                                  if name in self.failed]
            if self.sequence is not None and hasattr(run, "sequence") and not found:
                found += self.check_sequence(run)
        return found

    def exact(self) -> Any:
        """The block in which TorchScript and the package are run and compared: without TF32 where it would round
        the model's convolutions or matmuls (tf32_note), so both sides round alike."""
        return exact_float32() if self.tf32 else contextlib.nullcontext()

    def drop_unsteady(self, runs: int = 2) -> list[str]:
        """The failed cases on which TorchScript itself gives other outputs when run again on the same inputs (on
        the GPU, a top-k or sort among tied scores, or atomics, and a detector's box count moves between runs):
        taken out of the cases and named in the notes; -> their names. No package can be held to an answer
        TorchScript does not give twice, and failing there cost kernels, or the conversion, for nothing."""
        unsteady = []
        for name, inputs, expected in self.cases:
            if name not in self.failed:
                continue
            for _ in range(runs):
                try:
                    again = self.run_reference(inputs)
                except TimeBudgetError:
                    raise
                except Exception:  # noqa: BLE001 - a run that raises says nothing of the outputs
                    continue
                if compare(again, expected, slack=self.slack, tolerance=self.tolerance):
                    unsteady.append(name)
                    break
        if unsteady:
            self.cases = [case for case in self.cases if case[0] not in unsteady]
            self.failed = [name for name in self.failed if name not in unsteady]
            self.notes.append(f"TorchScript's own outputs on {', '.join(unsteady)} differ between runs on the same "
                              "inputs (on the GPU: a top-k or sort among tied values, atomics): not compared there")
        return unsteady

    def check_sequence(self, run: Callable) -> list[Mismatch]:
        """Mismatches over the sequence of calls, up to the first call that differs: its outputs or the state it
        leaves (the state it started from matched)."""
        calls, expected = self.sequence
        try:
            actual = run.sequence([_copies(c) for c in calls])
        except Jit2TritonError as err:
            actual = err
        for number, (inputs, want) in enumerate(zip(calls, expected), 1):
            where = f"call {number} of a sequence of {len(calls)}"
            if isinstance(actual, Exception):
                found = [Mismatch(f"on {where}", math.inf, f"the package raised {type(actual).__name__}: {actual}")]
            else:
                got, state_before = actual[number - 1]
                found = [Mismatch(f"{m.where} on {where}", m.error, m.detail)
                         for m in compare(got, want, slack=self.slack, tolerance=self.tolerance)]
            if found:
                self.failed.append(where)
                if not isinstance(actual, Exception) and state_before is not None:
                    self.failed_inputs.append(list(inputs) + state_before)
                return found
        return []

    def check_cases(self, run: Callable) -> list[Mismatch]:
        found: list[Mismatch] = []
        self.failed = []
        for name, inputs, expected in self.cases:
            before = len(found)
            try:
                actual = run(*_copies(inputs))
            except SizeChangedError as err:  # inputs that fit the signature met a size the package fixed: a bug
                actual = err
            except InputError as err:  # the draw changed a shape the package is specialised to: a refusal, not a bug
                if name != "the example inputs" and name not in self.must_accept:
                    self.notes.append(f"the package refused {name}: {err}")
                    continue
                actual = err
            except Jit2TritonError as err:
                actual = err
            if isinstance(actual, Exception):
                found.append(Mismatch(f"on {name}", math.inf, f"the package raised {type(actual).__name__}: {actual}"))
                self.failed.append(name)
                continue
            found += [Mismatch(f"{m.where} on {name}", m.error, m.detail)
                      for m in compare(actual, expected, slack=self.slack, tolerance=self.tolerance)]
            if len(found) > before:
                self.failed.append(name)
        return found

    @property
    def compared(self) -> int:
        return len(self.cases)


class PackageRunner:
    """The package as a user runs it: saved, and loaded by the C++ runtime, the runtime of record (what
    `jit2triton.load` runs), under a folder of its own (`close` removes it). A model with module state runs each
    case, and each sequence of calls, from the saved state (a fresh load: milliseconds) and gives the state it
    wrote beside its outputs, as the reference does. Raises ConversionError where the C++ runtime cannot be had."""

    def __init__(self, contents, device: torch.device) -> None:
        from jit2triton.deploy import cpp_runtime
        from jit2triton.deploy.package import save_package

        why = cpp_runtime.unavailable()
        if why is not None:
            raise ConversionError(f"conversion verifies the package in the C++ runtime that runs it, which cannot be "
                                  f"built here: {why}")
        self.folder = tempfile.mkdtemp(prefix="jit2triton-verify-")
        self.path = os.path.join(self.folder, "verified.j2t")
        self.device = device
        entries = contents.manifest.get("state") or []
        self.names = [e["name"] for e in entries]
        self.compared = [e["name"] for e in entries if e["written"] is True and e.get("compared", True)]
        self._observing = None  # (a load of its own for the culprit search, without CUDA graphs: made when asked)
        self._saved_state: Optional[list] = None
        save_package(contents, self.path)
        try:
            self.module = cpp_runtime.CppRuntime(self.path, device)
        except PackageError as err:
            self.close()
            raise ConversionError(f"the C++ runtime refused the package conversion built ({err}); this is a bug in "
                                  "jit2triton, please report it") from None

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> "PackageRunner":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def fresh(self):
        """The package from its saved state: a new load for a model with state."""
        from jit2triton.deploy.cpp_runtime import CppRuntime
        return CppRuntime(self.path, self.device) if self.names else self.module

    def __call__(self, *inputs: Any) -> Any:
        module = self.fresh()
        output = module(*inputs)
        return output if not self.names else (output, self.written(module))

    def written(self, module) -> dict[str, Any]:
        """The state the last call wrote that verification compares with TorchScript's, by name (not objects the
        model made, which TorchScript cannot hand to Python: deploy/format.py's STATE)."""
        return {name: module.attribute(name) for name in self.compared}

    def sequence(self, calls: list[list]) -> list[tuple]:
        """(outputs, written state, the state the call started from) per call, from the saved state."""
        module, results = self.fresh(), []
        for inputs in calls:
            before = self.state_of(module)
            output = module(*inputs)
            results.append(((output, self.written(module)), before))
        return results

    def plan_inputs(self, inputs: list) -> list:
        """The plan's inputs for a call from the saved state: the model's, then the state (the culprit search runs
        the plan on them)."""
        if self.names and self._saved_state is None:
            self._saved_state = self.state_of(self.fresh()) or []
        return list(inputs) + [copy_value(v) for v in self._saved_state or []]

    def observe(self, plan_inputs: list, per_node: int) -> list:
        """[(node, outputs)] of every step the package runs on `plan_inputs` (the model's, then its state's values),
        in the order made: the culprit search (deploy/packaging/culprit.py). A load of its own, without CUDA graphs,
        so every step runs as a step, made once."""
        if self._observing is None:  # (observe runs the plan on the state given: one load serves every case)
            from jit2triton.deploy.cpp_runtime import CppRuntime
            self._observing = CppRuntime(self.path, self.device, cuda_graphs=False).module
        return self._observing.observe(list(plan_inputs), per_node)

    def state_of(self, module) -> Optional[list]:
        """The state `module` holds, in the plan's order; None where a value cannot be handed to Python."""
        try:
            return [module.attribute(name) for name in self.names]
        except (Jit2TritonError, RuntimeError, TypeError):
            return None
