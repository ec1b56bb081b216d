"""The two client-limit settings every operator runs at in one `make bench`, and the flags
that set them. Pure.

- DEFAULTS: each anchor at its defaults (training-operator: 1 controller thread, client QPS 20
  / burst 30; kube-controller-manager, whose Job controller creates Trainer's pods: QPS 20 /
  burst 30, 5 concurrent Job syncs); ours limited to the anchors' QPS 20 / burst 30.
- RAISED: ours at its defaults (ratelimit.DEFAULT_QPS / DEFAULT_BURST, `--workers`); each
  anchor raised to match where it has a flag for it.

What an anchor does not expose, or already runs above ours, is left as it is (NOT_RAISED).
"""

from __future__ import annotations

from dataclasses import dataclass

from torchrun_operator.kube import ratelimit

from .workloads import KUBEFLOW, OPERATORS, OURS, TRAINER, Workload

DEFAULTS = "defaults"
RAISED = "raised"
SETTINGS = [DEFAULTS, RAISED]


@dataclass(frozen=True)
class Limits:
    qps: float
    burst: int
    workers: int  # reconciles (threads, syncs) at once


# training-operator v1.9.3's flag defaults (cmd/training-operator.v1/main.go), which are also
# kube-controller-manager's client defaults; its --concurrent-job-syncs defaults to 5.
ANCHOR_QPS, ANCHOR_BURST = 20.0, 30
KUBEFLOW_THREADS = 1
JOB_SYNCS = 5


def ours(workers: int) -> Limits:
    """Our operator's defaults: what RAISED raises the anchors to."""
    return Limits(ratelimit.DEFAULT_QPS, ratelimit.DEFAULT_BURST, workers)


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


def ours_flags(setting: str) -> list[str]:
    """Ours: at DEFAULTS limited to the anchors' defaults; at RAISED its own defaults."""
    if setting == DEFAULTS:
        return [f"--kube-api-qps={_num(ANCHOR_QPS)}", f"--kube-api-burst={ANCHOR_BURST}"]
    return []


def kubeflow_flags(setting: str, workers: int) -> list[str]:
    """training-operator: `--controller-threads`, `--kube-api-qps`, `--kube-api-burst`."""
    if setting == DEFAULTS:
        return []
    to = ours(workers)
    return [f"--controller-threads={to.workers}", f"--kube-api-qps={_num(to.qps)}",
            f"--kube-api-burst={to.burst}"]  # fmt: skip


def controller_manager_flags(setting: str, workers: int) -> list[str]:
    """kube-controller-manager, for Trainer + JobSet (its Job controller creates and tracks
    their pods): one client for all its controllers, and the Job controller's syncs."""
    if setting == DEFAULTS:
        return []
    to = ours(workers)
    return [f"--kube-api-qps={_num(to.qps)}", f"--kube-api-burst={to.burst}",
            f"--concurrent-job-syncs={to.workers}"]  # fmt: skip


def flags(kind: str, setting: str, workers: int) -> list[str]:
    """The operator process's own extra flags for `setting` (Trainer's and JobSet's: none)."""
    if kind == OURS:
        return ours_flags(setting)
    if kind == KUBEFLOW:
        return kubeflow_flags(setting, workers)
    return []


# What RAISED leaves as released, and why: said in the report next to the tables.
NOT_RAISED = {
    TRAINER: (
        "Trainer's own client already runs at QPS 50 / burst 100 (its release's "
        "clientConnection, as ours) and its TrainJob concurrency (5) is not applied by "
        "controller-runtime to its controller; JobSet's client runs at QPS 500 / burst 500 "
        "and it exposes no worker count: neither is changed, only kube-controller-manager's "
        "client and Job syncs are raised"
    ),
}


def describe(setting: str, workers: int) -> dict[str, str]:
    """Per kind, the limits it ran at in `setting`, in words (the tables' headings)."""
    to = ours(workers)
    if setting == DEFAULTS:
        return {
            OURS: f"QPS {_num(ANCHOR_QPS)} / burst {ANCHOR_BURST}, {workers} workers",
            KUBEFLOW: f"its defaults: QPS {_num(ANCHOR_QPS)} / burst {ANCHOR_BURST}, "
            f"{KUBEFLOW_THREADS} controller thread",
            TRAINER: "release configurations; kube-controller-manager at its defaults: "
            f"QPS {_num(ANCHOR_QPS)} / burst {ANCHOR_BURST}, {JOB_SYNCS} Job syncs",
        }
    return {
        OURS: f"its defaults: QPS {_num(to.qps)} / burst {to.burst}, {to.workers} workers",
        KUBEFLOW: f"`{' '.join(kubeflow_flags(setting, workers))}`",
        TRAINER: "release configurations; kube-controller-manager with "
        f"`{' '.join(controller_manager_flags(setting, workers))}`",
    }


TITLES = {
    DEFAULTS: "At the anchors' defaults (client QPS 20 / burst 30; ours limited to the same)",
    RAISED: "At raised limits (ours at its defaults; the anchors raised to match)",
}


# `--smoke` runs RAISED for this workload only (the cheapest: a few one-pod jobs), so the CI
# smoke costs about what it did with one setting and still starts every operator, and
# kube-controller-manager, with the raised flags.
SMOKE_RAISED = {"small"}


def plan(
    workloads: list[Workload], kinds: list[str], raised_only: set[str] | None = None
) -> list[tuple[str, list[Workload], list[str]]]:
    """[(setting, workloads, kinds)] in the order they run: every workload at DEFAULTS with
    every kind, then at RAISED with the operators only (the direct client has no limit to
    raise: it runs once per workload). `raised_only`: the workloads run at RAISED (None:
    every one). One setting after the other, so kube-controller-manager restarts once."""
    out = [(DEFAULTS, list(workloads), list(kinds))]
    again = [w for w in workloads if raised_only is None or w.name in raised_only]
    operators = [k for k in kinds if k in OPERATORS]
    if again and operators:
        out.append((RAISED, again, operators))
    return out
