"""Everything a pod says, parsed once, bounded and validated (docs/pod-contract.md, "What the
operator accepts").

A tenant's image decides what its pods say: its launcher's status answer (a sidecar can bind
the port first), its termination message, its progress file (the launcher copies the step into
both). Nothing of it may hurt the operator, so every byte that comes from a pod goes through
here, and only what comes out is kept:

* a body over its byte cap is refused before it is decoded;
* JSON is decoded with NaN and Infinity refused, integer literals of more than 20 digits
  refused (before Python converts them), floats that overflow to infinity refused; a body
  whose brackets nest deeper than MAX_DEPTH is refused by a linear scan before it is decoded
  (so no RecursionError reaches a thread that would take it for something else);
* each field the operator uses is checked against its documented range (counts 0..2**53,
  ranks 0..2**31-1, times between 1970 and 2100, rates finite and non-negative); a value out
  of its range refuses the whole answer or report (a launcher of ours never sends one, so
  whatever sent it is not to be believed about anything else either);
* strings are truncated, lists are cut at their caps, unknown fields are dropped.

The result is a small frozen value (LiveAnswer) or a fresh dict of known fields only (the
report, typed as the launcher's Summary); the decoded document is dropped at once. A refusal is
a `Rejected` with a short reason that the operator says once per pod (an Event and the
PodInputRejected condition), never an exception.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, cast

from ..api.bounds import MAX_CHECKPOINT_PATH
from ..launcher import contract

# Byte caps, checked before decoding. A launcher's answer is well under 8 KiB; the kubelet
# keeps at most 4096 bytes of a termination message (contract.TERMINATION_LIMIT).
MAX_ANSWER_BYTES = 64 * 1024
MAX_REPORT_BYTES = 16 * 1024
# The deepest nesting either document has is 4 (answer.stall.stacks[i].field).
MAX_DEPTH = 6
# Integer literals longer than this are refused before conversion (2**64 has 20 digits).
MAX_INT_DIGITS = 20
# Documented ranges.
MAX_COUNT = 2**53  # steps, totals, rounds, restarts, omitted: exact in a float and in int64
MAX_RANK = 2**31 - 1  # global ranks, node ranks, pod indices
MIN_EXIT, MAX_EXIT = -(2**31), 2**31 - 1  # exit codes (negative: torchrun's signal number)
MIN_TIME, MAX_TIME = 0.0, 4102444800.0  # unix seconds, 1970 to 2100
MAX_RATE = 1e9  # steps per second, seconds per step
# Caps on lists and strings (longer lists are cut, longer strings truncated).
MAX_RANKS = 1024  # global ranks of one pod's workers (nprocPerNode)
MAX_STACKS = 1024  # one stack summary per worker
MAX_FAILURES = 64  # the launcher fits its report in 4096 bytes anyway
MAX_NAME = 64  # states, failure kinds
MAX_ID = 253  # the rendezvous id
MAX_LOCATION = contract.LOCATION_LIMIT  # a stack frame, "file:line in function"
MAX_ERROR = 512  # a worker's recorded error, the report's message
MAX_STDERR = 2048  # the last lines of a failed worker's stderr
# The avoided-nodes annotation (api/names.py): a pod is rendered with at most avoid.MAX_NODES
# names, each a node name (a DNS-1123 subdomain, at most MAX_NODE_NAME); more than
# MAX_AVOIDED, or any other text, is not what the operator wrote.
MAX_AVOIDED = 16
MAX_NODE_NAME = 253
_NODE_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

REPORT_STATES = frozenset(
    (
        contract.SUCCEEDED,
        contract.FAILED,
        contract.RENDEZVOUS_TIMEOUT,
        contract.DNS_TIMEOUT,
        contract.ERROR,
    )
)


@dataclass(frozen=True)
class Rejected:
    """Why what a pod said was refused (a short phrase, said in an Event and a condition)."""

    reason: str


class _Refuse(ValueError):
    pass


# ---- the bounded decoder ------------------------------------------------------------------


def _constant(name: str) -> Any:
    raise _Refuse(f"{name} is not a number")


def _int_literal(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        raise _Refuse(f"integer of {len(text)} digits")
    return int(text)


def _float_literal(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _Refuse(f"{text[:32]} overflows")
    return value


def decode(body: bytes | str, limit: int) -> Any | Rejected:
    """A JSON document of at most `limit` bytes and MAX_DEPTH levels, or Rejected."""
    raw = body.encode() if isinstance(body, str) else body
    if len(raw) > limit:
        return Rejected(f"larger than {limit} bytes")
    if _depth(raw) > MAX_DEPTH:
        return Rejected(f"nested deeper than {MAX_DEPTH} levels")
    try:
        return json.loads(
            raw,
            parse_constant=_constant,
            parse_int=_int_literal,
            parse_float=_float_literal,
        )
    except _Refuse as e:
        return Rejected(str(e))
    except RecursionError:  # not after _depth; kept so that no decoder can raise it
        return Rejected(f"nested deeper than {MAX_DEPTH} levels")
    except (ValueError, OverflowError, UnicodeDecodeError):
        return Rejected("not JSON")


_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_NOT_STRUCTURE = bytes(c for c in range(256) if c not in b'[]{}"')
_STEP = {ord("["): 1, ord("{"): 1, ord("]"): -1, ord("}"): -1}


def _depth(raw: bytes) -> int:
    """How deep `raw` nests, from its brackets outside strings, before anything is decoded:
    linear, in C but for one step per bracket (10 ms for 64 KiB of brackets)."""
    structure = _ESCAPE.sub(b"", raw).translate(None, _NOT_STRUCTURE)
    outside = b"".join(structure.split(b'"')[::2])
    return max(accumulate(_STEP[c] for c in outside), default=0)


# ---- field checks (each raises _Refuse with the field's name) -------------------------------


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int_in(data: Mapping[str, Any], key: str, low: int, high: int, where: str) -> int | None:
    """An optional integer field: None when absent or null, refused out of range or typed
    otherwise."""
    value = data.get(key)
    if value is None:
        return None
    if not _is_int(value):
        raise _Refuse(f"{where}{key} is not an integer")
    if not low <= value <= high:
        raise _Refuse(f"{where}{key} {_show(value)} is out of range {low}..{high}")
    return cast(int, value)


def _float_in(
    data: Mapping[str, Any], key: str, low: float, high: float, where: str
) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise _Refuse(f"{where}{key} is not a number")
    if not (math.isfinite(value) and low <= value <= high):
        raise _Refuse(f"{where}{key} {_show(value)} is out of range {low:g}..{high:g}")
    return float(value)


def _str(data: Mapping[str, Any], key: str, limit: int, where: str) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise _Refuse(f"{where}{key} is not a string")
    return truncate(value, limit)


def _map(data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = data.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _Refuse(f"{key} is not an object")
    return value


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _Refuse(f"{key} is not a list")
    return value


def _ranks(data: Mapping[str, Any], key: str, where: str = "") -> tuple[int, ...]:
    raw = _list(data, key)
    if len(raw) > MAX_RANKS:
        raise _Refuse(f"{where}{key} has {len(raw)} entries, more than {MAX_RANKS}")
    out = set()
    for r in raw:
        if not _is_int(r) or not 0 <= r <= MAX_RANK:
            raise _Refuse(f"{where}{key} holds {_show(r)}, not a rank 0..{MAX_RANK}")
        out.add(r)
    return tuple(sorted(out))


def _show(value: object) -> str:
    return truncate(repr(value), 32)


def truncate(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(limit - 3, 0)] + "..."


# ---- the status answer (GET /status) ------------------------------------------------------


@dataclass(frozen=True)
class Stack:
    """One worker's stacks, dumped when its pod stalled: where it is, and whether that is
    inside a collective (torch.distributed) or not."""

    rank: int
    in_collective: bool
    location: str | None


@dataclass(frozen=True)
class CheckpointReport:
    """The latest checkpoint a pod's script reported: its step, its path (at most
    MAX_CHECKPOINT_PATH characters, no NUL or line breaks) and when the launcher saw it (the
    pod's clock)."""

    step: int
    path: str
    at: float | None = None


def rendezvoused(group_rank: int | None, state: str | None) -> bool:
    """Whether a launcher that answered these knows its node rank: a rendezvous round
    completed (it trains, stalled or finished since)."""
    return group_rank is not None and state != contract.LIVE_RENDEZVOUS


@dataclass(frozen=True)
class LiveAnswer:
    """A launcher's status answer, validated: every field in its range, bound to a pod by
    `rdzv_id` and `index` (checked against the pod's by observe.parse_live). The answer's own
    clock (`time`) is not kept: two answers that differ only in it are equal."""

    rdzv_id: str
    index: int
    state: str | None = None
    group_rank: int | None = None
    ranks: tuple[int, ...] = ()
    round: int | None = None
    restarts: int | None = None
    step: int | None = None
    total: int | None = None
    steps_per_second: float | None = None
    step_seconds: float | None = None
    last_step_at: float | None = None
    window_full: bool = False
    stall_at: float | None = None
    stacks: tuple[Stack, ...] = ()
    checkpoint: CheckpointReport | None = None

    @property
    def rendezvoused(self) -> bool:
        return rendezvoused(self.group_rank, self.state)

    def cost(self) -> int:
        """Roughly the bytes this answer holds in memory (for the bound on all live state)."""
        strings = len(self.rdzv_id) + len(self.state or "")
        strings += len(self.checkpoint.path) if self.checkpoint else 0
        strings += sum(len(s.location or "") + 120 for s in self.stacks)
        return 600 + strings + 40 * len(self.ranks)


def live_answer(data: object) -> LiveAnswer | Rejected:
    """A decoded status answer as a LiveAnswer, or why it is refused."""
    if not isinstance(data, dict):
        return Rejected("not a JSON object")
    try:
        return _live(data)
    except _Refuse as e:
        return Rejected(str(e))


def parse_answer(body: bytes | str) -> LiveAnswer | Rejected:
    """A status answer's body (at most MAX_ANSWER_BYTES) as a LiveAnswer, or why not."""
    data = decode(body, MAX_ANSWER_BYTES)
    return data if isinstance(data, Rejected) else live_answer(data)


def _live(data: Mapping[str, Any]) -> LiveAnswer:
    if data.get("v") != contract.LIVE_VERSION:
        raise _Refuse(f"version {_show(data.get('v'))} is not {contract.LIVE_VERSION}")
    # The binding fields: without them an answer could be any pod's (an IP reused by another
    # pod, a sidecar answering for the launcher).
    rdzv_id = _str(data, "rdzvId", MAX_ID, "")
    index = _int_in(data, "index", 0, MAX_RANK, "")
    if rdzv_id is None or index is None:
        raise _Refuse("rdzvId or index is missing")
    progress = _map(data, "progress")
    stall = _map(data, "stall")
    ranks = _ranks(data, "ranks")
    stacks = []
    for s in _list(stall, "stacks")[:MAX_STACKS]:
        if not isinstance(s, dict):
            raise _Refuse("stall.stacks holds a non-object")
        rank = _int_in(s, "rank", 0, MAX_RANK, "stall.stacks[].")
        if rank is None:
            raise _Refuse("stall.stacks[].rank is missing")
        where = _str(s, "at", MAX_LOCATION, "stall.stacks[].")
        stacks.append(Stack(rank, s.get("inCollective") is True, where or None))
    return LiveAnswer(
        rdzv_id=rdzv_id,
        index=index,
        state=_str(data, "state", MAX_NAME, ""),
        group_rank=_int_in(data, "groupRank", 0, MAX_RANK, ""),
        ranks=ranks,
        round=_int_in(data, "round", 0, MAX_COUNT, ""),
        restarts=_int_in(data, "restarts", 0, MAX_COUNT, ""),
        step=_int_in(progress, "step", 0, MAX_COUNT, "progress."),
        total=_int_in(progress, "total", 0, MAX_COUNT, "progress."),
        steps_per_second=_float_in(progress, "stepsPerSecond", 0, MAX_RATE, "progress."),
        step_seconds=_float_in(progress, "stepSeconds", 0, MAX_RATE, "progress."),
        last_step_at=_time(progress, "lastStepAt", "progress."),
        window_full=progress.get("windowFull") is True,
        stall_at=_time(stall, "at", "stall."),
        stacks=tuple(stacks),
        checkpoint=_checkpoint(_map(progress, "checkpoint")),
    )


def _checkpoint(data: Mapping[str, Any]) -> CheckpointReport | None:
    """progress.checkpoint (a status answer) or checkpoint (a report): a step and a path,
    both required once there is one; a path over its cap or with NUL or line breaks refuses
    the answer or report (our launcher never sends one)."""
    if not data:
        return None
    where = "progress.checkpoint."
    step = _int_in(data, "step", 0, MAX_COUNT, where)
    path = data.get("path")
    if step is None or not isinstance(path, str) or not path:
        raise _Refuse(f"{where}step or path is missing")
    if len(path) > MAX_CHECKPOINT_PATH:
        raise _Refuse(f"{where}path is longer than {MAX_CHECKPOINT_PATH} characters")
    if any(c in path for c in "\0\n\r"):
        raise _Refuse(f"{where}path holds a NUL or a line break")
    return CheckpointReport(step, path, _time(data, "at", where))


def misplaced_checkpoint(path: str | None, mount: str | None) -> Rejected | None:
    """A reported checkpoint `path` that does not lie in the job's checkpoint storage
    (`mount`: spec.checkpoint.mountPath; None: the job has none, and nothing resumes) refuses
    the answer or report it came in, as a field out of its range does: our launcher drops such
    a checkpoint (contract.checkpoint_outside), so whatever sent it is not to be believed. A
    check of its own, after parsing: it needs the job's spec, which the status reader lacks."""
    if path is None or mount is None:
        return None
    why = contract.checkpoint_outside(path, mount)
    return None if why is None else Rejected(f"checkpoint path {_show(path)} {why}")


def _time(data: Mapping[str, Any], key: str, where: str) -> float | None:
    """Unix seconds from a pod's clock; 0 is "not yet" (refused too: it is formatted later)."""
    t = _float_in(data, key, MIN_TIME, MAX_TIME, where)
    return t if t else None


# ---- the report (the termination message) ---------------------------------------------------


def parse_report(message: object) -> contract.Summary | Rejected | None:
    """The launcher's termination message as a fresh Summary of known, checked fields; None
    when there is none (no message, or a message that is not JSON: a container that is not
    our launcher, or one killed before it wrote); Rejected when a JSON report breaks the
    contract (the pod then ends on its exit code alone)."""
    if not isinstance(message, str) or not message.strip():
        return None
    data = decode(message, MAX_REPORT_BYTES)
    if isinstance(data, Rejected):
        return None if data.reason == "not JSON" else data
    if not isinstance(data, dict) or "state" not in data:
        return None  # some other JSON: not a report
    try:
        return _report(data)
    except _Refuse as e:
        return Rejected(str(e))


def _report(data: Mapping[str, Any]) -> contract.Summary:
    state = data.get("state")
    if not isinstance(state, str) or state not in REPORT_STATES:
        raise _Refuse(f"state {_show(state)} is not a report state")
    failures: list[contract.FailureRecord] = []
    for f in _list(data, "failures")[:MAX_FAILURES]:
        if not isinstance(f, dict):
            raise _Refuse("failures holds a non-object")
        failures.append(_failure(f))
    out: dict[str, Any] = {
        "v": contract.SUMMARY_VERSION,
        "state": state,
        "groupRank": _int_in(data, "groupRank", 0, MAX_RANK, ""),
        "ranks": list(_ranks(data, "ranks")),
        "restarts": _int_in(data, "restarts", 0, MAX_COUNT, "") or 0,
        "failures": failures,
    }
    optional = {
        "message": _str(data, "message", MAX_ERROR, ""),
        "step": _int_in(data, "step", 0, MAX_COUNT, ""),
        "round": _int_in(data, "round", 0, MAX_COUNT, ""),
        "omitted": _int_in(data, "omitted", 0, MAX_COUNT, ""),
        "reportedAt": _time(data, "reportedAt", ""),
    }
    checkpoint = _checkpoint(_map(data, "checkpoint"))
    if checkpoint is not None:
        out["checkpoint"] = {"step": checkpoint.step, "path": checkpoint.path}
    out.update({k: v for k, v in optional.items() if v is not None})
    stacks = [_report_stack(s) for s in _list(data, "stacks")[: contract.MAX_REPORT_STACKS]]
    if stacks:
        out["stacks"] = stacks
    return cast(contract.Summary, out)


def _report_stack(s: object) -> dict[str, Any]:
    """One rank the launcher found outside any collective after a communication failure."""
    if not isinstance(s, dict):
        raise _Refuse("stacks holds a non-object")
    rank = _int_in(s, "rank", 0, MAX_RANK, "stacks[].")
    if rank is None:
        raise _Refuse("stacks[].rank is missing")
    out: dict[str, Any] = {"rank": rank, "inCollective": s.get("inCollective") is True}
    at = _str(s, "at", MAX_LOCATION, "stacks[].")
    if at:
        out["at"] = at
    return out


def _failure(f: Mapping[str, Any]) -> contract.FailureRecord:
    kind = f.get("kind")
    out: dict[str, Any] = {
        "rank": _int_in(f, "rank", 0, MAX_RANK, "failures[]."),
        "localRank": _int_in(f, "localRank", 0, MAX_RANK, "failures[]."),
        "exitCode": _int_in(f, "exitCode", MIN_EXIT, MAX_EXIT, "failures[]."),
        # An unknown kind counts as a bare exit (rootcause), as before.
        "kind": kind
        if isinstance(kind, str) and kind in contract.KIND_ORDER
        else contract.KIND_EXIT,
        "error": _str(f, "error", MAX_ERROR, "failures[].") or "",
        "at": _time(f, "at", "failures[]."),
    }
    stderr = f.get("stderr")
    if isinstance(stderr, str) and stderr:
        # The tail is what matters: keep the last MAX_STDERR characters.
        out["stderr"] = stderr if len(stderr) <= MAX_STDERR else stderr[-MAX_STDERR:]
    out["location"] = _location(f)
    return cast(contract.FailureRecord, {k: v for k, v in out.items() if v is not None})


def _location(f: Mapping[str, Any]) -> str | None:
    """failures[].location: where the user's code raised, one line of printable text (it is
    shown in status.failure, an event and the CLI: a line break or a terminal escape there
    would forge lines; our launcher shows such characters as `?`), truncated to MAX_LOCATION."""
    where = f.get("location")
    if where is None:
        return None
    if not isinstance(where, str):
        raise _Refuse("failures[].location is not a string")
    if not where.isprintable():
        raise _Refuse("failures[].location holds a character that does not print")
    return truncate(where, MAX_LOCATION) or None


# ---- what the operator wrote on the pod -----------------------------------------------------


def avoided_nodes(value: object) -> frozenset[str]:
    """The nodes the pod's rendered node affinity keeps it off, from its avoided-nodes
    annotation (render/placement.py): a comma-separated list of node names. Anyone who may
    edit the pod may edit it too: text that is not such a list of at most MAX_AVOIDED names
    says nothing (empty), and the pod is taken for one kept off no node."""
    if not isinstance(value, str) or not value:
        return frozenset()
    if len(value) > MAX_AVOIDED * (MAX_NODE_NAME + 1):
        return frozenset()
    nodes = value.split(",")
    if len(nodes) > MAX_AVOIDED:
        return frozenset()
    if not all(len(n) <= MAX_NODE_NAME and _NODE_NAME.fullmatch(n) for n in nodes):
        return frozenset()
    return frozenset(nodes)
