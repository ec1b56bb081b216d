"""Pure formatting for kubectl-dtj: DistributedTrainingJob dicts in, text out.

Works on the raw object as the API returns it (camelCase keys, the status that docs/design.md
describes), not on the pydantic models: a CLI must still show something useful for an object
written by an older or newer operator, so every field is optional here and a missing one prints
as "-" or "<none>".
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import yaml

from torchrun_operator.api import timefmt
from torchrun_operator.api.ranks import parse_ranks
from torchrun_operator.api.status_names import Phase

__all__ = [
    "FormatError",
    "entry_index",
    "entry_node_rank",
    "find_rank_entry",
    "format_age",
    "format_failure",
    "format_job_list",
    "format_job_status",
    "format_objects",
    "log_fetch_error",
    "human_duration",
    "parse_rank_ranges",
    "progress_line",
    "render_table",
]

Obj = Mapping[str, Any]
NONE = "<none>"


class FormatError(ValueError):
    """A user-facing error: the message is printed as is."""


def format_age(start: object, now: datetime) -> str:
    """The age as kubectl prints it (apimachinery's HumanDuration): 45s, 3m20s, 12m, 5h2m, 3d."""
    t = timefmt.parse(start)
    if t is None:
        return NONE
    return human_duration(int((now - t).total_seconds()))


def human_duration(seconds: int) -> str:
    seconds = max(0, seconds)
    if seconds < 120:
        return f"{seconds}s"
    minutes = seconds // 60
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    days = hours // 24
    if days < 365 * 2:
        return f"{days}d"
    years = days // 365
    if years < 8:
        return f"{years}y{days % 365}d" if days % 365 else f"{years}y"
    return f"{years}y"


def render_table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    """kubectl-style: columns left-aligned, separated by three spaces, no borders."""
    cells = [list(header)] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None or value == "":
        return NONE
    return str(value)


def _status(job: Obj) -> Obj:
    status = job.get("status")
    return status if isinstance(status, Mapping) else {}


def _meta(job: Obj) -> Obj:
    meta = job.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _nodes_ready(status: Obj) -> str:
    nodes = status.get("nodes") or {}
    desired = nodes.get("desired")
    # "ready" counts pods whose training is under way; `running` is what the status reports
    # for that (a Ready pod means rendezvous completed: docs/pod-contract.md).
    ready = nodes.get("ready", nodes.get("running"))
    if desired is None and ready is None:
        return "-"
    return f"{ready if ready is not None else 0}/{desired if desired is not None else '?'}"


def format_job_list(jobs: Sequence[Obj], now: datetime, all_namespaces: bool = False) -> str:
    if not jobs:
        return "No resources found."
    header = ["NAME", "PHASE", "NODES", "WORLD", "ATTEMPT", "AGE"]
    if all_namespaces:
        header = ["NAMESPACE", *header]
    rows = []

    def key(job: Obj) -> tuple[str, str]:
        return str(_meta(job).get("namespace", "")), str(_meta(job).get("name", ""))

    for job in sorted(jobs, key=key):
        meta, status = _meta(job), _status(job)
        row = [
            meta.get("name"),
            status.get("phase", Phase.PENDING if not status else None),
            _nodes_ready(status),
            status.get("worldSize", "-"),
            status.get("attempt", 0),
            format_age(meta.get("creationTimestamp"), now),
        ]
        rows.append([meta.get("namespace"), *row] if all_namespaces else row)
    return render_table(header, rows)


def _condition_lines(status: Obj) -> list[str]:
    lines = []
    for cond in status.get("conditions") or []:
        text = f"  {cond.get('type')}={cond.get('status')}"
        if cond.get("reason"):
            text += f" ({cond['reason']})"
        if cond.get("message"):
            text += f": {cond['message']}"
        lines.append(text)
    return lines


def _exit(entry: Obj) -> object:
    code = entry.get("exitCode")
    return "-" if code is None else code


def entry_index(entry: Obj) -> Any:
    """A status.ranks entry's pod index. Operators before the index had its own field wrote
    it as `nodeRank`."""
    return entry["index"] if "index" in entry else entry.get("nodeRank")


def entry_node_rank(entry: Obj) -> Any:
    """torchrun's node rank of the entry's pod (only entries that have an `index` carry it)."""
    return entry.get("nodeRank") if "index" in entry else None


def _ago(value: object, now: datetime) -> str | None:
    t = timefmt.parse(value)
    return None if t is None else human_duration(int((now - t).total_seconds()))


def progress_line(progress: Obj, now: datetime) -> str | None:
    """status.progress in one line: step/total, steps/s, ETA; None without a step."""
    step = progress.get("step")
    if step is None:
        return None
    total = progress.get("totalSteps")
    text = f"step {step}" + (f"/{total}" if total is not None else "")
    if progress.get("stepsPerSecond") is not None:
        text += f", {progress['stepsPerSecond']} steps/s"
    eta = timefmt.parse(progress.get("eta"))
    if eta is not None:
        left = int((eta - now).total_seconds())
        text += f", ETA {progress['eta']}" + (f" (in {human_duration(left)})" if left > 0 else "")
    return text


def format_failure(failure: Obj) -> str:
    """The root cause in full: no truncation, the message keeps its own line breaks."""
    where = []
    for key, label in (
        ("rank", "rank"),
        ("index", "index"),
        ("nodeRank", "node rank"),
        ("pod", "pod"),
        ("node", "node"),
        ("exitCode", "exit code"),
        ("kind", "kind"),
        ("reason", "reason"),
        ("at", "at"),
        ("step", "step"),
        ("location", "location"),
    ):
        if failure.get(key) is not None:
            where.append(f"  {label}: {failure[key]}")
    lines = ["Root cause:", *where]
    message = failure.get("message")
    if message:
        lines.append("  message:")
        lines.extend("    " + line for line in str(message).splitlines())
    return "\n".join(lines)


def _runtime_line(job: Obj) -> str | None:
    """The runtime the job resolved (status.runtime), or the one it waits for."""
    rec = _status(job).get("runtime")
    if isinstance(rec, Mapping) and rec.get("name"):
        return (
            f"{rec.get('kind')} {rec['name']} (resourceVersion {rec.get('resourceVersion')}, "
            f"spec hash {rec.get('specHash')})"
        )
    ref = (job.get("spec") or {}).get("runtimeRef")
    if isinstance(ref, Mapping) and ref.get("name"):
        kind = ref.get("kind") or "ClusterDistributedTrainingRuntime"
        return f"{kind} {ref['name']} (not resolved yet)"
    return None


def format_job_status(job: Obj, now: datetime) -> str:
    meta, status = _meta(job), _status(job)
    nodes = status.get("nodes") or {}
    summary = [
        ("Name", meta.get("name")),
        ("Namespace", meta.get("namespace")),
        ("Phase", status.get("phase", Phase.PENDING)),
        ("Attempt", status.get("attempt", 0)),
        ("World size", status.get("worldSize", "-")),
        # `summary` repeats ready/desired for kubectl's printer columns.
        ("Nodes", ", ".join(f"{k} {v}" for k, v in nodes.items() if k != "summary") or "-"),
        ("Age", format_age(meta.get("creationTimestamp"), now)),
    ]
    start = timefmt.parse(status.get("startTime"))
    end = timefmt.parse(status.get("completionTime"))
    if start is not None:
        summary.append(("Started", status["startTime"]))
    if end is not None:
        summary.append(("Completed", status["completionTime"]))
        if start is not None:
            summary.append(("Duration", _duration(end - start)))
    runtime = _runtime_line(job)
    if runtime:
        summary.append(("Runtime", runtime))
    gang = status.get("scheduling")
    if isinstance(gang, Mapping) and gang.get("gang"):
        summary.append(("Gang", f"{gang['gang']}, PodGroup {gang.get('podGroup')}"))
    progress = status.get("progress")
    line = progress_line(progress, now) if isinstance(progress, Mapping) else None
    if line:
        summary.append(("Progress", line))
    width = max(len(k) for k, _ in summary) + 1
    out = [f"{(k + ':').ljust(width)} {_cell(v)}" for k, v in summary]

    conditions = _condition_lines(status)
    if conditions:
        out += ["", "Conditions:", *conditions]

    avoided = [a for a in status.get("avoidedNodes") or [] if isinstance(a, Mapping)]
    if avoided:
        out += [
            "",
            "Avoided nodes (the job's pods keep off them):",
            render_table(
                ["NODE", "REASON", "KIND", "INDEX", "SINCE", "UNTIL"],
                [
                    [
                        a.get("node"),
                        a.get("reason"),
                        a.get("kind"),
                        a.get("index"),
                        a.get("since"),
                        a.get("until"),
                    ]
                    for a in avoided
                ],
            ),
        ]

    restarts = status.get("restarts") or []
    if restarts:
        out += [
            "",
            "Restarts:",
            render_table(
                ["ATTEMPT", "AT", "KIND", "RANK", "INDEX", "STEP", "REASON"],
                [
                    [
                        r.get("attempt"),
                        r.get("at"),
                        r.get("kind"),
                        r.get("rank"),
                        entry_index(r),
                        r.get("step"),
                        r.get("reason"),
                    ]
                    for r in restarts
                ],
            ),
        ]

    ranks = sorted(status.get("ranks") or [], key=lambda r: entry_index(r) or 0)
    if ranks:
        # Step columns only when the script reports its progress (docs/progress.md).
        steps = any(r.get("step") is not None for r in ranks)
        header = ["INDEX", "POD", "NODE", "NODE-RANK", "GLOBAL-RANKS", "PHASE"]
        header += ["STEP", "STEPS/S", "LAST-STEP"] if steps else []
        header += ["RESTARTS", "EXIT", "REASON"]
        rows = []
        for r in ranks:
            row = [
                entry_index(r),
                r.get("pod"),
                r.get("node"),
                entry_node_rank(r),
                r.get("globalRanks"),
                r.get("phase"),
            ]
            if steps:
                ago = _ago(r.get("lastStepAt"), now)
                row += [r.get("step"), r.get("stepsPerSecond"), f"{ago} ago" if ago else None]
            row += [r.get("restarts", 0), _exit(r), r.get("reason")]
            rows.append(row)
        out.append("")
        out.append(render_table(header, rows))
    failure = status.get("failure")
    if isinstance(failure, Mapping) and failure:
        out += ["", format_failure(failure)]
    return "\n".join(out)


def _duration(delta: Any) -> str:
    seconds = max(0, int(delta.total_seconds()))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def parse_rank_ranges(text: str) -> set[int]:
    """ "0-7" or "0-3,8-11" or "5" to the set of global ranks it names (api.ranks.parse_ranks),
    a malformed one as a FormatError."""
    try:
        return set(parse_ranks(text))
    except ValueError as e:
        raise FormatError(f"bad globalRanks {text!r}") from e


def find_rank_entry(
    job: Obj, rank: int | None = None, node_rank: int | None = None, index: int | None = None
) -> Obj:
    """The status.ranks entry holding global `rank`, or torchrun's node rank `node_rank`, or
    the pod of index `index`.

    Raises FormatError with a message that says what is known, e.g. before rendezvous
    (globalRanks and nodeRank still unset) or for a rank beyond the world size.
    """
    if sum(x is not None for x in (rank, node_rank, index)) != 1:
        raise FormatError("give exactly one of --rank, --node-rank or --index")
    name = _meta(job).get("name", "?")
    entries: list[Obj] = list(_status(job).get("ranks") or [])
    if index is not None:
        for entry in entries:
            if entry_index(entry) == index:
                return entry
        known = sorted(i for e in entries if (i := entry_index(e)) is not None)
        raise FormatError(f"job {name} has no pod index {index} (indexes: {known or NONE})")
    if node_rank is not None:
        for entry in entries:
            if entry_node_rank(entry) == node_rank:
                return entry
        known = sorted(n for e in entries if (n := entry_node_rank(e)) is not None)
        if not known:
            raise FormatError(
                f"job {name}: node ranks are not known yet (rendezvous has not completed); "
                "use --index"
            )
        raise FormatError(f"job {name} has no node rank {node_rank} (node ranks: {known})")
    assert rank is not None
    for entry in entries:
        if entry.get("globalRanks") and rank in parse_rank_ranges(str(entry["globalRanks"])):
            return entry
    world = _status(job).get("worldSize")
    if entries and not any(e.get("globalRanks") for e in entries):
        raise FormatError(
            f"job {name}: global ranks are not assigned yet (rendezvous has not completed); "
            "use --index"
        )
    raise FormatError(f"job {name} has no global rank {rank} (world size {world or '-'})")


def format_objects(objs: Sequence[Obj] | Obj, output: str) -> str:
    """json or yaml of one object, or of a list as a kubectl `List`."""
    data: Any = objs
    if not isinstance(objs, Mapping):
        data = {"apiVersion": "v1", "kind": "List", "items": list(objs)}
    if output == "json":
        return json.dumps(data, indent=2, default=str)
    if output == "yaml":
        return yaml.safe_dump(_plain(data), sort_keys=False).rstrip("\n")
    raise FormatError(f"unknown output format {output!r}: json, yaml or table")


def _plain(value: Any) -> Any:
    """Mappings and sequences to dict/list so yaml.safe_dump accepts them."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, datetime):
        return value.isoformat()
    return value


def log_fetch_error(status: int | None, body: object, entry: Obj) -> str:
    """What to say when the API server could not give a pod's logs.

    The API server fetches logs from the kubelet of the pod's node; when that fails (an
    unreachable node, a kubelet that is gone) it answers 500 with the kubelet URL it tried.
    Say which pod and node that was: the user can still find the rank's output where that
    node keeps it.
    """
    pod, node = entry.get("pod") or NONE, entry.get("node") or NONE
    node_rank = entry_node_rank(entry)
    index = entry_index(entry)
    where = (
        f"pod {pod} (index {'-' if index is None else index}, "
        f"node rank {'-' if node_rank is None else node_rank}, node {node})"
    )
    if status == 404:
        return f"{where} is gone, and its logs with it"
    message = ""
    if isinstance(body, (str, bytes)):
        text = body.decode(errors="replace") if isinstance(body, bytes) else body
        try:
            parsed = json.loads(text)
            message = str(parsed.get("message", "")) if isinstance(parsed, dict) else text
        except ValueError:
            message = text
    message = message.strip() or f"HTTP {status}"
    if status is not None and status >= 500:
        return (
            f"cannot fetch the logs of {where}: the API server could not get them from the "
            f"node's kubelet: {message}"
        )
    return f"cannot fetch the logs of {where}: {message}"
