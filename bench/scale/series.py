"""The scaling series: each operator's CPU-seconds and API requests per pod as the size grows,
for one gang job of N pods and for N one-pod jobs. Its runs are the benchmark's ordinary runs
(run.Bench.run); this turns their figures into per-pod points, a table and a chart. Pure,
except write_chart (matplotlib, bench/requirements.txt)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .workloads import (
    KUBEFLOW,
    OPERATORS,
    OURS,
    SERIES_GANG,
    SERIES_SINGLES,
    TRAINER,
    Workload,
    series_shape,
)

# (figure in a run's results, what the chart and table call it per pod)
PANELS = [("cpu_s", "operator CPU-seconds per pod"), ("api_requests", "API requests per pod")]
SHAPES = {SERIES_GANG: "1 job of N pods", SERIES_SINGLES: "N jobs of 1 pod"}
LINESTYLE = {SERIES_GANG: "-", SERIES_SINGLES: "--"}
COLOR = {OURS: "tab:blue", KUBEFLOW: "tab:orange", TRAINER: "tab:green"}

Points = dict[str, dict[str, dict[str, list[tuple[int, float]]]]]  # kind -> shape -> figure


def per_pod(result: dict[str, Any], key: str, pods: int) -> float | None:
    v = result.get(key)
    return None if v is None or pods <= 0 else float(v) / pods


def points(results: dict[str, dict[str, dict[str, Any]]], workloads: list[Workload]) -> Points:
    """Per operator and shape, each figure per pod against N (pods), in order of N; runs or
    figures that are missing are left out."""
    out: Points = {}
    for w in sorted(workloads, key=lambda w: w.pods):
        for kind, result in (results.get(w.name) or {}).items():
            if kind not in OPERATORS:
                continue
            shape = out.setdefault(kind, {}).setdefault(series_shape(w), {})
            for key, _ in PANELS:
                v = per_pod(result, key, w.pods)
                if v is not None:
                    shape.setdefault(key, []).append((w.pods, v))
    return out


def _fmt(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 10 else f"{v:.1f}"


def markdown_table(
    results: dict[str, dict[str, dict[str, Any]]], workloads: list[Workload], labels: dict[str, str]
) -> str:
    kinds = [k for k in OPERATORS if any(k in (results.get(w.name) or {}) for w in workloads)]
    head = ["workload", *(f"{labels[k]}: {p.split(' per ')[0].replace('operator ', '')}"
                          for _, p in PANELS for k in kinds)]  # fmt: skip
    lines = [
        "Per pod, over each run: operator CPU-seconds and API requests.",
        "",
        "| " + " | ".join(head) + " |",
        "| " + " | ".join(["---"] + ["---:"] * (len(head) - 1)) + " |",
    ]
    for w in sorted(workloads, key=lambda w: (series_shape(w), w.pods)):
        got = results.get(w.name) or {}
        name = f"{w.jobs} job x {w.nodes} pods" if w.jobs == 1 else f"{w.jobs} jobs x 1 pod"
        cells = [_fmt(per_pod(got.get(k) or {}, key, w.pods)) for key, _ in PANELS for k in kinds]
        lines.append("| " + " | ".join([name, *cells]) + " |")
    return "\n".join(lines)


def write_chart(path: Path, pts: Points, labels: dict[str, str], title: str) -> None:
    """Two panels (CPU-seconds per pod, API requests per pod) against N, log-scaled; one
    colour per operator, solid for one job of N pods, dashed for N one-pod jobs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(12, 4.6))
    ticks: set[int] = set()
    for ax, (key, ylabel) in zip(axes, PANELS, strict=True):
        for kind in OPERATORS:
            for shape, style in LINESTYLE.items():
                xy = ((pts.get(kind) or {}).get(shape) or {}).get(key) or []
                if not xy:
                    continue
                xs, ys = zip(*xy, strict=True)
                ticks.update(xs)
                ax.plot(xs, ys, style, marker="o", color=COLOR[kind],
                        label=f"{labels[kind]}, {SHAPES[shape]}")  # fmt: skip
        ax.set_xscale("log")
        ax.set_xlabel("N (pods)")
        ax.set_ylabel(ylabel)
        ax.set_ylim(bottom=0)
        ax.grid(True, which="both", alpha=0.3)
    for ax in axes:
        ax.set_xticks(sorted(ticks), [str(t) for t in sorted(ticks)])
        ax.minorticks_off()
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(handles, names, loc="lower center", ncol=3, fontsize="small", frameon=False)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
