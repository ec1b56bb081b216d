"""The comparison table and the README section. Pure."""

from __future__ import annotations

from typing import Any

from .workloads import DIRECT, KUBEFLOW, OURS, TRAINER, Workload

# (key, label, unit) in the order the table lists them; every figure: lower is better.
FIGURES: list[tuple[str, str, str]] = [
    ("pods_created_s", "apply -> all pods created", "s"),
    ("pods_running_s", "apply -> every pod Running", "s"),
    ("jobs_running_s", "apply -> every job Running (its status)", "s"),
    ("finish_lag_max_s", "last pod finished -> job Succeeded (max over jobs)", "s"),
    ("status_lag_p50_s", "pod change -> job status, p50", "s"),
    ("status_lag_p95_s", "pod change -> job status, p95", "s"),
    ("status_lag_max_s", "pod change -> job status, max", "s"),
    ("api_requests_per_job", "API requests per job", ""),
    (
        "job_controller_requests_per_job",
        "kube-controller-manager's Job controller: API requests per job",
        "",
    ),
    ("requests_with_job_controller_per_job", "API requests per job, operator + Job controller", ""),
    (
        "kcm_requests_per_job",
        "kube-controller-manager, all its controllers: API requests per job",
        "",
    ),
    ("cpu_s", "operator CPU", "s"),
    ("kcm_cpu_s", "kube-controller-manager CPU, all its controllers", "s"),
    ("peak_rss_mib", "operator peak RSS", "MiB"),
    ("rate_limit_wait_sum_s", "our client rate limit: seconds requests waited, summed", "s"),
    ("rate_limit_wait_mean_s", "our client rate limit: mean wait per request", "s"),
    ("restart_s", "one pod fails -> every pod Running again", "s"),
    ("restart_status_noticed_s", "one pod fails -> job status says Restarting", "s"),
    ("restart_after_decision_s", "job says Restarting -> every pod Running again", "s"),
    ("restart_pods_replaced", "pods replaced by that restart", ""),
]


def value(result: dict[str, Any], key: str) -> Any:
    """A stored figure, or one derived from stored ones."""
    if key == "restart_after_decision_s":
        total, noticed = result.get("restart_s"), result.get("restart_status_noticed_s")
        return total - noticed if total is not None and noticed is not None else None
    if key == "rate_limit_wait_mean_s":
        waited, n = result.get("rate_limit_wait_sum_s"), result.get("rate_limit_requests")
        return round(waited / n, 3) if waited is not None and n else None
    if key == "requests_with_job_controller_per_job":
        own, job = result.get("api_requests_per_job"), result.get("job_controller_requests_per_job")
        return round(own + job, 1) if own is not None and job is not None else None
    return result.get(key)


def fmt(v: Any) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def _ratio(ours: Any, theirs: Any) -> str:
    if not isinstance(ours, int | float) or not isinstance(theirs, int | float):
        return "n/a"
    if ours <= 0 or theirs < 0:
        return "n/a"
    return f"{theirs / ours:.2f}x"


def rows(
    w: Workload, results: dict[str, dict[str, Any]], direct: dict[str, Any] | None = None
) -> list[tuple[str, ...]]:
    """(figure, ours, training-operator, its ratio to ours, Trainer v2 + JobSet, its ratio
    to ours, direct client). The direct client's figures: `results`' own, else `direct`'s
    (it has no limits to vary, so it runs once per workload)."""
    ours = results.get(OURS) or {}
    direct = results.get(DIRECT) or direct or {}
    others = [results.get(k) or {} for k in (KUBEFLOW, TRAINER)]
    out = []
    for key, label, unit in FIGURES:
        if key.startswith("restart") and not w.gang_restart:
            continue
        name = f"{label} ({unit})" if unit else label
        d = value(direct, key) if key in ("pods_created_s", "pods_running_s") else None
        a = value(ours, key)
        row = [name, fmt(a)]
        for theirs in others:
            b = value(theirs, key)
            row += [fmt(b) if theirs else "not run", _ratio(a, b)]
        out.append((*row, fmt(d)))
    return out


TRAINER_LABEL = "Trainer v2 + JobSet"
LABELS = {OURS: OURS, KUBEFLOW: KUBEFLOW, TRAINER: TRAINER_LABEL}


def unmeasured(w: Workload, results: dict[str, dict[str, Any]]) -> list[str]:
    """Why a kind's restart figures read n/a: a run that had no pod left to fail says so."""
    if not w.gang_restart:
        return []
    return [
        f"{label}: no restart measured: {why}"
        for k, label in LABELS.items()
        if (why := (results.get(k) or {}).get("restart_not_run"))
    ]


HEADER = (
    "figure", LABELS[OURS], LABELS[KUBEFLOW], "ratio", LABELS[TRAINER], "ratio",
    "direct client (no operator)",
)  # fmt: skip


def markdown_table(
    w: Workload, results: dict[str, dict[str, Any]], direct: dict[str, Any] | None = None
) -> str:
    lines = [
        f"**{w.name}**: {w.jobs} job(s) x {w.nodes} node(s) = {w.pods} pods, "
        f"each Running {w.run_seconds}s",
        "",
        "| " + " | ".join(HEADER) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(HEADER) - 1)) + " |",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows(w, results, direct)]
    notes = unmeasured(w, results)
    return "\n".join(lines + ([""] + [f"- {n}" for n in notes] if notes else []))


def text_table(
    w: Workload,
    results: dict[str, dict[str, Any]],
    direct: dict[str, Any] | None = None,
    setting: str = "",
) -> str:
    table = [HEADER, *rows(w, results, direct)]
    widths = [max(len(r[i]) for r in table) for i in range(len(HEADER))]
    head = f"== {w.name}: {w.jobs} x {w.nodes} = {w.pods} pods" + (
        f", {setting}" if setting else ""
    )
    body = ["  ".join(c.ljust(widths[i]) for i, c in enumerate(r)) for r in table]
    return "\n".join([head, *body, *unmeasured(w, results)])


BEGIN = "<!-- bench-scale:begin -->"
END = "<!-- bench-scale:end -->"


def replace_section(readme: str, section: str) -> str:
    """Swaps the text between the markers (appending them if absent); the rest stays."""
    block = f"{BEGIN}\n{section.rstrip()}\n{END}"
    if BEGIN in readme and END in readme:
        head, rest = readme.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    return readme.rstrip() + "\n\n" + block + "\n"


def by_setting(data: dict[str, Any]) -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """A results file's tables as [(setting, {workload: {kind: figures}})], in the order they
    ran; a file from before the runs at two limit settings (no `meta.limits`) as one table
    of setting ""."""
    meta = data.get("meta") or {}
    results = data.get("results") or {}
    if "limits" not in meta:
        return [("", results)]
    return [(s, results.get(s) or {}) for s in meta["limits"]]


def direct_of(tables: list[tuple[str, dict[str, dict[str, Any]]]], workload: str) -> dict[str, Any]:
    """The direct client's figures for `workload`, from whichever setting ran it (one)."""
    for _, results in tables:
        got = (results.get(workload) or {}).get(DIRECT)
        if got:
            return dict(got)
    return {}
