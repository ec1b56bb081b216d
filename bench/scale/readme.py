"""bench/README.md's generated section (between report.BEGIN and report.END) from a results
file: the tables at both limit settings, the scaling series and how it all runs (HOW)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from . import limits, report, series, targets
from .trainer import JOBSET_VERSION, TRAINER_VERSION
from .workloads import KUBEFLOW, OURS, TRAINER, Workload

HOW = f"""\
How it runs (`bench/scale`, `make bench`; `make bench-smoke` is the CI-sized version):

- One localkube control plane (etcd, kube-apiserver, controller-manager, scheduler; no process
  node) and [KWOK](https://kwok.sigs.k8s.io) v0.7.0 faking one Node per pod, each with
  `nvidia.com/gpu: 8`; every pod asks for 8 GPUs, so one pod per node as users run them.
  `bench/kwok/stages.yaml`: a bound pod turns Running and Ready at once, Succeeded (exit 0)
  after its `bench.torchrun.dev/run-seconds`, Failed when the benchmark annotates it with
  `bench.torchrun.dev/fail-exit-code`; a deleted pod goes at once.
- Two client-limit settings, every operator at both in the same run, one table each (the
  direct client, which has no limit to vary, runs once per workload, in the first):
  **defaults**: every anchor as released (training-operator: 1 controller thread, client
  QPS 20 / burst 30; kube-controller-manager: QPS 20 / burst 30, `--concurrent-job-syncs` 5)
  and ours limited to the same QPS 20 / burst 30 (`--kube-api-qps 20 --kube-api-burst 30`);
  **raised**: ours at its defaults (QPS 50 / burst 100, 16 workers) and the anchors raised to
  match where they have a flag for it: training-operator `--controller-threads=16
  --kube-api-qps=50 --kube-api-burst=100` (its only limits: `cmd/training-operator.v1/main.go`
  of v1.9.3), kube-controller-manager `--kube-api-qps=50 --kube-api-burst=100
  --concurrent-job-syncs=16` (restarted between the settings; one client for all its
  controllers). Trainer's own client already runs at QPS 50 / burst 100 (its release's
  `clientConnection`) and JobSet's at 500 / 500; neither exposes a worker count that takes
  effect (below), so both run as released in either setting. Ours keeps its 16 workers in
  both. The scaling series runs at **raised** only.
- Our operator: `python -m torchrun_operator.main --all-namespaces` (16 workers, the default;
  client QPS and burst per setting).
  Kubeflow training-operator v1.9.3, built by `cluster/build.sh all` from its Go module, as a
  local process (PyTorchJob only, gang scheduling off; threads and client limits per
  setting). Equivalent jobs: a DistributedTrainingJob of N nodes; a
  PyTorchJob of 1 Master + N-1 Workers, `restartPolicy: ExitCode`. Each runs alone, started
  fresh, in a namespace of its own that is emptied before the next run.
- Kubeflow Trainer {TRAINER_VERSION} and JobSet {JOBSET_VERSION} (the JobSet that Trainer's
  go.mod requires and its manifests install), built by `cluster/build.sh all` from their Go
  modules, as two local processes started and stopped together, each with its release's
  configuration but for what a host process needs: servers on 127.0.0.1, no leader election,
  no certificate management, logging at info. Trainer: client QPS 50 / burst 100, one
  TrainJob worker (its configuration asks for 5, which controller-runtime does not apply to
  a controller without a `For` type, as Trainer's is: its log says `worker count: 1`);
  JobSet: QPS 500 / burst 500, one JobSet worker and one pod worker. Their webhooks (TrainJob
  and JobSet defaulting and validation, JobSet's pod webhooks) are served, not left out: they
  are on every job's path in a real installation (the apiserver calls JobSet for each of its
  pods), and neither binary can turn its webhook server off. Their certificate management
  (a Secret for a Service, mounted by a kubelet) cannot work for host processes, so it is
  off, and they serve a certificate from the cluster's CA, the webhook configurations calling
  127.0.0.1, as localkube does for Kueue. CRDs, webhooks, configurations and the runtime are
  read from the Go module cache. Equivalent job:
  a TrainJob on the `torch-distributed` ClusterTrainingRuntime of Trainer's manifests,
  `numNodes` N, the same image, command and GPU limit, the KWOK annotation through
  `runtimePatches`. The runtime gets a restart policy it lacks: `backoffLimit: 0` on its
  `node` Job and `failurePolicy.maxRestarts: 3` on the JobSet, so a failed pod fails its Job
  and JobSet recreates the whole gang. Trainer makes one JobSet, JobSet one indexed Job of N
  pods and a headless Service; the pods are created and tracked by Kubernetes' Job controller
  (in kube-controller-manager); ours and training-operator create and watch their pods
  themselves. **The Job controller's API requests are counted, in rows of their own** (not in
  "API requests per job", which is the operator's own): kube-controller-manager runs as a user
  of its own (`bench-kube-controller-manager`, `--use-service-account-credentials=false`), and
  client-go names each of its controllers' clients in the user agent (`.../job-controller`),
  so the audit log tells the Job controller's requests from the others'; its informers' list
  and watch requests are shared by all its controllers (`shared-informers`) and are not in
  the Job controller's row, only in the all-controllers row. **Its CPU is not counted
  separately**: one process runs every controller, so the table gives kube-controller-manager's
  whole CPU over each run, for every kind (what the other kinds cause it to do, such as
  endpoint slices for their Services, is in theirs too). At the **defaults** setting the Job
  controller's client has kube-controller-manager's default limit (QPS 20 / burst 30), as in
  a default cluster; on the larger workloads it is throttled (`client-side throttling` in its
  log), which paces Trainer's pod creation and its jobs' status.
- Times come from the benchmark's own watches on pods and jobs (its clock on arrival).
  "Job status" lag: the k-th pod of a job to start (or finish) is reflected once the job's
  status counts k started (finished) pods: our `status.nodes`, training-operator's
  `replicaStatuses`. Trainer's TrainJob counts child Jobs, not pods: `status.jobsStatus`
  (which Trainer copies from its JobSet's `replicatedJobsStatus`) says per replicated job how
  many Jobs are `ready` (ready + succeeded pods >= the Job's parallelism), `succeeded` and
  `failed`; with one Job of N pods, only the last pod to start (reflected once `ready`,
  `succeeded` or `failed` is 1) and the last pod to finish (`succeeded` or `failed` is 1) are
  samples. A TrainJob is Running when each replicated job has a ready or succeeded Job,
  Succeeded at its `Complete` condition; it says Restarting when its JobSet's
  `status.restarts` is above 0. API requests: the apiserver's audit log (metadata, one event
  per request) counted by the operator's user (Trainer's and JobSet's users summed), from the
  first create to the last job finished. CPU and peak RSS: `/proc/<pid>` of the operator
  process (utime+stime over the run, VmHWM); for Trainer + JobSet both processes' summed (the
  sum of two peaks: an upper bound of their peak together).
- Gang restart (512-node job): once the job says Running, one worker pod is failed with exit
  code 137. Ours deletes and recreates all 512 pods (a new rendezvous), after waiting 10 s
  for other nodes' reports (`SETTLE_SECONDS`: a pod failing on its own, while the others keep
  running, is what KWOK shows; with real torchrun the others exit within seconds and the wait
  ends early); no back-off (`backoffSeconds: 0`). training-operator replaces only the failed
  pod, so the other 511 keep a rendezvous that real torchrun would have torn down. Trainer +
  JobSet: the Job fails, JobSet deletes it (foreground: its pods first) and creates it anew,
  whose 512 pods the Job controller creates.
- training-operator marks a PyTorchJob Succeeded when its Master succeeds, so "last pod
  finished -> job Succeeded" can be negative for it (workers still running).
- Scaling series (`python -m bench.scale --series`; `make bench` runs it after the tables):
  one job of 64, 128, 256 and 512 pods, and 100, 250 and 500 one-pod jobs, each pod Running
  15 s, the operators only, each run as above (fresh operator, own namespace); the figures per
  pod are the run's operator CPU and API requests divided by its pods.
"""

CHART = Path(__file__).resolve().parent / "scaling.png"
KIND_LABELS = {
    OURS: "torchrun-operator",
    KUBEFLOW: "training-operator v1.9.3",
    TRAINER: f"Trainer {TRAINER_VERSION} + JobSet {JOBSET_VERSION}",
}


def series_section(data: dict[str, Any], chart: str) -> list[str]:
    meta = data["series_meta"]
    loads = [Workload(**w) for w in meta["workloads"]]
    return [
        "### Scaling: operator CPU and API requests per pod",
        "",
        f"Measured {meta['date']} on {meta['machine']} ({meta['total_s'] / 60:.0f} min). "
        "Solid: one job of N pods; dashed: N jobs of one pod.",
        "",
        f"![operator CPU-seconds and API requests per pod against N]({chart})",
        "",
        series.markdown_table(data["series"], loads, KIND_LABELS),
        "",
    ]


LEGACY_TITLE = (
    "One setting (a results file from before the runs at two limit settings: the limits each "
    "operator ran at are not recorded in it)"
)


def limits_line(described: dict[str, str]) -> str:
    """The limits each kind ran at, in one line under a table's heading."""
    return (
        "Limits: "
        + "; ".join(
            f"{KIND_LABELS[k]}: {described[k]}" for k in (OURS, KUBEFLOW, TRAINER) if k in described
        )
        + "."
    )


def tables_section(data: dict[str, Any], text: bool = False) -> list[str]:
    """Every table of the results file, setting by setting: a heading, the limits each kind
    ran at, then one table per workload (markdown, or the printed text form)."""
    meta = data.get("meta") or {}
    loads = [Workload(**x) for x in meta.get("workloads") or []]
    tables = report.by_setting(data)
    out: list[str] = []
    for setting, results in tables:
        title = limits.TITLES.get(setting, LEGACY_TITLE)
        described = (meta.get("limits") or {}).get(setting) or {}
        out += [f"=== {title}" if text else f"### {title}", ""]
        if described:
            out += [limits_line(described), ""]
        for w in loads:
            if w.name not in results:
                continue
            direct = report.direct_of(tables, w.name)
            got = results[w.name]
            if text:
                out += [report.text_table(w, got, direct, setting), ""]
            else:
                out += [report.markdown_table(w, got, direct), ""]
    return out


def printed(data: dict[str, Any]) -> str:
    """What a run prints: its tables in text, then the targets judged against them."""
    return "\n".join([*tables_section(data, text=True), *targets.markdown(data)])


def readme_section(data: dict[str, Any], chart: str = "scale/scaling.png") -> str:
    """The README's generated section from a results file: the tables, the series, HOW."""
    parts = [
        "## Control-plane scale (KWOK), side by side with Kubeflow training-operator and "
        "Trainer v2 + JobSet",
        "",
    ]
    meta = data.get("meta")
    if meta:
        parts += [
            f"Measured {meta['date']} on {meta['machine']}, `make bench` "
            f"({meta['total_s'] / 60:.0f} minutes in all). Ratio = the other operator / ours: "
            "above 1, ours is lower (better) on that line. The direct client creates the same "
            "pods with no operator (16 threads): the machine's limit for creating and starting "
            "pods."
            + (
                " Every operator ran at two client-limit settings (how: below), one table each."
                if meta.get("limits")
                else ""
            ),
            "",
        ]
        parts += tables_section(data)
        parts += ["### The targets, against this run", "", *targets.markdown(data)]
    if data.get("series_meta"):
        parts += series_section(data, chart)
    parts += [HOW]
    notes = (meta or {}).get("notes") or []
    if notes:
        parts += ["Notes from this run:", "", *[f"- {n}" for n in notes], ""]
    return "\n".join(parts)


def write_series_chart(data: dict[str, Any], path: Path = CHART) -> None:
    meta = data["series_meta"]
    loads = [Workload(**w) for w in meta["workloads"]]
    title = f"bench/scale series, {meta['date']}, {meta['machine'].split(' (')[0]}"
    series.write_chart(path, series.points(data["series"], loads), KIND_LABELS, title)


def update_readme(readme: Path, data: dict[str, Any]) -> None:
    text = readme.read_text() if readme.exists() else "# Benchmarks\n"
    readme.write_text(report.replace_section(text, readme_section(data)))
