"""What a conversion leaves out when part of it fails: one ladder, in one order, written once.

Every model converts, and a bug in jit2triton costs speed, never the conversion nor a wrong answer. When a stage
fails, the conversion steps down this ladder, each rung giving up more speed than the one above, and builds again:

  1. optional rewrites off: a rewrite that only makes the graph faster (pipeline.OPTIONAL_REWRITES) raises an
     internal error: the graph is prepared again from TorchScript's, without it; the example, which ran when the
     graph was first typed, fails when typed again after them (PassFailed.after_rewrites): without all of them;
  2. kernels out one by one: a kernel fails to build (fuse.FusionFailed), or to render or compile while the others
     do (GenerationFailed: at most MAX_GENERATION_ROUNDS builds, each taking out every kernel that failed alone), or
     verification finds the first kernel that differs from ATen (deploy/packaging/culprit.py): its nodes run
     through ATen, and the package is built again; where verification names no kernel, or finds the outputs parted
     where rounding met a discontinuous op (a threshold, a top-k, NMS: another box), the ops whose kernels round
     their own way on the device (the op table's `rounds_own_way`: float sums, some math functions) go to ATen
     first, once, and the kernels that round as ATen does stay (and they come back where the outputs still part
     only where rounding decided: they bought no answer); where that does not settle it, the rewrites that change
     how convolutions and GEMMs round go (pipeline's ROUNDING_REWRITES), kernels kept;
  3. the region that disagrees out: verification fails and the culprit search names no kernel; the kernels are
     bisected in the order the plan runs them (keep the first half, verify, recurse) to the first one the package
     cannot keep, which is taken out as in rung 2 and the rest verified again; the search is bounded
     (MAX_BISECT_ROUNDS), and where it runs out only the kernels not yet seen to match go out. Every kernel goes
     out only where fusion keeps failing, the search has no rounds left to start, or MAX_VERIFY_ROUNDS
     verifications failed with kernels in;
  4. the ATen graph: a pass that kernels need fails, or the rewritten graph disagrees with TorchScript even with
     every kernel out (so a rewrite is wrong): first the optional rewrites go, kernels back in (a scripted SSD on
     CUDA failed after the rewrites with no kernel to blame), then the rest: TorchScript's graph as written, every
     op through ATen;
  5. refused: TorchScript's graph through ATen fails or disagrees: a ConversionError asking for a bug report
     (a Mismatch, after which a model torch.jit.freeze folded is converted once more unfolded: conversion.py).

The stages themselves (prepare, build, check) are the caller's; this module knows only what each failure means.
(Before any of this, `dynamic_shapes="auto"` converts static where the model specialises on its batch size:
jit2triton/conversion.py. That is a property of the model, not a failure to fall back from.)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol

from jit2triton.errors import ConversionError

from .ir import Attr
from .op_table import lookup
from .fuse import FusionFailed
from .pipeline import OPTIONAL_REWRITES, ROUNDING_REWRITES, PassFailed

MAX_VERIFY_ROUNDS = 16  # failed verifications with kernels in before every kernel goes out (each takes one out)
MAX_BISECT_ROUNDS = 24  # verifications the bisection (rung 3) may spend in all: a few culprits in a 600-kernel model
MAX_FUSION_FAILURES = 64  # kernels that fail to build before fusion is given up (every kernel out)
MAX_GENERATION_ROUNDS = 3  # builds with kernels that failed to render or compile before every kernel goes out
REPORT = "please report it with the model"


class GenerationFailed(FusionFailed):
    """Some of a build's kernels failed to render or to compile while the others did (a renderer bug): `reasons` maps
    each of their nodes' uids to why, naming its kernel; `reason` names them all, for the report."""

    def __init__(self, nodes: list, reasons: dict[int, str], reason: str) -> None:
        super().__init__(nodes, reason)
        self.reasons = reasons


class Mismatch(ConversionError):
    """The ladder's end: the package does not match TorchScript even through ATen. Where the graph was folded by
    torch.jit.freeze, the caller converts it again unfolded (jit2triton/conversion.py)."""


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
    generation_rounds: int = 0
    verify_rounds: int = 0
    kernels_given_up: bool = False  # verification failed MAX_VERIFY_ROUNDS times with kernels in: none come back
    bisection: Optional["Bisection"] = None  # rung 3's search, while it runs
    bisect_rounds: int = 0
    trusted: set[int] = field(default_factory=set)  # node uids whose kernels were kept in a build that matched
    own_way: set[int] = field(default_factory=set)  # node uids rung 2 sent to ATen as rounding their own way
    own_way_back: bool = False  # ... put back: without them the outputs still parted where rounding decided


@dataclass
class Bisection:
    """Rung 3's search over `kernels` (the kernel nodes of a build that failed with none to blame, in the order the
    plan runs them): keeping the first `good` (the rest through ATen) matched TorchScript (or, while `proven` is
    false for good == 0, is assumed to), keeping the first `bad` did not. Each round keeps the first `trying`."""
    kernels: list
    good: int
    bad: int
    worst: float  # the failed build's largest mismatch, for the report
    trying: int = 0
    proven: bool = False
    out: set[int] = field(default_factory=set)  # the uids the round under way sends through ATen


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
    kernels: list = field(default_factory=list)  # its kernel nodes in the order the plan runs them (for rung 3)
    device_type: str = ""  # where its kernels run: which of their ops round their own way (rung 2)
    # whether the build has a discontinuous op (a comparison, a floor, a sort, NMS), so that a last bit may have
    # become another answer: then the ops whose kernels round their own way go first (rung 2)
    discontinuous: bool = False
    rounding: bool = False  # passed, but the outputs differ where a discontinuous op met rounding


def rounding_their_own_way(kernels: list, device_type: str) -> list:
    """The nodes fused into `kernels` whose kernels do not round as ATen's on `device_type` (the op table)."""
    return [n for k in kernels for n in k.attrs[Attr.FUSED] if device_type in lookup(n.op).rounds_own_way]


def has_discontinuous_op(nodes: list) -> bool:
    """Whether a build's nodes (kernel nodes by what they fuse) include an op the op table calls discontinuous."""
    return any(lookup(f.op).discontinuous for n in nodes for f in n.attrs.get(Attr.FUSED, [n]))


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
        if attempt.bisection is not None:
            if _bisection_round(attempt, verdict, say):
                prepared = None
            continue
        if verdict.passed and verdict.rounding and attempt.own_way and not attempt.own_way_back:
            _put_back_own_rounding(attempt, say)
            continue
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
    elif failure.after_rewrites and not OPTIONAL_REWRITES <= attempt.skipped:
        attempt.skipped |= OPTIONAL_REWRITES
        _note(attempt, f"{failure}, after the optional rewrites: converted without them ({REPORT})", say)
    else:
        attempt.kernels = attempt.rewrites = False
        _note(attempt, f"{failure}: every op runs through ATen ({REPORT})", say)


def _fusion_failed(attempt: Attempt, failure: FusionFailed, say: Callable[[str], None]) -> None:
    """Rung 2: the nodes of the kernels that failed to build; every kernel out when it names none not already out,
    or past the bounds."""
    fresh = [n for n in failure.nodes if n.uid not in attempt.refused]
    attempt.fusion_failures += 1
    if isinstance(failure, GenerationFailed):
        attempt.generation_rounds += 1
        if fresh and attempt.generation_rounds <= MAX_GENERATION_ROUNDS:
            attempt.refused.update((node.uid, failure.reasons[node.uid]) for node in fresh)
            _note(attempt, f"{failure.reason}: their ops run through ATen, the other kernels stay ({REPORT})", say)
            return
    elif fresh and attempt.fusion_failures < MAX_FUSION_FAILURES:
        attempt.refused.update((node.uid, failure.reason) for node in fresh)
        return
    attempt.kernels = False
    _note(attempt, f"generating kernels failed ({failure.reason}); every op runs through ATen", say)


def _verification_failed(attempt: Attempt, verdict: Verdict, say: Callable[[str], None]) -> bool:
    """Rung 2 for a kernel to blame, else 3, else 4, else refused -> whether the graph must be prepared again."""
    attempt.verify_rounds += 1
    if attempt.verify_rounds >= MAX_VERIFY_ROUNDS and attempt.kernels:  # the bound: the rungs below, not a refusal
        attempt.kernels, attempt.kernels_given_up, attempt.verify_rounds = False, True, 0
        _note(attempt, f"verification still failed after taking {len(attempt.removed)} kernels out; every op runs "
                       f"through ATen ({REPORT})", say)
        return False
    if attempt.verify_rounds >= MAX_VERIFY_ROUNDS:
        raise Mismatch(f"verification still failed after {MAX_VERIFY_ROUNDS} rounds; please report it, or convert "
                       "with backend='aten'")
    if verdict.kernel is not None and _take_out_own_rounding(attempt, verdict, [verdict.kernel], say):
        return False  # (the kernel's other ops stay fused; blamed again without them, it goes out whole)
    if verdict.kernel is not None:
        kernel = verdict.kernel.attrs[Attr.KERNEL]
        why = f"verification: max rel. error {verdict.error:.3g} against ATen (kernel {kernel.name})"
        say(f"taking kernel {kernel.name} out: {why}")
        fused = verdict.kernel.attrs[Attr.FUSED]
        attempt.removed.append({"kernel": kernel.name, "error": verdict.error, "ops": [n.op for n in fused]})
        attempt.refused.update((node.uid, why) for node in fused)
        _take_out_siblings(attempt, verdict, [n.op for n in fused], kernel.name, say)
        return False
    if _take_out_own_rounding(attempt, verdict, verdict.kernels, say):
        return False
    if verdict.discontinuous and verdict.has_kernels and attempt.rewrites and not ROUNDING_REWRITES <= attempt.skipped:
        # the kernels round as ATen does: what is left to round otherwise are the rewrites that run convolutions
        # and GEMMs in another algorithm, layout or form (a detector on the CPU kept 191 kernel nodes this way,
        # where the bisection after it had sent every kernel out before the rewrites went); the others (sizes bound
        # at run time, shape arithmetic folded) round nothing, and stay
        attempt.skipped |= ROUNDING_REWRITES
        attempt.trusted.clear()
        _note(attempt, "the outputs, which depend discretely on the model's values, differed from TorchScript's with "
                       f"no kernel to blame ({verdict.mismatches}): converted without the rewrites that round "
                       "convolutions and GEMMs their own way (another algorithm, layout or form), kernels kept", say)
        return True
    if verdict.has_kernels and verdict.kernels and attempt.bisect_rounds < MAX_BISECT_ROUNDS:
        _start_bisection(attempt, verdict, say)
        return False
    if verdict.has_kernels:
        say("no single kernel is to blame: every op runs through ATen instead")
        attempt.removed.append({"kernel": "*", "error": verdict.worst, "ops": []})
        attempt.kernels = False
        return False
    if attempt.rewrites and not OPTIONAL_REWRITES <= attempt.skipped:  # a rewrite is wrong: an optional one?
        attempt.skipped |= OPTIONAL_REWRITES
        attempt.kernels = (attempt.fusion_failures < MAX_FUSION_FAILURES
                           and attempt.generation_rounds <= MAX_GENERATION_ROUNDS and not attempt.kernels_given_up)
        attempt.removed = [r for r in attempt.removed if r["kernel"] != "*"]
        attempt.trusted.clear()
        _note(attempt, f"the rewritten model does not match TorchScript ({verdict.mismatches}) with every kernel "
                       f"out: converted without the optional rewrites ({', '.join(sorted(OPTIONAL_REWRITES))}; "
                       f"{REPORT})", say)
        return True
    if attempt.rewrites:  # the rewritten graph, every op through ATen, disagrees: a rewrite is wrong
        attempt.rewrites, attempt.removed, attempt.verify_rounds = False, [], 0
        _note(attempt, f"the rewritten model does not match TorchScript ({verdict.mismatches}); every op runs "
                       f"through ATen as TorchScript wrote it ({REPORT})", say)
        return True
    raise Mismatch(f"the converted model does not match TorchScript ({verdict.mismatches}); this is a bug in "
                   f"jit2triton: {REPORT}")


def _take_out_own_rounding(attempt: Attempt, verdict: Verdict, kernels: list, say: Callable[[str], None]) -> bool:
    """Rung 2's first step where rounding may explain the difference: the ops of `kernels` whose kernels round their
    own way on the device go to ATen, once, and the ops around them stay in kernels. A threshold, a floor or NMS
    after a float sum turns its last bit into another answer, so only kernels that round as ATen does keep the
    model's answers. -> whether any went."""
    if not verdict.discontinuous or attempt.own_way_back:  # (without one, a difference beyond rounding is a wrong
        return False                                          # kernel: rungs 2 and 3)
    nodes = [n for n in rounding_their_own_way(kernels, verdict.device_type) if n.uid not in attempt.refused]
    if not nodes:
        return False
    ops = sorted({n.op for n in nodes})
    why = (f"verification: its kernel does not round as ATen's does on {verdict.device_type}, and the package "
           "differed from TorchScript; the ops that round as ATen does stay in kernels")
    say(f"taking {', '.join(ops)} out of the kernels (they round their own way), keeping the rest")
    attempt.removed.append({"kernel": "rounds its own way", "error": verdict.error or verdict.worst, "ops": ops})
    attempt.refused.update((n.uid, why) for n in nodes)
    attempt.own_way.update(n.uid for n in nodes)
    return True


def _put_back_own_rounding(attempt: Attempt, say: Callable[[str], None]) -> None:
    """The build passed with its outputs still parted where rounding decided, the ops that round their own way out:
    taking them out bought no answer, so they go back into kernels (the next build passes as the first did)."""
    for uid in attempt.own_way:
        attempt.refused.pop(uid, None)
    attempt.removed = [r for r in attempt.removed if r["kernel"] != "rounds its own way"]
    attempt.own_way_back = True
    say("without the ops that round their own way the outputs still differ where rounding decided: they go back "
        "into kernels")


def _take_out_siblings(attempt: Attempt, verdict: Verdict, ops: list[str], name: str,
                       say: Callable[[str], None]) -> None:
    """The kernels of the build that fuse the same ops as the one taken out go with it: they compute the same
    function elsewhere in the model, and the rounds after would find them one by one (a detector's fourteen
    BatchNorm+ReLU kernels, each flipping a box by rounding, took all 16 verification rounds, and then every kernel
    went out)."""
    why = f"verification: fuses the same ops as kernel {name}, which differed from ATen"
    for node in verdict.kernels or []:
        fused = node.attrs[Attr.FUSED]
        if [n.op for n in fused] != ops or all(n.uid in attempt.refused for n in fused):
            continue
        say(f"taking kernel {node.attrs[Attr.KERNEL].name} out with it: {why}")
        attempt.removed.append({"kernel": node.attrs[Attr.KERNEL].name, "error": verdict.error, "ops": ops,
                                "with": name})
        attempt.refused.update((n.uid, why) for n in fused)


def _start_bisection(attempt: Attempt, verdict: Verdict, say: Callable[[str], None]) -> None:
    """Rung 3: search the failed build's kernels for the first the package cannot keep; kernels whose nodes were all
    kept in a build that matched lead the order as known good (the search after a culprit resumes past them)."""
    kernels = verdict.kernels
    good = 0
    while good < len(kernels) and all(n.uid in attempt.trusted for n in kernels[good].attrs[Attr.FUSED]):
        good += 1
    if good == len(kernels):  # kept together they differ, each kept in a build that matched: search them all
        good = 0
        attempt.trusted.clear()
    say(f"no single kernel is to blame: bisecting the {len(kernels)} kernels for the region that differs")
    attempt.bisection = Bisection(list(kernels), good, len(kernels), verdict.worst, proven=good > 0)
    _next_trial(attempt)


def _bisection_round(attempt: Attempt, verdict: Verdict, say: Callable[[str], None]) -> bool:
    """Record the round's verdict and start the next round, or end the search -> whether the graph must be prepared
    again (the search found that the rewritten graph itself disagrees: rung 4)."""
    search = attempt.bisection
    attempt.bisect_rounds += 1
    if verdict.passed:
        search.good, search.proven = search.trying, True
        attempt.trusted.update(n.uid for k in search.kernels[:search.good] for n in k.attrs[Attr.FUSED])
    elif search.trying == 0:  # every kernel out and still different: no kernel is to blame
        _end_trial(attempt)
        attempt.bisection, attempt.kernels = None, False
        return _verification_failed(attempt, Verdict(False, worst=verdict.worst, mismatches=verdict.mismatches),
                                    say)
    else:
        search.bad = search.trying
    if search.bad - search.good == 1 and search.proven:
        _take_out_culprit(attempt, search, say)
    elif attempt.bisect_rounds >= MAX_BISECT_ROUNDS:
        _take_out_unsettled(attempt, search, say)
    else:
        _next_trial(attempt)
    return False


def _next_trial(attempt: Attempt) -> None:
    """The next round keeps the first half-way kernels (all but the first unproven: every kernel out, to prove
    that the search can end)."""
    search = attempt.bisection
    search.trying = (search.good + search.bad) // 2 if search.bad - search.good > 1 else 0
    _end_trial(attempt)
    why = "verification: out while bisecting for the kernel that differs"
    search.out = {n.uid for k in search.kernels[search.trying:] for n in k.attrs[Attr.FUSED]} - set(attempt.refused)
    attempt.refused.update((uid, why) for uid in search.out)


def _end_trial(attempt: Attempt) -> None:
    for uid in attempt.bisection.out:
        attempt.refused.pop(uid, None)
    attempt.bisection.out = set()


def _take_out_culprit(attempt: Attempt, search: Bisection, say: Callable[[str], None]) -> None:
    """The first kernel the package cannot keep: out as in rung 2; the rest are built and verified again."""
    _end_trial(attempt)
    attempt.bisection = None
    kernel_node = search.kernels[search.good]
    kernel, fused = kernel_node.attrs[Attr.KERNEL], kernel_node.attrs[Attr.FUSED]
    why = (f"verification: the package differed from TorchScript (max rel. error {search.worst:.3g}) with kernel "
           f"{kernel.name} and the kernels before it, and matched without it (found by bisection)")
    say(f"taking kernel {kernel.name} out: {why}")
    attempt.removed.append({"kernel": kernel.name, "error": search.worst, "ops": [n.op for n in fused]})
    attempt.notes.append(f"kernel {kernel.name} taken out: {why}")
    attempt.refused.update((node.uid, why) for node in fused)


def _take_out_unsettled(attempt: Attempt, search: Bisection, say: Callable[[str], None]) -> None:
    """The search's rounds are spent: every kernel not yet seen to match goes out; the first `good` stay."""
    _end_trial(attempt)
    attempt.bisection = None
    unsettled = search.kernels[search.good:]
    why = (f"verification: the package differed from TorchScript (max rel. error {search.worst:.3g}) and "
           f"{MAX_BISECT_ROUNDS} rounds of bisection did not settle which of these kernels is to blame")
    _note(attempt, f"{len(unsettled)} kernels taken out, {search.good} kept: {why}", say)
    for kernel_node in unsettled:
        fused = kernel_node.attrs[Attr.FUSED]
        attempt.removed.append({"kernel": kernel_node.attrs[Attr.KERNEL].name, "error": search.worst,
                                "ops": [n.op for n in fused]})
        attempt.refused.update((node.uid, why) for node in fused)


def _note(attempt: Attempt, note: str, say: Callable[[str], None]) -> None:
    attempt.notes.append(note)
    say(note)
