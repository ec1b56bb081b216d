"""Runs the workloads: for each, the direct client, our operator, training-operator and
Trainer v2 + JobSet, one at a time on the same cluster, each in a fresh namespace that is
emptied afterwards; then the scaling series (the operators only, on the same machinery)."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client
from localkube import procs
from localkube.testing import pick_base
from torchrun_operator.api.names import API_VERSION, PLURAL

from . import audit, figures, report, series
from .harness import (
    DIRECT_USER,
    OPERATOR_USERS,
    REPO,
    AuditLog,
    BenchCluster,
    BenchError,
    Kubeflow,
    OperatorProc,
    Ours,
    Recorder,
    api_client,
    apply_crd,
    clean_namespace,
    create_namespace,
    create_nodes,
    create_raw,
    kwok_argv,
    parallel,
    wait,
)
from .trainer import JOBSET_VERSION, TRAINER_VERSION, TrainerJobSet
from .workloads import (
    DIRECT,
    FAIL_EXIT_CODE,
    FULL,
    KUBEFLOW,
    OPERATORS,
    OURS,
    SERIES,
    SMOKE,
    SMOKE_SERIES,
    TRAINER,
    Workload,
    direct_pod,
    job_label,
    kubeflow_job,
    ours_job,
    trainer_job,
)

SHORT = {OURS: "ours", KUBEFLOW: "kf", TRAINER: "trainer", DIRECT: "direct"}
JOB_PATHS = {
    OURS: (API_VERSION, PLURAL),
    KUBEFLOW: ("kubeflow.org/v1", "pytorchjobs"),
    TRAINER: ("trainer.kubeflow.org/v1alpha1", "trainjobs"),
}
MAKE_JOB = {OURS: ours_job, KUBEFLOW: kubeflow_job, TRAINER: trainer_job}
# What a run leaves besides its jobs, pods, Services and ConfigMaps: Trainer's JobSets and
# their Jobs (deleted with their TrainJob by the garbage collector, but not at once).
LEFT_BEHIND = {TRAINER: [("jobset.x-k8s.io/v1alpha2", "jobsets"), ("batch/v1", "jobs")]}


def bin_dir() -> Path:
    env = os.environ.get("LOCALKUBE_BIN")
    if env:
        return Path(env)
    out = subprocess.run(
        ["bash", str(REPO / "cluster" / "build.sh"), "all"], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise BenchError(f"cluster/build.sh all failed:\n{out.stderr[-4000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


class Bench:
    def __init__(self, workdir: Path, kinds: list[str], workers: int, log: Any) -> None:
        self.workdir, self.kinds, self.log = workdir, kinds, log
        self.bins = bin_dir()
        missing = [b for b in ["kwok"] if not (self.bins / b).exists()]
        if missing:
            raise BenchError(f"missing {missing} in {self.bins}: run cluster/build.sh all")
        self.cluster = BenchCluster(
            workdir / "cluster", name=f"bs{os.getpid()}"[:12], base=pick_base(), nodes=[],
            die_with_parent=True,
        )  # fmt: skip
        logs = workdir / "cluster" / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        policy = workdir / "audit-policy.yaml"
        users = [u for us in OPERATOR_USERS.values() for u in us]
        policy.write_text(yaml.safe_dump(audit.policy([*users, DIRECT_USER])))
        self.audit = AuditLog(logs / "audit.log")
        BenchCluster.audit_flags = audit.apiserver_flags(str(policy), str(self.audit.path))
        self.workers = workers
        self.kwok: Any = None
        self.api: Any = None
        self.ops: dict[str, OperatorProc] = {}

    def up(self, nodes: int) -> None:
        t = time.monotonic()
        self.cluster.up(timeout=180)
        self.api = api_client(self.cluster.kubeconfig)
        cidr = f"10.{self.cluster.net.base}.128.0/17"
        self.kwok = procs.start(
            kwok_argv(self.bins, self.cluster.kubeconfig, cidr),
            self.cluster.logs_dir / "kwok.log", die_with_parent=True,
        )  # fmt: skip
        create_nodes(self.api, nodes)
        apply_crd(self.api, yaml.safe_load((REPO / "crds/torchrun.dev_distributedtrainingjobs.yaml")
                                           .read_text()))  # fmt: skip
        opdir = self.workdir / "operators"
        opdir.mkdir(exist_ok=True)
        if OURS in self.kinds:
            self.ops[OURS] = Ours(self.cluster, opdir, self.bins, self.workers)
        if KUBEFLOW in self.kinds:
            binary = self.bins / f"training-operator-{Kubeflow.version()}"
            if not binary.exists():
                raise BenchError(f"missing {binary}: run cluster/build.sh all")
            Kubeflow.install(self.api)
            self.ops[KUBEFLOW] = Kubeflow(self.cluster, opdir, self.bins)
        if TRAINER in self.kinds:
            missing = [b for b in TrainerJobSet.binaries(self.bins) if not b.exists()]
            if missing:
                raise BenchError(f"missing {missing}: run cluster/build.sh all")
            trainer = TrainerJobSet(self.cluster, opdir, self.bins)
            trainer.install(self.api)
            self.ops[TRAINER] = trainer
        self.log(f"cluster with {nodes} KWOK nodes up in {time.monotonic() - t:.0f}s")

    def down(self) -> None:
        if self.kwok is not None and self.kwok.poll() is None:
            procs.stop(self.kwok.pid, grace=5)
        for op in self.ops.values():
            op.stop()
        if self.api is not None:
            self.api.close()
        self.cluster.down()

    # -- one run ----------------------------------------------------------------------------

    def run(self, w: Workload, kind: str) -> dict[str, Any]:
        """One workload with one kind. A run that fails leaves the cluster as the next run
        expects it: its operator stopped and its namespace emptied."""
        try:
            return self._run(w, kind)
        except BenchError:
            op = self.ops.get(kind)
            if op is not None:
                op.stop()
            ns = f"{w.name}-{SHORT[kind]}"
            with contextlib.suppress(Exception):
                paths = [JOB_PATHS[kind], *LEFT_BEHIND.get(kind, [])] if kind in JOB_PATHS else []
                clean_namespace(self.api, ns, paths)
            raise

    def _run(self, w: Workload, kind: str) -> dict[str, Any]:
        ns = f"{w.name}-{SHORT[kind]}"
        create_namespace(self.api, ns)
        rec = Recorder(self.api, ns, kind, job_label(kind))
        rec.start()
        op = self.ops.get(kind)
        if op is not None:
            op.profile_label = w.name
            op.start()
        offset = self.audit.offset()
        names = w.job_names()
        timeout = 240 + 3 * w.run_seconds
        t0 = time.time()
        if kind == DIRECT:
            pods = [direct_pod(w, j, i) for j in names for i in range(w.nodes)]
            parallel(pods, lambda p: create_raw(self.api, f"/api/v1/namespaces/{ns}/pods", p))
        else:
            gv, plural = JOB_PATHS[kind]
            make = MAKE_JOB[kind]
            path = f"/apis/{gv}/namespaces/{ns}/{plural}"
            parallel([make(w, n) for n in names], lambda j: create_raw(self.api, path, j))
        fault_uid = None
        try:
            if kind == DIRECT or w.gang_restart:
                wait(
                    f"{ns}: every pod Running",
                    lambda: (
                        rec.check()
                        and len(figures.all_running_times(list(rec.pods), w.nodes)) == len(names)
                    ),
                    timeout,
                    0.1,
                )
            if w.gang_restart and kind != DIRECT:
                # Fail a pod only once the job's own status counts every pod running.
                wait(
                    f"{ns}: job status Running",
                    lambda: rec.check() and self._running(rec, names),
                    timeout,
                    0.1,
                )
                fault_uid = self._fail_one(ns, rec, names[0])
            if kind != DIRECT:
                wait(
                    f"{ns}: every job finished",
                    lambda: rec.check() and self._finished(rec, names),
                    timeout,
                    0.2,
                )
        except BenchError as e:
            raise BenchError(f"{kind} did not bring {ns} to its final state: {e}\n"
                             f"{self._job_summary(rec, names)}") from None  # fmt: skip
        t_end = time.time()
        out: dict[str, Any] = {}
        if op is not None:
            cpu, rss = op.usage()
            op.stop_profiler()
            if isinstance(op, TrainerJobSet):
                out["by_process"] = op.usage_by_process()
            op.stop()
            by_user = self.audit.count(op.users, t0, t_end, offset)
            requests = audit.total(by_user.values())
            out.update(
                cpu_s=cpu,
                peak_rss_mib=rss,
                api_requests=requests.total,
                api_requests_per_job=round(requests.total / len(names), 1),
                api_requests_by_verb=dict(requests.by_verb),
                api_requests_by_resource=dict(requests.by_resource),
            )
            if len(by_user) > 1:
                out["api_requests_by_user"] = {u: r.total for u, r in by_user.items()}
        rec.stop()
        out["watch_relists"] = rec.relists
        if rec.errors:
            raise BenchError(f"{ns}: watch errors: {rec.errors[:3]}")
        restarts = list(rec.restarts) if kind == TRAINER else None
        out.update(figures.compute(w, kind, list(rec.pods), list(rec.jobs), t0, fault_uid,
                                   restarts))  # fmt: skip
        if kind != DIRECT and out["jobs_succeeded"] != len(names):
            raise BenchError(
                f"{kind}: {out['jobs_succeeded']}/{len(names)} jobs of {ns} Succeeded, "
                f"{out['jobs_failed']} Failed\n{self._job_summary(rec, names)}"
            )
        kinds = [JOB_PATHS[kind], *LEFT_BEHIND.get(kind, [])] if kind in JOB_PATHS else []
        clean_namespace(self.api, ns, kinds)
        out["wall_s"] = round(time.time() - t0, 1)
        return out

    def _fail_one(self, ns: str, rec: Recorder, job: str) -> str:
        """Fails the job's second pod (by name: a worker, never rank 0 / the master) with exit
        code 137, as the OOM killer or a lost node would; KWOK's bench-pod-fail stage does."""
        latest = {p.uid: p for p in rec.pods if p.job == job}
        alive = sorted((p for p in latest.values() if p.phase == "Running"), key=lambda p: p.name)
        if not alive:
            raise BenchError(f"{ns}: no Running pod of {job} to fail ({len(latest)} pods seen)")
        victim = alive[1] if len(alive) > 1 else alive[0]
        client.CoreV1Api(self.api).patch_namespaced_pod(
            victim.name, ns, {"metadata": {"annotations": {FAIL_EXIT_CODE: "137"}}}
        )
        return victim.uid

    @staticmethod
    def _running(rec: Recorder, names: list[str]) -> bool:
        latest = {j.name: j for j in rec.jobs}
        return all(n in latest and latest[n].running for n in names)

    @staticmethod
    def _finished(rec: Recorder, names: list[str]) -> bool:
        latest = {j.name: j for j in rec.jobs}
        return all(n in latest and (latest[n].succeeded or latest[n].failed) for n in names)

    @staticmethod
    def _job_summary(rec: Recorder, names: list[str]) -> str:
        latest = {j.name: j for j in rec.jobs}
        lines = []
        for n in names[:10]:
            j = latest.get(n)
            lines.append(f"  {n}: {j if j else 'no status seen'}")
        return "\n".join(lines)


def machine() -> str:
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{os.cpu_count()} cores ({cpu}), Linux {platform.release()}"


HOW = f"""\
How it runs (`bench/scale`, `make bench`; `make bench-smoke` is the CI-sized version):

- One localkube control plane (etcd, kube-apiserver, controller-manager, scheduler; no process
  node) and [KWOK](https://kwok.sigs.k8s.io) v0.7.0 faking one Node per pod, each with
  `nvidia.com/gpu: 8`; every pod asks for 8 GPUs, so one pod per node as users run them.
  `bench/kwok/stages.yaml`: a bound pod turns Running and Ready at once, Succeeded (exit 0)
  after its `bench.torchrun.dev/run-seconds`, Failed when the benchmark annotates it with
  `bench.torchrun.dev/fail-exit-code`; a deleted pod goes at once.
- Our operator: `python -m torchrun_operator.main --all-namespaces` (16 workers, the default).
  Kubeflow training-operator v1.9.3, built by `cluster/build.sh all` from its Go module, as a
  local process with its own defaults (PyTorchJob only, 1 controller thread, client QPS 20 /
  burst 30, gang scheduling off). Equivalent jobs: a DistributedTrainingJob of N nodes; a
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
  pods and a headless Service; **the pods are created and tracked by Kubernetes' Job
  controller (in kube-controller-manager), whose CPU and API requests are not counted** for
  Trainer + JobSet; ours and training-operator create and watch their pods themselves. The
  Job controller's client has kube-controller-manager's default rate limit (QPS 20 / burst
  30), as in a default cluster; on the larger workloads it is throttled (`client-side
  throttling` in its log), which paces Trainer's pod creation and its jobs' status.
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
            "pods.",
            "",
        ]
        for w in (Workload(**x) for x in meta["workloads"]):
            parts += [report.markdown_table(w, data["results"][w.name]), ""]
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


def run_workloads(
    bench: Bench,
    workloads: list[Workload],
    kinds: list[str],
    results: dict[str, dict[str, Any]],
    log: Any,
) -> None:
    """Every workload with every kind, one run at a time, into results[workload][kind]; a
    failing run raises BenchError, with what ran before it in `results`."""
    failures = []
    for w in workloads:
        got = results.setdefault(w.name, {})
        for kind in kinds:
            log(f"{w.name} ({w.jobs} x {w.nodes}): {kind} ...")
            try:
                got[kind] = bench.run(w, kind)
            except BenchError as e:
                # The other kinds and workloads still run; the benchmark fails at the end.
                log(f"{w.name}: {kind} FAILED: {e}")
                failures.append(f"{w.name}/{kind}: {e}")
                continue
            log(f"{w.name}: {kind} done in {got[kind]['wall_s']}s")
    if failures:
        raise BenchError("\n".join(failures))


def render(results_json: Path, readme: Path | None) -> int:
    data = json.loads(results_json.read_text())
    if data.get("meta"):
        for w in (Workload(**x) for x in data["meta"]["workloads"]):
            print(report.text_table(w, data["results"][w.name]))
    if readme:
        if data.get("series_meta"):
            write_series_chart(data)
        update_readme(readme, data)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__)
    p.add_argument("--smoke", action="store_true", help="tiny workloads (CI)")
    p.add_argument("--kinds", default=",".join([DIRECT, *OPERATORS]))
    p.add_argument("--workloads", default="", help="comma-separated names (default: all)")
    p.add_argument("--series", action="store_true", help="run the scaling series only")
    p.add_argument("--no-series", action="store_true", help="run the tables only")
    p.add_argument("--workers", type=int, default=16, help="our operator's --workers")
    p.add_argument(
        "--json",
        type=Path,
        help="write every figure here (a run of only the "
        "tables or only the series keeps the other part of an existing file)",
    )
    p.add_argument(
        "--readme",
        type=Path,
        help="update this README's scale section (and, with "
        f"the series, {CHART.relative_to(REPO)})",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory (logs)")
    p.add_argument("--render", type=Path, help="run nothing: rebuild --readme from this JSON")
    p.add_argument("--profile", type=Path, help="py-spy our operator in every run; stacks here")
    args = p.parse_args(argv)
    if args.render:
        return render(args.render, args.readme)
    aliases = {**{v: k for k, v in SHORT.items()}, **{k: k for k in SHORT}}
    unknown = [k for k in args.kinds.split(",") if k and k not in aliases]
    if unknown:
        p.error(f"unknown --kinds {unknown}; choose from {sorted(aliases)}")
    kinds = [aliases[k] for k in args.kinds.split(",") if k]
    workloads = [] if args.series else SMOKE if args.smoke else FULL
    if args.workloads:
        wanted = set(args.workloads.split(","))
        workloads = [w for w in workloads if w.name in wanted]
    run_series = not args.no_series and not args.workloads and (args.series or not args.smoke)
    series_loads = (SMOKE_SERIES if args.smoke else SERIES) if run_series else []
    series_kinds = [k for k in kinds if k in OPERATORS]

    def log(msg: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)

    workdir = Path(tempfile.mkdtemp(prefix="bench-scale-"))
    log(f"work directory {workdir}")
    started = time.time()
    results: dict[str, dict[str, Any]] = {}
    series_results: dict[str, dict[str, Any]] = {}
    series_s = 0.0
    bench = Bench(workdir, kinds, args.workers, log)
    failed: str | None = None
    try:
        bench.up(max(w.pods for w in [*workloads, *series_loads]))
        if args.profile is not None and OURS in bench.ops:
            bench.ops[OURS].profile_dir = args.profile.resolve()
        errors = []
        try:
            run_workloads(bench, workloads, kinds, results, log)
        except BenchError as e:
            errors.append(str(e))  # the series still runs; the benchmark fails at the end
        t = time.time()
        try:
            run_workloads(bench, series_loads, series_kinds, series_results, log)
        except BenchError as e:
            errors.append(str(e))
        series_s = time.time() - t
        failed = "\n".join(errors) or None
    except BenchError as e:
        failed = str(e)
    finally:
        bench.down()
    total = time.time() - started
    for w in workloads:
        print(report.text_table(w, results.get(w.name) or {}), flush=True)
    data: dict[str, Any] = {}
    if args.json and args.json.exists() and not (workloads and series_loads):
        data = json.loads(args.json.read_text())  # keep the part this run did not redo
    when, where = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), machine()
    if workloads:
        data["meta"] = {
            "date": when, "machine": where, "total_s": total, "kinds": kinds,
            "workloads": [w.__dict__ for w in workloads],
        }  # fmt: skip
        data["results"] = results
    if series_loads:
        pts = series.points(series_results, series_loads)
        for kind, shapes in pts.items():
            for shape, figs in shapes.items():
                print(f"series {kind} {shape}: " + "; ".join(
                    f"{k} " + " ".join(f"{x}:{y:.3g}" for x, y in xy) for k, xy in figs.items()
                ), flush=True)  # fmt: skip
        data["series_meta"] = {
            "date": when, "machine": where, "total_s": series_s, "kinds": series_kinds,
            "workloads": [w.__dict__ for w in series_loads],
        }  # fmt: skip
        data["series"] = series_results
    if args.json:
        args.json.write_text(json.dumps(data, indent=1))
    if failed:
        print(f"BENCHMARK FAILED: {failed}", file=sys.stderr, flush=True)
        print(f"logs kept in {workdir}", file=sys.stderr)
        return 1
    if args.readme:
        if series_loads:
            write_series_chart(data)
        update_readme(args.readme, data)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    log(f"done in {total:.0f}s")
    return 0
