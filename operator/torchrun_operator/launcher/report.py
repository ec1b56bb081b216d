"""The report (the termination message, docs/pod-contract.md): one failed worker's record,
its kind, and the summary fitted into TERMINATION_LIMIT bytes. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from .contract import (
    ERROR,
    KIND_COMM,
    KIND_EXCEPTION,
    KIND_EXIT,
    KIND_ORDER,
    KIND_SIGNAL,
    STDERR_TAIL_LIMIT,
    SUMMARY_VERSION,
    TERMINATION_LIMIT,
    FailureKind,
    FailureRecord,
    Summary,
    is_comm_error,
)
from .frames import bound, describe, text_frames, users_frame
from .state import compact_json, json_size


def classify_failure(exitcode: int, recorded_error: str | None) -> FailureKind:
    """Kind of one worker failure.

    A worker that raised may exit 1 or -6 (unclean gloo/NCCL teardown) at random, so the
    recorded error decides, not the exit code.
    """
    if recorded_error:
        return KIND_COMM if is_comm_error(recorded_error) else KIND_EXCEPTION
    if exitcode < 0:
        return KIND_SIGNAL
    return KIND_EXIT


def truncate_text(text: str, limit: int) -> str:
    """Shorten ``text`` to at most ``limit`` characters.

    Keeps mostly the end: a traceback's last lines hold the exception, which is what a user
    needs; a little of the head stays too, since an exception message starts with its type.
    """
    if limit <= 0:
        return ""
    if len(text) <= limit:
        return text
    marker = " … "
    if limit <= len(marker) + 2:
        return text[-limit:]
    room = limit - len(marker)
    head = room // 4
    tail = room - head
    return text[:head] + marker + text[len(text) - tail :]


def failure_sort_key(f: Mapping[str, Any]) -> tuple[int, float, int]:
    kind = f.get("kind", KIND_EXIT)
    order = KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)
    return (order, float(f.get("at") or 0.0), int(f.get("rank", 0)))


def fit_summary(summary: Mapping[str, Any], limit: int = TERMINATION_LIMIT) -> dict[str, Any]:
    """Return a copy of ``summary`` whose compact JSON is at most ``limit`` bytes.

    Messages are shortened first (evenly, keeping their tails); only if the bare records still
    don't fit are the least telling failures dropped, counted in ``omitted``. The JSON itself
    is never cut.
    """
    out = dict(summary)
    failures = [dict(f) for f in summary.get("failures", [])]
    failures.sort(key=failure_sort_key)
    out["failures"] = failures
    if json_size(out) <= limit:
        return out

    originals = [str(f.get("error") or "") for f in failures]
    tails = [str(f.get("stderr") or "") for f in failures]
    places = [str(f.get("location") or "") for f in failures]
    top = str(summary.get("message") or "")

    def shorten(budget: int) -> bool:
        for f, err, tail, place in zip(failures, originals, tails, places, strict=True):
            if "error" in f:
                f["error"] = truncate_text(err, budget)
            if tail:  # a stderr tail shrinks like the error (keeping its end), or goes
                f["stderr"] = truncate_text(tail, budget)
                if not f["stderr"]:
                    del f["stderr"]
            if place:  # a location too: its end names the file, line and function
                f["location"] = truncate_text(place, budget)
                if not f["location"]:
                    del f["location"]
        if "message" in out:
            out["message"] = truncate_text(top, max(budget, 256))
        return json_size(out) <= limit

    # 1. Shorten every message evenly, down to a length that still names the error.
    budget = max(len(top), *(len(e) for e in originals), *(len(t) for t in tails), 1)
    floor = 160
    while budget > floor:
        budget = max(budget // 2, floor)
        if shorten(budget):
            return out
    # 2. Many ranks on this node: drop the least telling failures, counted in "omitted".
    omitted = 0
    while len(failures) > 1 and json_size(out) > limit:
        failures.pop()
        originals.pop()
        tails.pop()
        places.pop()
        omitted += 1
        out["omitted"] = omitted
    if json_size(out) <= limit:
        return out
    # 3. Pathological (huge ranks list or message): shrink to nothing, then drop the rest.
    out.pop("stacks", None)
    for budget in (80, 32, 0):
        if shorten(budget):
            return out
    out["message"] = truncate_text(top, 64) if top else None
    if not out["message"]:
        out.pop("message", None)
    while failures and json_size(out) > limit:
        failures.pop()
        omitted += 1
        out["omitted"] = omitted
    if json_size(out) > limit:  # a checkpoint path of 1024 escaped characters can be 6 KiB
        out.pop("checkpoint", None)
    if json_size(out) > limit:
        out["ranks"] = []
    return out


def build_summary(
    state: str,
    *,
    group_rank: int | None = None,
    ranks: Sequence[int] = (),
    restarts: int = 0,
    failures: Sequence[FailureRecord] = (),
    message: str | None = None,
    step: int | None = None,
    checkpoint: Mapping[str, Any] | None = None,
    stacks: Sequence[Mapping[str, Any]] = (),
) -> Summary:
    summary: Summary = {
        "v": SUMMARY_VERSION,
        "state": state,
        "groupRank": group_rank,
        "ranks": sorted(int(r) for r in ranks),
        "restarts": int(restarts),
        "failures": [f.copy() for f in failures],
    }
    if message:
        summary["message"] = message
    if step is not None:
        summary["step"] = step
    if checkpoint is not None:
        summary["checkpoint"] = {"step": checkpoint["step"], "path": checkpoint["path"]}
    if stacks:
        summary["stacks"] = [dict(s) for s in stacks]
    return summary


def encode_summary(summary: Mapping[str, Any], limit: int = TERMINATION_LIMIT) -> bytes:
    data = compact_json(fit_summary(summary, limit)).encode("utf-8")
    if len(data) > limit:  # cannot happen unless limit is absurdly small; never emit broken JSON
        data = compact_json({"v": SUMMARY_VERSION, "state": summary.get("state", ERROR)}).encode()
    return data


# torchelastic's placeholders when a worker left no error file (ProcessFailure fills
# error_file_data with {"message": "<NONE>"}).
_NO_RECORD = {"", "<NONE>", "<N/A>"}


def error_text_from_record(error_file_data: Any) -> str | None:
    """The recorded error of a torchelastic error file, or None when nothing was recorded."""
    if not isinstance(error_file_data, Mapping):
        return None
    msg = error_file_data.get("message")
    if isinstance(msg, Mapping):
        msg = msg.get("message")
    if isinstance(msg, str) and msg.strip() not in _NO_RECORD:
        return msg
    return None


def _extra_info(error_file_data: Any) -> Mapping[str, Any]:
    """The error file's ``message.extraInfo``, empty when it has none."""
    msg = error_file_data.get("message") if isinstance(error_file_data, Mapping) else None
    extra = msg.get("extraInfo") if isinstance(msg, Mapping) else None
    return extra if isinstance(extra, Mapping) else {}


def precise_timestamp(error_file_data: Any, fallback: float) -> float:
    extra = _extra_info(error_file_data)
    for key in ("timestampPrecise", "timestamp"):
        try:
            return float(extra[key])
        except (KeyError, TypeError, ValueError):
            continue
    return float(fallback)


def recorded_location(error_file_data: Any, libs: Sequence[str] | None = None) -> str | None:
    """Where the user's code raised the recorded error (launcher/frames.py): the shim's
    ``location``, taken from the live traceback; else the innermost frame of the user's code in
    the formatted traceback (``py_callstack``: an error file torchelastic's own ``errors.record``
    wrote, in a program the shim did not start). ``libs``: the library directories, this
    interpreter's (the workers') by default."""
    extra = _extra_info(error_file_data)
    location = extra.get("location")
    if isinstance(location, str) and location:
        return bound(location)
    callstack = extra.get("py_callstack")
    frame = users_frame(text_frames(callstack), libs) if isinstance(callstack, str) else None
    return describe(frame) if frame else None


def failure_record(
    rank: int,
    local_rank: int,
    exitcode: int,
    error_file_data: Any,
    fallback_message: str,
    timestamp: float,
    stderr: str | None = None,
) -> FailureRecord:
    """One failed worker; ``stderr`` (the tail of its stderr) is kept only when the worker
    recorded no error, the only case where it says what the error file does not; a recorded
    error comes with where the user's code raised it (``location``), when its file says."""
    recorded = error_text_from_record(error_file_data)
    kind = classify_failure(exitcode, recorded)
    if recorded:
        error = recorded
    elif exitcode < 0:
        error = fallback_message or f"killed by signal {-exitcode}"
    else:
        # torchelastic's placeholder ("To enable traceback see: ...") tells the user nothing.
        error = f"exited with code {exitcode} without recording an error"
    record: FailureRecord = {
        "rank": int(rank),
        "localRank": int(local_rank),
        "exitCode": int(exitcode),
        "kind": kind,
        "error": error,
        "at": round(precise_timestamp(error_file_data, timestamp), 3),
    }
    if stderr and not recorded:
        record["stderr"] = stderr[-STDERR_TAIL_LIMIT:]
    location = recorded_location(error_file_data) if recorded else None
    if location:
        record["location"] = location
    return record


def exit_code_for(failures: Sequence[FailureRecord]) -> int:
    if not failures:
        return 1
    root = sorted(failures, key=failure_sort_key)[0]
    code = int(root.get("exitCode", 1))
    return code if 0 < code < 256 else 1
