"""What a conversion leaves out when part of it fails: one ladder, in one order, written once.

Every model converts, and a bug in jit2triton costs speed, never the conversion nor a wrong answer. When a stage
fails, the conversion steps down this ladder, each rung giving up more speed than the one above, and builds again:

  1. optional rewrites off: a rewrite that only makes the graph faster (pipeline.OPTIONAL_REWRITES) raises an
     internal error: the graph is prepared again from TorchScript's, without it;
  2. kernels out one by one: a kernel fails to build (fuse.FusionFailed), or verification finds the first kernel
     that differs from ATen (deploy/culprit.py): its nodes run through ATen, and the package is built again;
  3. every kernel out: verification fails and no single kernel is to blame, or fusion keeps failing: every op of
     the rewritten graph runs through ATen;
  4. the ATen graph: a pass that kernels need fails, or the rewritten graph disagrees with TorchScript even with
     every op through ATen (so a rewrite is wrong): TorchScript's graph as written, every op through ATen;
  5. refused: TorchScript's graph through ATen fails or disagrees: a ConversionError asking for a bug report.

The stages themselves (prepare, build, check) are the caller's; this module knows only what each failure means.
(Before any of this, `dynamic_shapes="auto"` converts static where the model specialises on its batch size:
jit2triton/conversion.py. That is a property of the model, not a failure to fall back from.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

from jit2triton.errors import ConversionError

from .ir import Attr
from .fuse import FusionFailed
from .pipeline import OPTIONAL_REWRITES, PassFailed

MAX_VERIFY_ROUNDS = 16  # failed verifications before the conversion is refused (each takes a kernel out)
MAX_FUSION_FAILURES = 64  # kernels that fail to build before fusion is given up (every kernel out)
REPORT = "please report it with the model"


@dataclass
class Attempt:
    """Where on the ladder the next build stands: what it leaves out, and the report of every step down so far."""
    kernels: bool = True  # generate kernels (rungs 1-2); else every op runs through ATen (3-4)
    rewrites: bool = True  # run the rewrites before fusion (1-3); else TorchScript's graph as written (4)
    skipped: set[str] = field(default_factory=set)  # optional rewrites left out (1)
    refused: dict[int, str] = field(default_factory=dict)  # node uid -> why it runs through ATen (2)
    removed: list[dict[str, Any]] = field(default_factory=list)  # kernels verification took out (2, 3)
    notes: list[str] = field(default_factory=list)  # why each step down was taken, for the report
    fusion_failures: int = 0
    verify_rounds: int = 0


@dataclass
class Verdict:
    """What verifying a build found: `passed`, or the kernel node to take out (`kernel`, with its `fused` nodes and
    `error` against ATen), or neither (`worst`: the largest mismatch; `mismatches`: the first few, for a message)."""
    passed: bool
    kernel: Any = None
    error: float = 0.0
    worst: float = 0.0
    mismatches: str = ""
    has_kernels: bool = False  # whether the build it checked ran any generated kernel


class Stages(Protocol):
    def prepare(self, attempt: Attempt) -> Any:
        """The graph typed and, with `attempt.rewrites`, rewritten but for `attempt.skipped` (raises PassFailed)."""

    def build(self, prepared: Any, attempt: Attempt) -> Any:
        """The package, with kernels where `attempt.kernels` and `attempt.refused` allow (raises FusionFailed)."""

    def check(self, built: Any) -> Verdict:
        """The package verified against TorchScript."""


def build_with_fallbacks(stages: Stages, attempt: Attempt, say: Callable[[str], None]) -> tuple[Any, Attempt]:
    """Prepare, build and check, stepping down the ladder after each failure -> (the build that passed, the
    attempt that made it)."""
    prepared = None
    while True:
        if prepared is None:
            try:
                prepared = stages.prepare(attempt)
            except PassFailed as failure:
                _pass_failed(attempt, failure, say)
                continue
        try:
            built = stages.build(prepared, attempt)
        except FusionFailed as failure:
            _fusion_failed(attempt, failure, say)
            continue
        verdict = stages.check(built)
        if verdict.passed:
            return built, attempt
        if _verification_failed(attempt, verdict, say):
            prepared = None


def _pass_failed(attempt: Attempt, failure: PassFailed, say: Callable[[str], None]) -> None:
    """Rung 1 for an optional rewrite, else rung 4; refused where that graph's own passes fail."""
    if not attempt.rewrites:
        raise ConversionError(f"{failure}; this is a bug in jit2triton: {REPORT}") from None
    if failure.name in OPTIONAL_REWRITES and failure.name not in attempt.skipped:
        attempt.skipped.add(failure.name)
        _note(attempt, f"{failure}: converted without it ({REPORT})", say)
    else:
        attempt.kernels = attempt.rewrites = False
        _note(attempt, f"{failure}: every op runs through ATen ({REPORT})", say)


def _fusion_failed(attempt: Attempt, failure: FusionFailed, say: Callable[[str], None]) -> None:
    """Rung 2: the nodes of the kernel that failed to build; rung 3 when it names none not already out."""
    fresh = [n for n in failure.nodes if n.uid not in attempt.refused]
    attempt.fusion_failures += 1
    if fresh and attempt.fusion_failures < MAX_FUSION_FAILURES:
        attempt.refused.update((node.uid, failure.reason) for node in fresh)
        return
    attempt.kernels = False
    _note(attempt, f"generating kernels failed ({failure.reason}); every op runs through ATen", say)


def _verification_failed(attempt: Attempt, verdict: Verdict, say: Callable[[str], None]) -> bool:
    """Rung 2 for a kernel to blame, else 3, else 4, else refused -> whether the graph must be prepared again."""
    attempt.verify_rounds += 1
    if attempt.verify_rounds >= MAX_VERIFY_ROUNDS:
        raise ConversionError(f"verification still failed after taking {len(attempt.removed)} kernels out; please "
                              "report it, or convert with backend='aten'")
    if verdict.kernel is not None:
        kernel = verdict.kernel.attrs[Attr.KERNEL]
        why = f"verification: max rel. error {verdict.error:.3g} against ATen (kernel {kernel.name})"
        say(f"taking kernel {kernel.name} out: {why}")
        fused = verdict.kernel.attrs[Attr.FUSED]
        attempt.removed.append({"kernel": kernel.name, "error": verdict.error, "ops": [n.op for n in fused]})
        attempt.refused.update((node.uid, why) for node in fused)
        return False
    if verdict.has_kernels:
        say("no single kernel is to blame: every op runs through ATen instead")
        attempt.removed.append({"kernel": "*", "error": verdict.worst, "ops": []})
        attempt.kernels = False
        return False
    if attempt.rewrites:  # the rewritten graph, every op through ATen, disagrees: a rewrite is wrong
        attempt.rewrites, attempt.removed, attempt.verify_rounds = False, [], 0
        _note(attempt, f"the rewritten model does not match TorchScript ({verdict.mismatches}); every op runs "
                       f"through ATen as TorchScript wrote it ({REPORT})", say)
        return True
    raise ConversionError(f"the converted model does not match TorchScript ({verdict.mismatches}); this is a bug "
                          f"in jit2triton: {REPORT}")


def _note(attempt: Attempt, note: str, say: Callable[[str], None]) -> None:
    attempt.notes.append(note)
    say(note)
