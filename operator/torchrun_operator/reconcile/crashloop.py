"""Crash loops: an attempt that fails like the one before it, and got no further.

A gang restart costs a rendezvous and a checkpoint load; when the failure is deterministic (a
bad batch at step 1200, a segfault in a kernel, an OOM while loading), every restart fails the
same way at the same place and `failurePolicy.maxRestarts` is spent for nothing. So each gang
restart records the failed attempt's last step and a signature of its root cause, and the next
attempt that fails with the same signature and made no progress ends the job
(`CrashLoopNoProgress`).

Progress is judged per attempt, from the step it started at (a restart resumes from its last
checkpoint, behind where the attempt before it failed): an attempt made none when it failed
where the one before it did (a deterministic failure strikes at the same step every time), or
before it got past the step it started at. An attempt that trained past its start and failed
short of the previous failure failed somewhere the previous attempt went through: not the
same failure. Restarts that got further keep going as before. "None" needs evidence
(made_no_progress): what no read or report tells is unknown, and unknown restarts.

An error's signature is rank-independent: which rank hits a deterministic failure first
varies between attempts, and so do the numbers in a message (addresses, pids, ports, sizes).
So it is the failure's kind, reason and exit code with the first line of its message, numbers
and addresses masked. A hang has no message: what identifies its cause is where it is, so
its signature names the rank outside any collective and its frame, or, when every rank waits
in one (a communication library's hang, a flaky link), the pod index and node that went quiet
first: a hang on another node is another cause. A collective that did not complete (an NCCL
watchdog or gloo timeout, a lost peer) is a hang that a rank reported: its message is the same
on every node, so its signature names the same site, the rank a launcher found outside the
collective and its frame, else the index and node of the first to give up. Without it, a flaky
link on another node (a timeout at the first collective after a resume, or at the same step)
would pass for the same failure and end a job that another attempt would train. Losses that
are not the job's doing (a pod deleted, a node lost, an eviction) have no signature: they never
make a crash loop.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from ..launcher import contract
from .rootcause import Candidate, collective

# Kinds whose cause is outside the job: never a crash loop.
EXTERNAL_KINDS = ("lost", "evicted")
# Kinds whose message names pods and times rather than an error: the reason says it all.
NO_MESSAGE_KINDS = ("stalled", "oom", "rendezvous")
MAX_SIGNATURE = 200

_MASKS = (
    (re.compile(r"0[xX][0-9a-fA-F]+"), "0x?"),
    # ids and hashes: long hex words with at least one letter
    (re.compile(r"\b(?=[0-9a-fA-F]*[a-fA-F])[0-9a-fA-F]{8,}\b"), "#"),
    (re.compile(r"\d+"), "N"),
)


def mask(text: str) -> str:
    """`text` with addresses, ids and numbers masked: equal for the same error anywhere."""
    for pattern, repl in _MASKS:
        text = pattern.sub(repl, text)
    return " ".join(text.split())


def signature(cause: Candidate) -> str | None:
    """The rank-independent signature of a root cause, None for losses that are not the job's
    doing. An exception's exit code is left out: a worker that raised exits 1 or -6 at random
    (gloo/NCCL teardown)."""
    if cause.kind in EXTERNAL_KINDS:
        return None
    out = f"{cause.kind}/{cause.reason}"
    if cause.exit_code is not None and cause.kind != contract.KIND_EXCEPTION:
        out += f"/{cause.exit_code}"
    if cause.kind == "stalled":
        out += f": {_hang_site(cause, 'every rank in a collective')}"
        return out[:MAX_SIGNATURE]
    if collective(cause):  # the site first: a long message is cut, never the site
        out += f": {_hang_site(cause, 'first to give up')}"
    if cause.kind not in NO_MESSAGE_KINDS and cause.message:
        first = next((line for line in cause.message.splitlines() if line.strip()), "")
        if first:
            out += f": {mask(first)}"
    return out[:MAX_SIGNATURE]


def _hang_site(cause: Candidate, first: str) -> str:
    """Where a hang is: the rank outside any collective and its frame (kept whole: another
    line is another place), else the index and node of the pod that went quiet or gave up
    first (`first` says which)."""
    if cause.rank is not None and cause.location:
        return f"rank {cause.rank} at {cause.location}"
    return f"index {cause.node_index} on node {cause.node or '?'}, {first}"


def attempt_step(entries: Iterable[Mapping[str, Any]]) -> int | None:
    """The last step an attempt reached: the highest step any of its pods reported."""
    steps = [
        e["step"]
        for e in entries
        if isinstance(e.get("step"), int) and not isinstance(e.get("step"), bool)
    ]
    return max(steps) if steps else None


def last_step_known(stalled: bool, reports: Iterable[Mapping[str, Any] | None]) -> bool:
    """Whether the attempt's last step is known, not only a lower bound: some pod's launcher
    sent its final report (it reads the progress file as it ends: the last step, or none
    written), or the attempt stalled (judged on the reads that saw its step stop). Otherwise
    the step is the last one an earlier read saw, and the attempt may have gone further."""
    return stalled or any(r is not None for r in reports)


def made_no_progress(
    step: int | None, start: int | None, previous: int | None, final: bool
) -> bool:
    """Whether an attempt that started at step `start` and reached `step` (`final`: its last
    step, not only the last one seen, see last_step_known) made no progress after the one
    before it, which reached `previous`: it failed at the very step the previous one did, or
    no further than that and without getting past its own start.

    "None" needs positive evidence that the attempt did not advance: its last step known, and
    a step to hold it against that was known before it failed, the previous attempt's (in its
    restart record) or its own start (a read while it ran: never the final reports it is
    compared with, which would make every attempt fail where it started). Anything less is
    unknown, and unknown never counts as none: a wrong verdict ends a job that was training
    (a status port the operator cannot read, reads starved on a busy node, an attempt shorter
    than the read interval), a missed one only costs restarts within maxRestarts. A known last
    step of none, after an attempt that had steps, is a failure before the first step."""
    if previous is None or not final:
        return False
    if step is None:
        return True
    if step > previous:
        return False
    return step == previous or (start is not None and step <= start)


# status.progress: the first step the operator saw of the attempt while none of its pods had
# failed (absent until then)
START_STEP = "startStep"


def start_step(before: Mapping[str, Any] | None, step: int, failed: bool) -> int | None:
    """status.progress.startStep: kept once known for the attempt (status.progress goes with
    it); else the job's step now (the lowest any pod reports: the first the operator sees).
    A status written before the field existed has the job's step it saw last. While pods of
    the attempt have `failed`, the steps are their final reports: they are what the attempt
    reached, never where it started, so the start stays as it was (None: unknown)."""
    kept = (before or {}).get(START_STEP)
    if failed:
        return kept if isinstance(kept, int) and not isinstance(kept, bool) else None
    for value in (kept, (before or {}).get("step")):
        if isinstance(value, int) and not isinstance(value, bool):
            return min(value, step)
    return step


def previous_failure(restarts: Iterable[Mapping[str, Any]], attempt: int) -> Mapping[str, Any]:
    """The record of the gang restart that started `attempt` (its step and signature are the
    previous attempt's), or {} when the attempt did not start with one (the first, a resume)."""
    for record in reversed(list(restarts)):
        if record.get("attempt") == attempt:
            return record if record.get("kind") == "infrastructure" else {}
    return {}
