"""The operator's performance targets, judged against one results file: each target, per
workload and limit setting, with the figure, what it is held against and whether it is met.
Pure; `make bench` prints it and writes it into bench/README.md with the tables it comes from.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from . import limits, report
from .workloads import DIRECT, KUBEFLOW, OURS, Workload

Figures = dict[str, Any]


@dataclass(frozen=True)
class Target:
    label: str
    key: str  # our figure (report.value), and the other kind's where `of` names one
    unit: str
    against: str  # what the bound is, in words
    limit: float | None = None  # a fixed bound
    of: str | None = None  # or: that kind's figure of `key`, times `factor`
    factor: float = 1.0
    strict: bool = False  # met only below the bound, not at it
    gang_only: bool = False  # judged only on workloads with a gang restart

    @property
    def relative(self) -> bool:
        """The bound is another kind's figure: shown beside ours."""
        return self.of is not None

    def bound(self, kinds: dict[str, Figures]) -> float | None:
        """The figure ours must not exceed (`kinds`: the workload's figures by kind); None
        when the kind it comes from did not measure it."""
        if self.of is None:
            return self.limit
        theirs = report.value(kinds.get(self.of) or {}, self.key)
        return theirs * self.factor if isinstance(theirs, int | float) else None


TRAINING_OPERATORS = "<= training-operator's"
TARGETS = [
    Target("pod change -> job status, p95", "status_lag_p95_s", "s", "< 1 s", 1.0, strict=True),
    Target(
        "one pod fails -> every pod Running again",
        "restart_s",
        "s",
        "< 10 s",
        10.0,
        strict=True,
        gang_only=True,
    ),
    Target("operator peak RSS", "peak_rss_mib", "MiB", "<= 100 MiB", 100.0),
    Target("operator CPU", "cpu_s", "s", TRAINING_OPERATORS, of=KUBEFLOW),
    Target("API requests per job", "api_requests_per_job", "", TRAINING_OPERATORS, of=KUBEFLOW),
    Target(
        "apply -> every pod Running",
        "pods_running_s",
        "s",
        "<= 1.2 x the direct client",
        of=DIRECT,
        factor=1.2,
    ),
]


@dataclass(frozen=True)
class Verdict:
    target: Target
    workload: str
    ours: float | None
    bound: float | None

    @property
    def met(self) -> bool | None:
        if self.ours is None or self.bound is None:
            return None
        return self.ours < self.bound if self.target.strict else self.ours <= self.bound


def judge(data: dict[str, Any]) -> list[tuple[str, list[Verdict]]]:
    """[(setting, verdicts)] for every setting of the results file, in the order it ran."""
    meta = data.get("meta") or {}
    loads = [Workload(**x) for x in meta.get("workloads") or []]
    tables = report.by_setting(data)
    out = []
    for setting, results in tables:
        verdicts = []
        for w in loads:
            kinds = dict(results.get(w.name) or {})
            if OURS not in kinds:
                continue
            kinds.setdefault(DIRECT, report.direct_of(tables, w.name))
            for t in TARGETS:
                if t.gang_only and not w.gang_restart:
                    continue
                ours = report.value(kinds[OURS], t.key)
                bound = t.bound(kinds) if isinstance(ours, int | float) else None
                verdicts.append(Verdict(t, w.name, ours, bound))
        out.append((setting, verdicts))
    return out


def _cell(v: Verdict | None) -> str:
    if v is None:
        return "-"
    if v.ours is None or v.bound is None:
        return "n/a"
    unit = f" {v.target.unit}" if v.target.unit else ""
    shown = f"{report.fmt(v.ours)}{unit}"
    if v.target.relative:
        shown += f" vs {report.fmt(v.bound)}"
    return f"{shown}: {'met' if v.met else 'missed'}"


def markdown(data: dict[str, Any]) -> list[str]:
    """One table per setting: a row per target, a column per workload."""
    meta = data.get("meta") or {}
    names = [w["name"] for w in meta.get("workloads") or []]
    out: list[str] = []
    for setting, verdicts in judge(data):
        if not verdicts:
            continue
        title = limits.TITLES.get(setting, "The run")
        out += [f"**Targets: {title[0].lower()}{title[1:]}**", ""]
        out += ["| target | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        for t in TARGETS:
            row = {v.workload: v for v in verdicts if v.target is t}
            cells = [_cell(row.get(n)) for n in names]
            out.append(f"| {t.label} ({t.against}) | " + " | ".join(cells) + " |")
        out.append("")
    return out


def missed(data: dict[str, Any]) -> list[Verdict]:
    """Every verdict of the run that misses its target."""
    return [v for _, vs in judge(data) for v in vs if v.met is False]
