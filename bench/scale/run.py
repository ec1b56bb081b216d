"""Runs the workloads: for each, the direct client, our operator, training-operator and
Trainer v2 + JobSet, one at a time on the same cluster, each in a fresh namespace that is
emptied afterwards, every operator at both client-limit settings (limits.py: the anchors'
defaults, then limits raised to ours); then the scaling series (the operators only, at the
raised setting, on the same machinery)."""

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
from localkube.testing import create_namespace, pick_base
from torchrun_operator.api.names import API_VERSION, PLURAL

from . import audit, figures, limits, readme, series
from .harness import (
    DIRECT_USER,
    KCM_USER,
    OPERATOR_USERS,
    REPO,
    AuditLog,
    BenchCluster,
    BenchError,
    Recorder,
    api_client,
    apply_crd,
    clean_namespace,
    create_nodes,
    create_raw,
    kwok_argv,
    parallel,
    wait,
)
from .operators import Kubeflow, OperatorProc, Ours, proc_cpu_seconds
from .trainer import TrainerJobSet
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
        policy.write_text(yaml.safe_dump(audit.policy([*users, DIRECT_USER, KCM_USER])))
        self.audit = AuditLog(logs / "audit.log")
        BenchCluster.audit_flags = audit.apiserver_flags(str(policy), str(self.audit.path))
        self.workers = workers
        self.kwok: Any = None
        self.api: Any = None
        self.ops: dict[str, OperatorProc] = {}

    def use_limits(self, setting: str) -> None:
        """The client limits of `setting` for the runs that follow: the operators' flags
        for their next start, and kube-controller-manager's (restarted if they change)."""
        for kind, op in self.ops.items():
            op.extra_args = limits.flags(kind, setting, self.workers)
        kcm = limits.controller_manager_flags(setting, self.workers)
        if self.cluster.set_controller_manager_flags(kcm):
            time.sleep(5.0)  # its informers list everything again and settle
            self.log(f"kube-controller-manager restarted with {kcm or 'its defaults'}")

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
        kcm_pid = self.cluster.controller_manager_pid()
        kcm_cpu0 = proc_cpu_seconds(kcm_pid)
        t0 = time.time()
        if kind == DIRECT:
            pods = [direct_pod(w, j, i) for j in names for i in range(w.nodes)]
            parallel(pods, lambda p: create_raw(self.api, f"/api/v1/namespaces/{ns}/pods", p))
        else:
            gv, plural = JOB_PATHS[kind]
            make = MAKE_JOB[kind]
            path = f"/apis/{gv}/namespaces/{ns}/{plural}"
            parallel([make(w, n) for n in names], lambda j: create_raw(self.api, path, j))
        fault_uid: str | None = None
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
                # Fail a pod only once the job's own status counts every pod running. A status
                # that catches up only after the pods have finished leaves none to fail: that
                # is the anchor's figure, recorded, not a failed run.
                wait(
                    f"{ns}: job status Running",
                    lambda: (
                        rec.check()
                        and (self._running(rec, names) or self._none_left(rec, names[0]))
                    ),
                    timeout,
                    0.1,
                )
                target = figures.victim(list(rec.pods), names[0])
                if target is not None:
                    fault_uid = self._fail(ns, target)
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
        kcm_cpu = proc_cpu_seconds(kcm_pid) - kcm_cpu0
        out: dict[str, Any] = {}
        if op is not None:
            cpu, rss = op.usage()
            if isinstance(op, Ours) and (waited := op.rate_limit_wait()) is not None:
                out["rate_limit_wait_sum_s"] = round(waited[0], 2)
                out["rate_limit_requests"] = waited[1]
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
            out.update(self._controller_manager(len(names), kcm_cpu, t0, t_end, offset))
        rec.stop()
        out["watch_relists"] = rec.relists
        if rec.errors:
            raise BenchError(f"{ns}: watch errors: {rec.errors[:3]}")
        restarts = list(rec.restarts) if kind == TRAINER else None
        out.update(figures.compute(w, kind, list(rec.pods), list(rec.jobs), t0, fault_uid,
                                   restarts))  # fmt: skip
        if w.gang_restart and kind != DIRECT and fault_uid is None:
            out["restart_not_run"] = figures.NO_POD_TO_FAIL
        if kind != DIRECT and out["jobs_succeeded"] != len(names):
            raise BenchError(
                f"{kind}: {out['jobs_succeeded']}/{len(names)} jobs of {ns} Succeeded, "
                f"{out['jobs_failed']} Failed\n{self._job_summary(rec, names)}"
            )
        kinds = [JOB_PATHS[kind], *LEFT_BEHIND.get(kind, [])] if kind in JOB_PATHS else []
        clean_namespace(self.api, ns, kinds)
        out["wall_s"] = round(time.time() - t0, 1)
        return out

    def _controller_manager(
        self, jobs: int, cpu: float, t0: float, t_end: float, offset: int
    ) -> dict[str, Any]:
        """kube-controller-manager's share of a run: its whole CPU (one process for every
        controller), its requests, and its Job controller's (by user agent)."""
        by_agent = self.audit.by_agent(KCM_USER, t0, t_end, offset)
        every = audit.total(by_agent.values())
        job = by_agent.get(audit.JOB_CONTROLLER) or audit.Requests()
        return {
            "kcm_cpu_s": round(cpu, 2),
            "kcm_requests_per_job": round(every.total / jobs, 1),
            "kcm_requests_by_controller": {a or "(unnamed)": r.total
                                           for a, r in sorted(by_agent.items())},
            "job_controller_requests_per_job": round(job.total / jobs, 1),
            "job_controller_requests_by_verb": dict(job.by_verb),
        }  # fmt: skip

    def _fail(self, ns: str, pod: figures.PodObs) -> str:
        """Fails the pod with exit code 137, as the OOM killer or a lost node would; KWOK's
        bench-pod-fail stage does."""
        client.CoreV1Api(self.api).patch_namespaced_pod(
            pod.name, ns, {"metadata": {"annotations": {FAIL_EXIT_CODE: "137"}}}
        )
        return pod.uid

    @staticmethod
    def _none_left(rec: Recorder, job: str) -> bool:
        return figures.victim(list(rec.pods), job) is None

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


# The scaling series runs at one setting: ours at its defaults, the anchors raised to match.
SERIES_LIMITS = limits.RAISED


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


def render(results_json: Path, readme_path: Path | None) -> int:
    data = json.loads(results_json.read_text())
    if data.get("meta"):
        print(readme.printed(data))
    if readme_path:
        if data.get("series_meta"):
            readme.write_series_chart(data)
        readme.update_readme(readme_path, data)
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
        f"the series, {readme.CHART.relative_to(REPO)})",
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
    runs = limits.plan(workloads, kinds, limits.SMOKE_RAISED if args.smoke else None)
    results: dict[str, dict[str, dict[str, Any]]] = {s: {} for s, _, _ in runs}
    series_results: dict[str, dict[str, Any]] = {}
    series_s = 0.0
    bench = Bench(workdir, kinds, args.workers, log)
    failed: str | None = None
    try:
        bench.up(max(w.pods for w in [*workloads, *series_loads]))
        if args.profile is not None and OURS in bench.ops:
            bench.ops[OURS].profile_dir = args.profile.resolve()
        errors = []
        for setting, loads, run_kinds in runs if workloads else []:
            log(f"limits: {setting}")
            bench.use_limits(setting)
            try:
                run_workloads(bench, loads, run_kinds, results[setting], log)
            except BenchError as e:
                errors.append(str(e))  # the rest still runs; the benchmark fails at the end
        t = time.time()
        if series_loads:
            bench.use_limits(SERIES_LIMITS)
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
    data: dict[str, Any] = {}
    if args.json and args.json.exists() and not (workloads and series_loads):
        data = json.loads(args.json.read_text())  # keep the part this run did not redo
    when, where = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), machine()
    if workloads:
        data["meta"] = {
            "date": when, "machine": where, "total_s": total, "kinds": kinds,
            "workloads": [w.__dict__ for w in workloads],
            "limits": {s: limits.describe(s, args.workers) for s in results},
        }  # fmt: skip
        data["results"] = results
        print(readme.printed(data), flush=True)
    if series_loads:
        pts = series.points(series_results, series_loads)
        for kind, shapes in pts.items():
            for shape, figs in shapes.items():
                print(f"series {kind} {shape}: " + "; ".join(
                    f"{k} " + " ".join(f"{x}:{y:.3g}" for x, y in xy) for k, xy in figs.items()
                ), flush=True)  # fmt: skip
        data["series_meta"] = {
            "date": when, "machine": where, "total_s": series_s, "kinds": series_kinds,
            "workloads": [w.__dict__ for w in series_loads], "limits": SERIES_LIMITS,
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
            readme.write_series_chart(data)
        readme.update_readme(args.readme, data)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    log(f"done in {total:.0f}s")
    return 0
