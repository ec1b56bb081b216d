"""Fault-injection campaign: real jobs under seeded random fault schedules, on the real
local cluster (docs/reliability.md).

Each scenario (a job that succeeds, one whose rank raises, an infrastructure failure healed
by a gang restart, suspend and resume, a TTL) first runs once without faults: its outcome is
the reference. Then it runs again and again, each time with an operator whose own API
requests fail as the schedule says (kube/faults.py: 500, 409, 429, a timeout, a response
lost after the write, SIGKILL right before or after a request). A killed operator is started
again at once, with the faults not yet injected. After every run:

- the job finished (no job left unfinished), and its outcome (phase, root cause, counters,
  restart records) equals the reference;
- at no moment did two live pods share a pod index and an attempt (a pod watch checks every
  event);
- no pod outlived the job's end except as cleanPodPolicy keeps (KeepFailed: Failed pods).

    python tests/integration/faultrun.py --faults 200 --seed 1 --table docs/reliability.md

starts its own local cluster (LOCALKUBE_BIN: cluster/build.sh all) and prints the table;
tests/integration/test_fault_injection.py runs a small seeded campaign in every CI run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# As pytest's rootdir conftest does: the shared test helpers (tests/jobs.py) and our packages.
sys.path[:0] = [
    str(HERE),
    str(HERE.parent),
    str(HERE.parents[1] / "operator"),
    str(HERE.parents[1] / "cluster"),
]

from dtj import (  # noqa: E402
    GROUP,
    JOB_LABEL,
    PLURAL,
    VERSION,
    OperatorProcess,
    create_job,
    quick_job,
)
from kubernetes import client, config, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from localkube.testing import create_namespace, wait_for  # noqa: E402
from torchrun_operator.api import names  # noqa: E402

FINISHED = ("Succeeded", "Failed")
JOB_TIMEOUT = 240.0
# Where a fault can strike: the operator's own requests, by method and path.
TARGETS: dict[str, tuple[str, str]] = {
    "status-write": ("PATCH", r"/distributedtrainingjobs/[^/]+/status"),
    "pod-create": ("POST", r"/pods$"),
    "pod-delete": ("DELETE", r"/pods/[^/?]+"),
    "child-create": ("POST", r"/(services|configmaps|networkpolicies)$"),
    "job-read": ("GET", r"/distributedtrainingjobs/[^/?]+$"),
    "job-delete": ("DELETE", r"/distributedtrainingjobs/[^/?]+$"),
}
ACTIONS: list[dict[str, Any]] = [
    {"action": "status", "status": 500},
    {"action": "status", "status": 409},
    {"action": "status", "status": 429, "retry_after": 1},
    {"action": "timeout"},
    {"action": "lose_response"},
    {"action": "kill_before"},
    {"action": "kill_after"},
]
KILLS = ("kill_before", "kill_after")


def py(code: str) -> list[str]:
    return ["python", "-c", code]


@dataclass
class Scenario:
    name: str
    doc: Callable[[str], dict[str, Any]]
    # Something the driver does while the job runs (suspend and resume), or None.
    during: Callable[[client.ApiClient, str, str], None] | None = None
    ttl: bool = False


def _raise_on_rank_1(name: str) -> dict[str, Any]:
    doc = quick_job(name)
    code = "import os\nif os.environ['RANK'] == '1':\n    raise RuntimeError('rank 1 fails')"
    doc["spec"]["template"]["spec"]["containers"][0]["command"] = py(code)
    doc["spec"]["failurePolicy"] = {"maxRestarts": 2, "backoffSeconds": 1}
    return doc


def _retryable_once(name: str) -> dict[str, Any]:
    """Rank 0 exits 3 (listed as retryable) in attempt 0 only: TORCHELASTIC_RUN_ID is the
    rendezvous id, `<job uid>-<attempt>`."""
    doc = quick_job(name)
    code = (
        "import os, sys\n"
        "first = os.environ['TORCHELASTIC_RUN_ID'].endswith('-0')\n"
        "sys.exit(3 if first and os.environ['RANK'] == '0' else 0)"
    )
    doc["spec"]["template"]["spec"]["containers"][0]["command"] = py(code)
    doc["spec"]["failurePolicy"] = {
        "maxRestarts": 2,
        "backoffSeconds": 1,
        "retryableExitCodes": [3],
    }
    return doc


def _long(name: str) -> dict[str, Any]:
    doc = quick_job(name)
    doc["spec"]["template"]["spec"]["containers"][0]["command"] = py("import time; time.sleep(6)")
    return doc


def _ttl(name: str) -> dict[str, Any]:
    doc = quick_job(name)
    doc["spec"]["runPolicy"] = {"ttlSecondsAfterFinished": 3}
    return doc


def _suspend_then_resume(api: client.ApiClient, ns: str, name: str) -> None:
    custom = client.CustomObjectsApi(api)
    core = client.CoreV1Api(api)

    def phase() -> str | None:
        job: Any = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        return (job.get("status") or {}).get("phase")

    wait_for("Running", lambda: phase() in ("Running", *FINISHED), 120, interval=0.3)
    patch = {"spec": {"runPolicy": {"suspend": True}}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, patch)

    def quiet() -> bool:
        pods = core.list_namespaced_pod(ns, label_selector=f"{JOB_LABEL}={name}").items
        return phase() == "Suspended" and not pods

    wait_for("Suspended with no pods", quiet, 120, interval=0.3)
    patch = {"spec": {"runPolicy": {"suspend": False}}}
    custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name, patch)


SCENARIOS = [
    Scenario("success", quick_job),
    Scenario("user-failure", _raise_on_rank_1),
    Scenario("gang-restart", _retryable_once),
    Scenario("suspend-resume", _long, during=_suspend_then_resume),
    Scenario("ttl", _ttl, ttl=True),
]


def outcome(job: dict[str, Any]) -> dict[str, Any]:
    """What must not depend on faults: phase, root cause, counters, restart history."""
    st = job.get("status") or {}
    failure = st.get("failure") or {}
    return {
        "phase": st.get("phase"),
        "attempt": st.get("attempt"),
        "counters": st.get("counters"),
        # Which pod holds which ranks is c10d's choice (by address): compare the rank and
        # what went wrong, not where.
        "failure": {k: failure.get(k) for k in ("rank", "kind", "reason", "exitCode")},
        "restarts": [
            (r.get("attempt"), r.get("kind"), r.get("reason")) for r in st.get("restarts") or []
        ],
    }


class PodMonitor:
    """Watches the namespace's pods; at every event, no two live pods may share a pod index
    and an attempt."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = ns
        self.pods: dict[str, dict[str, Any]] = {}
        self.violations: list[str] = []
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()
        self._stopping = False

    def __enter__(self) -> PodMonitor:
        self._thread.start()
        self._started.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping = True
        self._watch.stop()
        self._thread.join(5)

    def _run(self) -> None:
        try:
            self._stream()
        except Exception as e:  # noqa: BLE001 - stop() closes the stream under us
            if not self._stopping:
                self.violations.append(f"pod monitor broke: {e!r}")

    def _stream(self) -> None:
        listed: Any = self.core.list_namespaced_pod(self.ns, _preload_content=False)
        body = json.loads(listed.data)
        rv = body["metadata"]["resourceVersion"]
        self._started.set()
        for event in self._watch.stream(
            self.core.list_namespaced_pod, self.ns, resource_version=rv, timeout_seconds=600
        ):
            pod = event["raw_object"]
            name = pod["metadata"]["name"]
            if event["type"] == "DELETED":
                self.pods.pop(name, None)
            else:
                self.pods[name] = pod
            self._check()

    def _check(self) -> None:
        seen: dict[tuple[str, str], str] = {}
        for name, pod in self.pods.items():
            meta = pod["metadata"]
            live = (
                meta.get("deletionTimestamp") is None
                and (pod.get("status") or {}).get("phase") not in FINISHED
            )
            if not live:
                continue
            labels = meta.get("labels") or {}
            slot = (labels.get(names.LABEL_NODE_RANK, "?"), labels.get(names.LABEL_ATTEMPT, "?"))
            if slot in seen:
                self.violations.append(f"live pods {seen[slot]} and {name} share {slot}")
            seen[slot] = name


@dataclass
class Tally:
    runs: int = 0
    faults: int = 0
    kills: int = 0
    violations: list[str] = field(default_factory=list)


class Campaign:
    def __init__(self, kubeconfig: Path, workdir: Path, seed: int) -> None:
        self.kubeconfig = kubeconfig
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.reference: dict[str, dict[str, Any]] = {}
        self.tally: dict[str, Tally] = {s.name: Tally() for s in SCENARIOS}
        self._n = 0

    def schedule(self, count: int) -> list[dict[str, Any]]:
        rules = []
        for _ in range(count):
            target = self.rng.choice(list(TARGETS))
            method, path = TARGETS[target]
            nth = self.rng.randint(1, 6 if target == "status-write" else 2)
            rules.append({"method": method, "path": path, "nth": nth, **self.rng.choice(ACTIONS)})
        return rules

    @contextmanager
    def namespace(self) -> Iterator[str]:
        self._n += 1
        ns = f"faults-{self._n}-{self.rng.randrange(1 << 20):05x}"
        create_namespace(self.api, ns)
        core = client.CoreV1Api(self.api)
        try:
            yield ns
        finally:
            core.delete_namespace(ns)

    def run(
        self, scenario: Scenario, rules: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], int, int, list[str]]:
        """One run; returns (outcome, faults injected, kills survived, violations)."""
        name = f"{scenario.name}-{self._n + 1}"
        pending = list(rules)
        faults = kills = 0
        violations: list[str] = []
        op: OperatorProcess | None = None
        incarnation = 0

        def start_operator() -> OperatorProcess:
            nonlocal incarnation
            incarnation += 1
            log = self.workdir / f"{name}-{incarnation}.faults"
            env = {}
            if pending:
                spec = self.workdir / f"{name}-{incarnation}.json"
                spec.write_text(json.dumps({"log": str(log), "rules": pending}))
                env["TORCHRUN_OPERATOR_FAULTS"] = str(spec)
            proc = OperatorProcess(
                self.kubeconfig, self.workdir, env=env, tag=f"{name}-{incarnation}"
            )
            proc.fault_log = log  # type: ignore[attr-defined]
            proc.start()
            return proc

        def reap(proc: OperatorProcess) -> None:
            """Count what this incarnation injected; drop those rules from the schedule."""
            nonlocal faults, pending
            log: Path = proc.fault_log  # type: ignore[attr-defined]
            fired = set()
            if log.exists():
                for line in log.read_text().splitlines():
                    fired.add(json.loads(line)["rule"])
            faults += len(fired)
            pending = [r for i, r in enumerate(pending) if i not in fired]

        custom = client.CustomObjectsApi(self.api)
        with self.namespace() as ns, PodMonitor(self.api, ns) as monitor:
            op = start_operator()
            create_job(self.api, ns, scenario.doc(name))
            done: dict[str, Any] | None = None
            during = None
            if scenario.during is not None:
                during = threading.Thread(
                    target=scenario.during, args=(self.api, ns, name), daemon=True
                )
                during.start()
            deadline = time.monotonic() + JOB_TIMEOUT
            while time.monotonic() < deadline:
                if op.proc is not None and op.proc.poll() is not None:
                    kills += 1
                    reap(op)
                    op = start_operator()
                job: Any = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                phase = (job.get("status") or {}).get("phase")
                if phase in FINISHED and (during is None or not during.is_alive()):
                    done = job
                    break
                time.sleep(0.5)
            if done is None:
                violations.append(f"{name}: unfinished after {JOB_TIMEOUT:.0f}s")
                result: dict[str, Any] = {}
            else:
                result = outcome(done)
                violations += self._after_end(ns, name, done, scenario)
            op.kill()
            reap(op)
            violations += [f"{name}: {v}" for v in monitor.violations]
        return result, faults, kills, violations

    def _after_end(self, ns: str, name: str, job: dict[str, Any], scenario: Scenario) -> list[str]:
        """No pod outlives the job except as cleanPodPolicy keeps; a TTL deletes the job."""
        core = client.CoreV1Api(self.api)
        policy = ((job["spec"].get("runPolicy") or {}).get("cleanPodPolicy")) or "KeepFailed"

        def extra() -> list[str]:
            pods: list[Any] = core.list_namespaced_pod(
                ns, label_selector=f"{JOB_LABEL}={name}"
            ).items
            out = []
            for p in pods:
                if p.metadata.deletion_timestamp is not None:
                    continue
                kept = policy == "KeepAll" or (
                    policy == "KeepFailed" and p.status.phase == "Failed"
                )
                if not kept:
                    out.append(f"pod {p.metadata.name} ({p.status.phase}) outlived the job")
            return out

        try:
            wait_for("clean-up", lambda: not extra(), 60, interval=0.3)
        except TimeoutError:
            return extra()
        if scenario.ttl:
            custom = client.CustomObjectsApi(self.api)

            def gone() -> bool:
                try:
                    custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                    return False
                except ApiException as e:
                    return e.status == 404

            try:
                wait_for("TTL deletion", gone, 60, interval=0.3)
            except TimeoutError:
                return ["job outlived its TTL"]
        return []

    def campaign(self, faults_wanted: int, per_run: int) -> bool:
        for s in SCENARIOS:
            ref, _, _, bad = self.run(s, [])
            self.reference[s.name] = ref
            if bad:
                self.tally[s.name].violations += [f"reference run: {v}" for v in bad]
            print(f"reference {s.name}: {ref}", flush=True)
        total = 0
        while total < faults_wanted:
            for s in SCENARIOS:
                got, faults, kills, bad = self.run(s, self.schedule(per_run))
                if got and got != self.reference[s.name]:
                    bad.append(f"outcome {got} != reference {self.reference[s.name]}")
                t = self.tally[s.name]
                t.runs += 1
                t.faults += faults
                t.kills += kills
                t.violations += bad
                total += faults
                print(
                    f"{s.name}: {faults} faults, {kills} kills, {len(bad)} violations {bad}",
                    flush=True,
                )
                if total >= faults_wanted:
                    break
        return not any(t.violations for t in self.tally.values())

    def table(self) -> str:
        rows = [
            "| scenario | runs | faults injected | kills survived | invariant violations |",
            "|---|---|---|---|---|",
        ]
        for name, t in self.tally.items():
            rows.append(f"| {name} | {t.runs} | {t.faults} | {t.kills} | {len(t.violations)} |")
        total = Tally(
            sum(t.runs for t in self.tally.values()),
            sum(t.faults for t in self.tally.values()),
            sum(t.kills for t in self.tally.values()),
            [v for t in self.tally.values() for v in t.violations],
        )
        rows.append(
            f"| **all** | {total.runs} | {total.faults} | {total.kills} | {len(total.violations)} |"
        )
        return "\n".join(rows)


TABLE_BEGIN = "<!-- fault-table:begin -->"
TABLE_END = "<!-- fault-table:end -->"


def write_table(path: Path, table: str, header: str) -> None:
    text = path.read_text()
    start, end = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
    path.write_text(text[:start] + f"\n{header}\n\n{table}\n" + text[end:])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--faults", type=int, default=200, help="inject at least this many faults")
    p.add_argument("--per-run", type=int, default=4, help="faults scheduled per run")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--kubeconfig", type=Path, help="use this cluster instead of starting one")
    p.add_argument("--json", type=Path, help="write the tally here")
    p.add_argument("--table", type=Path, help="replace the table in this Markdown file")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="faultrun-"))
    cluster = None
    if args.kubeconfig is None:
        from localkube.components import default_nodes
        from localkube.controlplane import Cluster
        from localkube.testing import pick_base, unique_cluster_name

        cluster = Cluster(
            workdir / "cluster", name=unique_cluster_name(), base=pick_base(),
            nodes=default_nodes(2, cpu="8", memory="32Gi", gpus=0), die_with_parent=True,
        )  # fmt: skip
        cluster.up(timeout=180)
        kubeconfig = Path(cluster.kubeconfig)
        from operator_fixtures import install_crd

        install_crd(config.new_client_from_config(config_file=str(kubeconfig)))
    else:
        kubeconfig = args.kubeconfig
    started = time.monotonic()
    try:
        c = Campaign(kubeconfig, workdir, args.seed)
        ok = c.campaign(args.faults, args.per_run)
        table = c.table()
        print(table)
        for t in c.tally.values():
            for v in t.violations:
                print("VIOLATION:", v)
        if args.json:
            args.json.write_text(json.dumps({n: t.__dict__ for n, t in c.tally.items()}, indent=1))
        if args.table:
            minutes = (time.monotonic() - started) / 60
            header = (
                f"Last full run: {time.strftime('%Y-%m-%d')}, seed {args.seed}, "
                f"{args.per_run} faults scheduled per run, {minutes:.0f} minutes on the 2-core "
                "development machine."
            )
            write_table(args.table, table, header)
        return 0 if ok else 1
    finally:
        if cluster is not None:
            cluster.down()
        if os.environ.get("FAULTRUN_KEEP") != "1":
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
