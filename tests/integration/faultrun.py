"""Fault-injection campaign: real jobs under seeded random fault schedules, on the real
local cluster (docs/reliability.md).

Each scenario (tests/integration/campaign_scenarios.py: a job that succeeds, one whose rank
raises, an infrastructure failure healed by a gang restart, suspend and resume, a TTL, an
8-pod job, an elastic job's lost pod replaced, a hang detected and restarted, a Kueue
eviction and re-admission, `gang: Native`, a pod answering hostile status bodies, a hang on
nodes with skewed clocks) first runs once without faults and under one operator: its outcome
is the reference. Then it runs again and again, each
time with operators (scoped to the run's namespace) whose own API requests fail as the
schedule says (kube/faults.py: 500, 409, 429, a timeout, a response lost after the write, a
write held up past the client's bound, a write that lands after the client gave up, SIGKILL
right before or after a request, a dropped watch, a storm of 410 Gone on a watch), and,
on a cluster of its own, with the apiserver stopped (SIGSTOP) for 20 s mid-run. A killed
operator is started again at once, with the faults that did not fire yet. Faults are
counted from the seam's own log (those that fired), never from the schedule.

Once the job finished and its pods were cleaned up, the operator is stopped; whatever did
not fire by then is reported as not fired. An operator without faults is started once more,
and once it has reconciled the job (its metrics say so) the run is judged
(tests/campaign_invariants.py, each invariant unit-tested to fail on a record that breaks it):

- the job finished, and its outcome (phase, attempt, root cause, counters, restart records)
  equals the reference;
- no pod of an attempt was created while a pod of an earlier attempt existed, and a pod of
  an earlier attempt that turned up late was deleted (a pod watch records every event);
- no attempt created more pods than its nodes plus the replacements its status counts;
- no pod outlived the job except as cleanPodPolicy keeps, and a TTL deleted the job;
- no "Traceback" in any operator's log;
- every operator exit was a SIGKILL the fault seam sent.

    python tests/integration/faultrun.py --faults 200 --seed 1 --table docs/reliability.md

starts its own local cluster (LOCALKUBE_BIN: cluster/build.sh all) and prints the tables;
tests/integration/test_fault_injection.py runs a small seeded campaign in every CI run, and
tests/integration/test_campaign_plants.py proves that each invariant catches a bug planted in
the operator (TORCHRUN_OPERATOR_TEST_PLANT, operator/torchrun_operator/testplant.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# As pytest's rootdir conftest does: the shared test helpers (tests/jobs.py) and our packages.
sys.path[:0] = [str(HERE), str(HERE.parent), str(REPO / "operator"), str(REPO / "cluster")]

import campaign_invariants as inv  # noqa: E402
from campaign_scenarios import (  # noqa: E402
    BY_NAME,
    FINISHED,
    KUEUE,
    SCENARIOS,
    SKEWED_NODES,
    Scenario,
    expectation_missed,
    needs_of,
)
from dtj import GROUP, JOB_LABEL, PLURAL, VERSION, create_job  # noqa: E402
from kubernetes import client, config, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from localkube.procs import free_port  # noqa: E402
from localkube.testing import create_namespace, wait_for  # noqa: E402

JOB_TIMEOUT = 240.0
SETTLE_TIMEOUT = 90.0
PLANT_ENV = "TORCHRUN_OPERATOR_TEST_PLANT"
WATCH = r"\?(.*&)?watch=(?i:true|1)"
# Where a fault can strike: the operator's own requests, by method and path.
TARGETS: dict[str, tuple[str, str]] = {
    "status-write": ("PATCH", r"/distributedtrainingjobs/[^/]+/status"),
    "pod-create": ("POST", r"/pods$"),
    "pod-delete": ("DELETE", r"/pods/[^/?]+"),
    "child-create": ("POST", r"/(services|configmaps|networkpolicies)$"),
    "job-read": ("GET", r"/distributedtrainingjobs/[^/?]+$"),
    "job-delete": ("DELETE", r"/distributedtrainingjobs/[^/?]+$"),
    "pod-watch": ("GET", r"/pods" + WATCH),
    "job-watch": ("GET", r"/distributedtrainingjobs" + WATCH),
}
# The fault kinds (the rows of the table) and the seam's rules for them.
KINDS: dict[str, dict[str, Any]] = {
    "500": {"action": "status", "status": 500},
    "409": {"action": "status", "status": 409},
    "429 + Retry-After": {"action": "status", "status": 429, "retry_after": 1},
    "connect timeout": {"action": "timeout"},
    "response lost": {"action": "lose_response"},
    # Longer than a write's 4 s bound (kube/client.py): the client has given up by then.
    "slow, then lost": {"action": "lose_response", "delay": 4.5},
    "committed late": {"action": "late", "delay": 6},
    "kill before": {"action": "kill_before"},
    "kill after": {"action": "kill_after"},
    "watch dropped": {"action": "lose_response", "times": 2},
    "410 Gone storm": {"action": "status", "status": 410, "times": 4},
    "503 storm": {"action": "status", "status": 503, "times": 4, "retry_after": 1},
    # Not the seam's: the driver stops the apiserver (SIGSTOP) that long, then lets it go on.
    "apiserver stopped 20 s": {"pause": 20.0},
}
WRITE_KINDS = [
    "500", "409", "429 + Retry-After", "connect timeout", "response lost", "slow, then lost",
    "committed late", "kill before", "kill after",
]  # fmt: skip
READ_KINDS = ["500", "429 + Retry-After", "connect timeout", "response lost", "kill before"]
WATCH_KINDS = ["watch dropped", "410 Gone storm", "503 storm", "kill before"]
KINDS_OF = {
    "status-write": WRITE_KINDS,
    "pod-create": WRITE_KINDS,
    "pod-delete": WRITE_KINDS,
    "child-create": WRITE_KINDS,
    "job-delete": WRITE_KINDS,
    "job-read": READ_KINDS,
    "pod-watch": WATCH_KINDS,
    "job-watch": WATCH_KINDS,
    "apiserver": ["apiserver stopped 20 s"],
}


class PodMonitor:
    """Records every event of the namespace's pods, from before the job exists."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = ns
        self.events: list[inv.PodEvent] = []
        self.broke: list[str] = []
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
                self.broke.append(f"pod monitor broke: {e!r}")

    def _stream(self) -> None:
        listed: Any = self.core.list_namespaced_pod(self.ns, _preload_content=False)
        body = json.loads(listed.data)
        rv = body["metadata"]["resourceVersion"]
        self._started.set()
        for event in self._watch.stream(
            self.core.list_namespaced_pod, self.ns, resource_version=rv, timeout_seconds=900
        ):
            self.events.append(inv.PodEvent.of(event["type"], event["raw_object"]))


class Operator:
    """One operator process, scoped to the run's namespace (so that its metrics count the
    reconciles of this run's job alone), with its log and its fault log."""

    def __init__(
        self,
        kubeconfig: Path,
        ns: str,
        log: Path,
        env: dict[str, str],
        rules: list[tuple[str, dict[str, Any]]],
        args: tuple[str, ...] = (),
    ) -> None:
        self.log_path = log
        self.rules = rules  # (kind, rule) as given to its fault seam
        self.fault_log = log.with_suffix(".faults")
        self.metrics_port = free_port()
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), **env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), env.get("PYTHONPATH", "")])
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "torchrun_operator.main", "--namespace", ns,
                 "--liveness-port", "0", "--metrics-port", str(self.metrics_port), *args],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.killed_by_us = False

    def stop(self) -> None:
        """SIGKILL from the campaign (not an exit of the operator's own)."""
        if self.proc.poll() is None:
            self.killed_by_us = True
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def fired(self) -> list[dict[str, Any]]:
        if not self.fault_log.exists():
            return []
        return [json.loads(line) for line in self.fault_log.read_text().splitlines() if line]

    def reconciles(self) -> float:
        """How many reconciles this process finished (0 until its metrics answer)."""
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        for line in text.splitlines():
            if line.startswith("torchrun_operator_reconcile_duration_seconds_count "):
                return float(line.split()[1])
        return 0.0


@dataclass
class Run:
    outcome: dict[str, Any]
    fired: Counter[str]
    unfired: Counter[str]
    kills: int
    violations: list[str]


@dataclass
class Tally:
    runs: int = 0
    fired: Counter[str] = field(default_factory=Counter)
    unfired: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    violations: list[str] = field(default_factory=list)


class Campaign:
    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        seed: int,
        scenarios: list[Scenario] | None = None,
        plant: str | None = None,
        apiserver_pid: int | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.api = config.new_client_from_config(config_file=str(kubeconfig))
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.scenarios = scenarios or SCENARIOS
        # A bug planted in the operators of the runs with faults (never the reference's).
        self.plant = plant
        # The apiserver's process, when this campaign may stop it (its own cluster).
        self.apiserver_pid = apiserver_pid
        self.reference: dict[str, dict[str, Any]] = {}
        self.tally: dict[str, Tally] = {s.name: Tally() for s in self.scenarios}
        self._n = 0

    def schedule(self, scenario: Scenario, count: int) -> list[tuple[str, dict[str, Any]]]:
        """(kind, rule) pairs, only where they can fire: a job is deleted only by a TTL."""
        targets = [t for t in TARGETS if t != "job-delete" or scenario.ttl]
        if self.apiserver_pid is not None:
            targets.append("apiserver")
        rules = []
        for _ in range(count):
            target = self.rng.choice(targets)
            if target == "apiserver":
                kind = KINDS_OF[target][0]
                rules.append((kind, {**KINDS[kind], "after": self.rng.uniform(1, 10)}))
                continue
            method, path = TARGETS[target]
            if target.endswith("-watch"):
                nth = 1  # a watch is opened again only after it broke
            else:
                nth = self.rng.randint(1, 6 if target == "status-write" else 2)
            kind = self.rng.choice(KINDS_OF[target])
            rules.append((kind, {"method": method, "path": path, "nth": nth, **KINDS[kind]}))
        return rules

    @contextmanager
    def namespace(self) -> Iterator[str]:
        self._n += 1
        # Not from the seeded generator: campaigns on one cluster must not share names.
        ns = f"faults-{self._n}-{secrets.token_hex(3)}"
        create_namespace(self.api, ns)
        core = client.CoreV1Api(self.api)
        try:
            yield ns
        finally:
            core.delete_namespace(ns)

    def run(
        self, scenario: Scenario, rules: list[tuple[str, dict[str, Any]]], reference: bool = False
    ) -> Run:
        """One run with these faults scheduled. The reference run: no faults, no plant, one
        operator, not restarted once more."""
        name = f"{scenario.name}-{self._n + 1}"
        pauses = [r for _, r in rules if "pause" in r]
        pending = [(k, r) for k, r in rules if "pause" not in r]
        fired: Counter[str] = Counter()
        seen: list[dict[str, Any]] = []
        exits: list[tuple[int, int]] = []
        operators: list[Operator] = []
        violations: list[str] = []
        custom = client.CustomObjectsApi(self.api)

        def start(ns: str, faults: bool) -> Operator:
            tag = f"{name}-{len(operators) + 1}"
            env = {}
            if self.plant and not reference:
                env[PLANT_ENV] = self.plant
            log = self.workdir / f"{tag}.log"
            if faults and pending:
                spec = self.workdir / f"{tag}.json"
                body = {"log": str(log.with_suffix(".faults")), "rules": [r for _, r in pending]}
                spec.write_text(json.dumps(body))
                env["TORCHRUN_OPERATOR_FAULTS"] = str(spec)
            rules = list(pending) if faults else []
            op = Operator(self.kubeconfig, ns, log, env, rules, scenario.operator_args)
            operators.append(op)
            return op

        def reap(op: Operator) -> None:
            """Counts what this operator injected (each rule once, however many requests
            it answered); the rest stays scheduled."""
            nonlocal pending
            if op.proc.poll() is not None and not op.killed_by_us:
                exits.append((op.proc.pid, op.proc.returncode))
            got = op.fired()
            seen.extend(got)
            hit = {e["rule"] for e in got}
            mine = op.rules
            fired.update(kind for i, (kind, _) in enumerate(mine) if i in hit)
            if mine:
                pending = [r for i, r in enumerate(mine) if i not in hit]

        with self.namespace() as ns, PodMonitor(self.api, ns) as monitor, _stopping(operators):
            op = start(ns, faults=True)

            def tend() -> None:
                """A killed operator is started again at once, until the run is judged:
                also while the job's pods are cleaned up and its TTL is awaited (a kill
                fault on the TTL's delete fires after the job finished)."""
                nonlocal op
                if op.proc.poll() is not None:
                    reap(op)
                    op = start(ns, faults=True)

            if scenario.prepare is not None:
                scenario.prepare(self.api, ns)
            create_job(self.api, ns, scenario.doc(name))
            driver = _Driver(scenario, self.api, ns, name)
            pauser = _Pauser(self.apiserver_pid, pauses)
            done: dict[str, Any] | None = None
            deadline = time.monotonic() + JOB_TIMEOUT
            while time.monotonic() < deadline:
                tend()
                job: Any = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                if (job.get("status") or {}).get("phase") in FINISHED and not driver.busy():
                    done = job
                    break
                time.sleep(0.5)
            violations += driver.errors
            fired.update(pauser.join())
            last: dict[str, Any] = done or {}
            if done is None:
                violations.append(f"unfinished after {JOB_TIMEOUT:.0f}s")
            else:
                violations += self._after_end(ns, name, done, scenario, tend)
            op.stop()
            reap(op)
            if done is not None and not scenario.ttl:  # a TTL's job is gone by now
                if not reference:
                    # Every fault has fired or never will; one more operator, without
                    # faults, must leave the outcome as it is once it reconciled the job.
                    op = start(ns, faults=False)
                    violations += self._reconciled(op)
                    op.stop()
                    reap(op)
                last = cast(
                    dict[str, Any],
                    custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name),
                )
            result = inv.outcome(last) if done is not None else {}
            final = last.get("status") or {}
            violations += monitor.broke
            violations += inv.attempts_mixed(monitor.events)
            violations += inv.pods_per_attempt(monitor.events, scenario.nodes, final)
        for o in operators:
            violations += inv.tracebacks(o.log_path.read_text(errors="replace"), o.log_path.name)
        violations += inv.unexpected_exits(exits, inv.fault_kills(seen))
        unfired = Counter(kind for kind, _ in pending)
        kills = len(inv.fault_kills(seen))
        return Run(result, fired, unfired, kills, [f"{name}: {v}" for v in violations])

    def _reconciled(self, op: Operator) -> list[str]:
        """Waits for the operator's first reconcile of the run's job (its only one)."""
        try:
            wait_for("a reconcile", lambda: op.reconciles() >= 1, SETTLE_TIMEOUT, interval=0.5)
        except TimeoutError:
            return [f"the restarted operator did not reconcile within {SETTLE_TIMEOUT:.0f}s"]
        return []

    def _after_end(
        self,
        ns: str,
        name: str,
        job: dict[str, Any],
        scenario: Scenario,
        tend: Callable[[], None],
    ) -> list[str]:
        """No pod outlives the job except as cleanPodPolicy keeps; a TTL deletes the job."""
        core = client.CoreV1Api(self.api)
        policy = ((job["spec"].get("runPolicy") or {}).get("cleanPodPolicy")) or "KeepFailed"

        def extra() -> list[str]:
            tend()
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
                tend()
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

    def references(self) -> None:
        for s in self.scenarios:
            ref = self.run(s, [], reference=True)
            self.reference[s.name] = ref.outcome
            missed = ref.violations + expectation_missed(s, ref.outcome)
            self.tally[s.name].violations += [f"reference run: {v}" for v in missed]
            print(f"reference {s.name}: {ref.outcome}", flush=True)

    def judge(self, scenario: Scenario, got: Run) -> Run:
        """A run's own violations, and an outcome other than the reference's; tallied."""
        if got.outcome:
            got.violations += inv.outcome_differs(self.reference[scenario.name], got.outcome)
        t = self.tally[scenario.name]
        t.runs += 1
        t.fired.update(got.fired)
        t.unfired.update(got.unfired)
        t.kills += got.kills
        t.violations += got.violations
        return got

    def campaign(
        self, faults_wanted: int, per_run: int, runs_wanted: int = 0, minutes: float = 0
    ) -> bool:
        """Runs until enough faults fired in enough runs, or (`minutes` > 0) no run starts
        after that many minutes: the tally then says how far it got."""
        stop = time.monotonic() + minutes * 60 if minutes > 0 else float("inf")
        self.references()
        total = runs = 0
        while (total < faults_wanted or runs < runs_wanted) and time.monotonic() < stop:
            for s in self.scenarios:
                if time.monotonic() >= stop:
                    print(f"stopped after {minutes:g} minutes", flush=True)
                    break
                got = self.judge(s, self.run(s, self.schedule(s, per_run)))
                total += sum(got.fired.values())
                runs += 1
                print(
                    f"{s.name}: fired {dict(got.fired)}, not fired {dict(got.unfired)}, "
                    f"{got.kills} kills, {len(got.violations)} violations {got.violations}",
                    flush=True,
                )
                if total >= faults_wanted and runs >= runs_wanted:
                    break
        return not any(t.violations for t in self.tally.values())

    def table(self) -> str:
        names = [s.name for s in self.scenarios]
        rows = [
            "| fault kind (fired) | " + " | ".join(names) + " | all |",
            "|---|" + "---|" * (len(names) + 1),
        ]
        kinds = sorted({k for t in self.tally.values() for k in t.fired}, key=list(KINDS).index)
        for kind in kinds:
            cells = [self.tally[n].fired[kind] for n in names]
            rows.append(f"| {kind} | " + " | ".join(map(str, cells)) + f" | {sum(cells)} |")

        def line(label: str, value: Callable[[Tally], int]) -> str:
            cells = [value(self.tally[n]) for n in names]
            return f"| {label} | " + " | ".join(map(str, cells)) + f" | {sum(cells)} |"

        rows += [
            line("**faults fired**", lambda t: sum(t.fired.values())),
            line("scheduled, not fired", lambda t: sum(t.unfired.values())),
            line("operator kills survived", lambda t: t.kills),
            line("runs", lambda t: t.runs),
            line("**invariant violations**", lambda t: len(t.violations)),
        ]
        return "\n".join(rows)


class _Driver:
    """The scenario's own action while the job runs (suspend and resume), in a thread; an
    error of its own is the run's violation."""

    def __init__(self, scenario: Scenario, api: client.ApiClient, ns: str, name: str) -> None:
        self.errors: list[str] = []
        self._thread: threading.Thread | None = None
        if scenario.during is not None:
            during = scenario.during

            def go() -> None:
                try:
                    during(api, ns, name)
                except Exception as e:  # noqa: BLE001 - reported as the run's violation
                    self.errors.append(f"{scenario.name} driver: {e!r}")

            self._thread = threading.Thread(target=go, daemon=True)
            self._thread.start()

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()


@contextmanager
def _stopping(operators: list[Operator]) -> Iterator[None]:
    """However a run ends (an error, ^C), none of its operators outlives it."""
    try:
        yield
    finally:
        for o in operators:
            o.stop()


class _Pauser:
    """Stops the apiserver (SIGSTOP) for each pause in turn, `after` seconds from the
    start (or from the end of the previous pause), and lets it go on (SIGCONT)."""

    def __init__(self, pid: int | None, pauses: list[dict[str, Any]]) -> None:
        self.done = 0
        self._thread: threading.Thread | None = None
        if pid is not None and pauses:
            self._thread = threading.Thread(target=self._go, args=(pid, pauses), daemon=True)
            self._thread.start()

    def _go(self, pid: int, pauses: list[dict[str, Any]]) -> None:
        for p in pauses:
            time.sleep(p["after"])
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(p["pause"])
            finally:
                os.kill(pid, signal.SIGCONT)
            self.done += 1

    def join(self) -> Counter[str]:
        if self._thread is not None:
            self._thread.join()
        return Counter({"apiserver stopped 20 s": self.done} if self.done else {})


TABLE_BEGIN = "<!-- fault-table:begin -->"
TABLE_END = "<!-- fault-table:end -->"


def write_table(path: Path, table: str, header: str) -> None:
    text = path.read_text()
    start, end = text.index(TABLE_BEGIN) + len(TABLE_BEGIN), text.index(TABLE_END)
    path.write_text(text[:start] + f"\n{header}\n\n{table}\n" + text[end:])


@contextmanager
def local_cluster(workdir: Path, needs: frozenset[str] = frozenset()) -> Iterator[Any]:
    """A local cluster of its own (2 nodes, CRD installed): a localkube Cluster. With the
    scenarios' `needs` (campaign_scenarios): KUEUE runs Kueue's manager (its CRDs and
    webhooks) beside it; SKEWED_NODES adds two tainted nodes with clocks of their own (an
    hour ahead, six hours behind). Only then: the other runs do not pay for them."""
    from campaign_scenarios import CLOCK_LABEL, CLOCK_SKEWS, CLOCK_TAINT, EXTERNAL_FRAMEWORK
    from localkube.components import NodeSpec, default_nodes
    from localkube.controlplane import Cluster
    from localkube.kueue import Kueue
    from localkube.testing import pick_base, unique_cluster_name
    from operator_fixtures import install_crd

    nodes = default_nodes(2, cpu="8", memory="32Gi", gpus=0)
    if SKEWED_NODES in needs:
        nodes += [
            NodeSpec(f"node-{clock}", labels={CLOCK_LABEL: clock}, taints=[CLOCK_TAINT],
                     clock_skew_seconds=skew)
            for clock, skew in CLOCK_SKEWS.items()
        ]  # fmt: skip
    cluster = Cluster(
        workdir / "cluster", name=unique_cluster_name("fr"), base=pick_base(),
        nodes=nodes, die_with_parent=True,
    )  # fmt: skip
    kueue: Kueue | None = None
    try:
        cluster.up(timeout=180)
        install_crd(config.new_client_from_config(config_file=str(cluster.kubeconfig)))
        if KUEUE in needs:
            (workdir / "kueue").mkdir(exist_ok=True)
            kueue = Kueue(cluster, workdir / "kueue", [EXTERNAL_FRAMEWORK]).start()
        yield cluster
    finally:
        if kueue is not None:
            kueue.stop()
        cluster.down()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--faults", type=int, default=200, help="until this many faults fired")
    p.add_argument("--runs", type=int, default=0, help="... and at least this many runs")
    p.add_argument("--per-run", type=int, default=4, help="faults scheduled per run")
    p.add_argument("--minutes", type=float, default=0, help="start no run after this long")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--scenarios", help="comma-separated: only these", default="")
    p.add_argument("--kubeconfig", type=Path, help="use this cluster instead of starting one")
    p.add_argument("--json", type=Path, help="write the tally here")
    p.add_argument("--table", type=Path, help="replace the table in this Markdown file")
    args = p.parse_args(argv)
    scenarios = [BY_NAME[n] for n in args.scenarios.split(",") if n] or SCENARIOS
    workdir = Path(tempfile.mkdtemp(prefix="faultrun-"))
    started = time.monotonic()
    try:
        with cluster_for(args.kubeconfig, workdir, scenarios) as (kubeconfig, apiserver):
            c = Campaign(kubeconfig, workdir, args.seed, scenarios, apiserver_pid=apiserver)
            try:
                ok = c.campaign(args.faults, args.per_run, args.runs, args.minutes)
            finally:
                report(c, args, started)
        return 0 if ok else 1
    finally:
        if os.environ.get("FAULTRUN_KEEP") != "1":
            shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def cluster_for(
    kubeconfig: Path | None, workdir: Path, scenarios: list[Scenario] | None = None
) -> Iterator[tuple[Path, int | None]]:
    """The cluster given (it must have what the scenarios need), or one of our own with
    what they need (then also its apiserver's pid: the campaign may stop it)."""
    if kubeconfig is not None:
        yield kubeconfig, None
    else:
        with local_cluster(workdir, needs_of(scenarios or [])) as cluster:
            yield Path(cluster.kubeconfig), apiserver_pid(cluster)


def apiserver_pid(cluster: Any) -> int:
    pid: int = cluster.status()["components"]["kube-apiserver"]["pid"]
    return pid


def report(c: Campaign, args: argparse.Namespace, started: float) -> None:
    """The table and every violation, also when the campaign was cut short."""
    table = c.table()
    print(table)
    for t in c.tally.values():
        for v in t.violations:
            print("VIOLATION:", v)
    if args.json:
        tally = {
            n: {"runs": t.runs, "fired": t.fired, "unfired": t.unfired, "kills": t.kills,
                "violations": t.violations}
            for n, t in c.tally.items()
        }  # fmt: skip
        args.json.write_text(json.dumps(tally, indent=1))
    if args.table:
        minutes = (time.monotonic() - started) / 60
        runs = sum(t.runs for t in c.tally.values())
        fired = sum(sum(t.fired.values()) for t in c.tally.values())
        short = runs < args.runs or fired < args.faults
        commit = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True,
        ).stdout.strip() or "unknown"  # fmt: skip
        header = (
            f"Last full run: {time.strftime('%Y-%m-%d %H:%M %Z')}, commit {commit}, seed "
            f"{args.seed}, {args.per_run} faults scheduled per run, {runs} runs, {fired} faults "
            f"fired, {minutes:.0f} minutes on the 2-core development machine"
            + (
                f" (stopped at the time limit, short of the {args.runs} runs and "
                f"{args.faults} faults asked for)."
                if short
                else "."
            )
        )
        write_table(args.table, table, header)


if __name__ == "__main__":
    sys.exit(main())
