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
import queue
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
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
# As pytest's rootdir conftest does: the shared test helpers (tests/jobs.py) and our packages.
sys.path[:0] = [str(HERE), str(HERE.parent), str(REPO / "operator"), str(REPO / "cluster")]

import campaign_evidence as evidence  # noqa: E402
import campaign_invariants as inv  # noqa: E402
import urllib3  # noqa: E402
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

JOB_TIMEOUT = 240.0  # plus the time the apiserver was down meanwhile (Apiserver.down)
MIN_UP_SECONDS = 45.0  # between two apiserver outages, campaign-wide
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
    # The elected leader's renewals of its Lease (kube/leader.py replaces it: a PUT).
    "lease": ("PUT", r"/leases/[^/?]+$"),
}
# The Lease the replicas of a split-brain run elect their leader on (the operator's default
# --leader-election-id), in the run's namespace.
LEASE = "torchrun-operator"
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
    # Two replicas elect a leader (a standby joins once the Lease is held); the leader's
    # renewals fail for ~20 s (one every 2 s): its term ends (10 s), it fences its writes,
    # and the standby takes over (15 s) while the deposed leader may still be creating pods.
    "split brain": {"action": "status", "status": 500, "times": 10},
    # Not the seam's: the driver stops the apiserver (SIGSTOP) that long, then lets it go on;
    # or kills it (SIGKILL: connections break rather than hang) and starts it again after
    # that long. One such fault at a time in the whole campaign (Apiserver).
    "apiserver stopped 20 s": {"apiserver": "pause", "seconds": 20.0},
    "apiserver restarted": {"apiserver": "restart", "seconds": 15.0},
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
    "lease": ["split brain"],
    "apiserver": ["apiserver stopped 20 s", "apiserver restarted"],
}


class PodMonitor:
    """Records every event of the namespace's pods, from before the job exists. A watch the
    apiserver broke (restarted) is opened again from the last resourceVersion seen, so no
    event is missed. A restarted apiserver's watch cache starts empty and answers that with
    410: then the pods are listed again and the difference recorded as events
    (relist_events); what came and went while the apiserver was down is lost to the
    checks, which can then miss a violation but not invent one."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        self.core = client.CoreV1Api(api)
        self.ns = ns
        self.events: list[inv.PodEvent] = []
        self.timeline: list[dict[str, Any]] = []  # campaign_evidence.pod_line per event
        self.broke: list[str] = []
        self._watch = watch.Watch()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._started = threading.Event()
        self._stopping = False
        self._live: dict[str, dict[str, Any]] = {}  # uid -> the pod as last seen
        self.relists = 0

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
                self.broke.append(f"pod monitor broke: {e!r} {e}"[:500])

    def _record(self, type_: str, raw: dict[str, Any]) -> None:
        self.events.append(inv.PodEvent.of(type_, raw))
        self.timeline.append(evidence.pod_line(type_, raw))
        uid = raw["metadata"]["uid"]
        if type_ == "DELETED":
            self._live.pop(uid, None)
        else:
            self._live[uid] = raw

    def _list(self) -> str:
        """Records the pods listed as events (none but the first time, when there are no
        pods yet) and returns the list's resourceVersion."""
        listed: Any = self.core.list_namespaced_pod(self.ns, _preload_content=False)
        body = json.loads(listed.data)
        for type_, raw in relist_events(self._live, body.get("items") or []):
            self._record(type_, raw)
        rv: str = body["metadata"]["resourceVersion"]
        return rv

    def _stream(self) -> None:
        rv = self._list()
        self._started.set()
        while not self._stopping:
            try:
                for event in self._watch.stream(
                    self.core.list_namespaced_pod, self.ns, resource_version=rv,
                    timeout_seconds=900,
                ):  # fmt: skip
                    raw = event["raw_object"]  # an ERROR event raises ApiException
                    self._record(event["type"], raw)
                    rv = raw["metadata"]["resourceVersion"]
            except ApiException as e:
                if e.status != 410:
                    raise
                self.relists += 1
                rv = self._list()
            except (urllib3.exceptions.HTTPError, OSError):
                if self._stopping:
                    return
                time.sleep(1)  # the apiserver went away: watch again from where we were


def relist_events(
    live: dict[str, dict[str, Any]], items: list[dict[str, Any]]
) -> list[tuple[str, dict[str, Any]]]:
    """The watch events that take a pod watch from the pods it knows (`live`, by uid) to
    those listed: the ones gone are DELETED first (so no pod seems to be created beside one
    that had already gone), then the new ones ADDED in the order of their creation, and
    those that changed MODIFIED."""
    listed = {p["metadata"]["uid"]: p for p in items}
    out = [("DELETED", p) for uid, p in live.items() if uid not in listed]
    fresh = [p for uid, p in listed.items() if uid not in live]
    fresh.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
    out += [("ADDED", p) for p in fresh]
    out += [
        ("MODIFIED", p)
        for uid, p in listed.items()
        if uid in live
        and p["metadata"].get("resourceVersion") != live[uid]["metadata"].get("resourceVersion")
    ]
    return out


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
        elect: bool = False,
        args: tuple[str, ...] = (),
    ) -> None:
        """`elect`: one of several replicas, electing a leader on the run's namespace's
        Lease."""
        self.log_path = log
        self.rules = rules  # (kind, rule) as given to its fault seam
        self.fault_log = log.with_suffix(".faults")
        self.metrics_port = free_port()
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), **env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), env.get("PYTHONPATH", "")])
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "torchrun_operator.main", "--namespace", ns,
                 "--liveness-port", "0", "--metrics-port", str(self.metrics_port),
                 *(["--leader-election-namespace", ns] if elect else []), *args],
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
    seconds: float = 0.0  # wall time, from the namespace's creation to the judgement


@dataclass
class Tally:
    runs: int = 0
    fired: Counter[str] = field(default_factory=Counter)
    unfired: Counter[str] = field(default_factory=Counter)
    kills: int = 0
    violations: list[str] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)  # each run's wall time


class Apiserver:
    """The apiserver of the campaign's own cluster (a localkube Cluster), which runs stop
    (SIGSTOP) or kill and start again. One such fault at a time in the whole campaign, each
    carried out by one thread that lives as long as the campaign: a restarted apiserver gets
    SIGTERM when the thread that started it ends (localkube's die_with_parent)."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster
        self._work: queue.Queue[tuple[Callable[[], None], list[BaseException], threading.Event]]
        self._work = queue.Queue()
        # Seconds the apiserver has been stopped or restarting, campaign-wide: every run's
        # deadline is extended by what it lived through (a run cannot finish while it is down).
        self.down = 0.0
        threading.Thread(target=self._serve, name="apiserver-faults", daemon=True).start()

    def _serve(self) -> None:
        while True:
            act, errors, done = self._work.get()
            start = time.monotonic()
            try:
                act()
            except Exception as e:  # noqa: BLE001 - handed to the run that asked
                errors.append(e)
            finally:
                self.down += time.monotonic() - start
                done.set()
            # Up for a while before the next one: with runs side by side, their outages back
            # to back kept the apiserver down most of the time (no namespace got its default
            # ServiceAccount within a minute), which tests nothing but patience.
            time.sleep(MIN_UP_SECONDS)

    def _do(self, act: Callable[[], None]) -> None:
        errors: list[BaseException] = []
        done = threading.Event()
        self._work.put((act, errors, done))
        done.wait()
        if errors:
            raise errors[0]

    def pid(self) -> int:
        pid: int = self.cluster.status()["components"]["kube-apiserver"]["pid"]
        return pid

    def pause(self, seconds: float) -> None:
        def act() -> None:
            pid = self.pid()
            os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                os.kill(pid, signal.SIGCONT)

        self._do(act)

    def restart(self, down_for: float) -> None:
        def act() -> None:
            self.cluster.restart_component("kube-apiserver", down_for, 120)
            # Ready is not yet serving: until the CRDs' paths are installed it answers 503.
            custom = client.CustomObjectsApi(resilient_client(self.cluster.kubeconfig))
            wait_for("our API served", lambda: _serves(custom), 120, interval=0.5)

        self._do(act)


def _serves(custom: client.CustomObjectsApi) -> bool:
    try:
        custom.list_cluster_custom_object(GROUP, VERSION, PLURAL, limit=1)
    except ApiException as e:
        if e.status == 503:
            return False
        raise
    return True


def resilient_client(kubeconfig: Path) -> client.ApiClient:
    """The campaign's own client: a request the apiserver refused because it was down (a
    restart fault of any run) is tried again for about a minute, and so are a read whose
    connection broke and one answered 503 (a restarted apiserver installing its paths);
    other writes are not (they may have landed: see create_retrying)."""
    cfg = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=cfg)
    cfg.retries = urllib3.Retry(
        total=None, connect=40, read=3, status=30, other=0, backoff_factor=0.5, backoff_max=2,
        status_forcelist={503}, raise_on_status=False,
    )  # fmt: skip
    return client.ApiClient(cfg)


class Campaign:
    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        seed: int,
        scenarios: list[Scenario] | None = None,
        plant: str | None = None,
        apiserver: Apiserver | None = None,
        kinds: frozenset[str] = frozenset(),
    ) -> None:
        # Only these fault kinds are scheduled (all when empty).
        unknown = set(kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}: {sorted(KINDS)}")
        self.kubeconfig = kubeconfig
        self.api = resilient_client(kubeconfig)
        self.workdir = workdir
        self.rng = random.Random(seed)
        self.scenarios = scenarios or SCENARIOS
        # A bug planted in the operators of the runs with faults (never the reference's).
        self.plant = plant
        # The apiserver, when this campaign may stop or restart it (its own cluster).
        self.apiserver = apiserver
        self.kinds = kinds
        self.reference: dict[str, dict[str, Any]] = {}
        self.tally: dict[str, Tally] = {s.name: Tally() for s in self.scenarios}
        self._n = 0
        self._lock = threading.Lock()  # runs in parallel threads: _n and the tally
        # Set when the campaign ends early (an error, ^C): the runs in flight stop too.
        self._abort = threading.Event()

    def schedule(self, scenario: Scenario, count: int) -> list[tuple[str, dict[str, Any]]]:
        """(kind, rule) pairs, only where they can fire: a job is deleted only by a TTL; of
        the kinds in `self.kinds` only, when it names some."""
        targets = [t for t in TARGETS if t != "job-delete" or scenario.ttl]
        if self.apiserver is not None:
            targets.append("apiserver")

        def kinds(target: str) -> list[str]:
            return [k for k in KINDS_OF[target] if not self.kinds or k in self.kinds]

        targets = [t for t in targets if kinds(t)]
        rules = []
        for _ in range(count if targets else 0):
            target = self.rng.choice(targets)
            if target == "apiserver":
                kind = self.rng.choice(kinds(target))
                rules.append((kind, {**KINDS[kind], "after": self.rng.uniform(1, 10)}))
                continue
            method, path = TARGETS[target]
            if target.endswith("-watch"):
                nth = 1  # a watch is opened again only after it broke
            elif target == "lease":
                nth = self.rng.randint(1, 3)  # a renewal every 2 s: from 2-6 s into the term
            else:
                nth = self.rng.randint(1, 6 if target == "status-write" else 2)
            kind = self.rng.choice(kinds(target))
            rules.append((kind, {"method": method, "path": path, "nth": nth, **KINDS[kind]}))
        return rules

    def _down(self) -> float:
        return self.apiserver.down if self.apiserver is not None else 0.0

    def next_index(self) -> int:
        with self._lock:
            self._n += 1
            return self._n

    @contextmanager
    def namespace(self, index: int) -> Iterator[str]:
        # Not from the seeded generator: campaigns on one cluster must not share names.
        ns = f"faults-{index}-{secrets.token_hex(3)}"
        create_retrying(lambda: create_namespace(self.api, ns))
        core = client.CoreV1Api(self.api)
        try:
            yield ns
        finally:
            core.delete_namespace(ns)

    def run(
        self,
        scenario: Scenario,
        rules: list[tuple[str, dict[str, Any]]],
        reference: bool = False,
        index: int | None = None,
    ) -> Run:
        """One run with these faults scheduled. The reference run: no faults, no plant, one
        operator, not restarted once more. `index` names the run (one is taken if None)."""
        began = time.monotonic()
        index = self.next_index() if index is None else index
        name = f"{scenario.name}-{index}"
        outages = [(k, r) for k, r in rules if "apiserver" in r]
        pending = [(k, r) for k, r in rules if "apiserver" not in r]
        # Split brain: two replicas elect a leader, the second once the first holds the Lease
        # (so the leader is the one with the faults); restarted, each stays what it was.
        split = any(k == "split brain" for k, _ in rules)
        fired: Counter[str] = Counter()
        seen: list[dict[str, Any]] = []
        exits: list[tuple[int, int]] = []
        operators: list[Operator] = []
        violations: list[str] = []
        custom = client.CustomObjectsApi(self.api)
        leases = client.CoordinationV1Api(self.api)

        def start(ns: str, faults: bool, elect: bool = False) -> Operator:
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
            op = Operator(self.kubeconfig, ns, log, env, rules, elect, scenario.operator_args)
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

        def lease_held(ns: str) -> bool:
            try:
                lease: Any = leases.read_namespaced_lease(LEASE, ns)
                return bool(lease.spec and lease.spec.holder_identity)
            except ApiException as e:
                if e.status == 404:
                    return False
                raise

        with (
            self.namespace(index) as ns,
            PodMonitor(self.api, ns) as monitor,
            _stopping(operators),
        ):
            op = start(ns, faults=True, elect=split)
            standby: Operator | None = None

            def tend() -> None:
                """A killed operator is started again at once, until the run is judged:
                also while the job's pods are cleaned up and its TTL is awaited (a kill
                fault on the TTL's delete fires after the job finished)."""
                nonlocal op, standby
                if op.proc.poll() is not None:
                    reap(op)
                    op = start(ns, faults=True, elect=split)
                if split and standby is None and lease_held(ns):
                    standby = start(ns, faults=False, elect=True)
                if standby is not None and standby.proc.poll() is not None:
                    reap(standby)
                    standby = start(ns, faults=False, elect=True)

            if scenario.prepare is not None:
                scenario.prepare(self.api, ns)
            doc = scenario.doc(name)
            create_retrying(lambda: create_job(self.api, ns, doc))
            driver = _Driver(scenario, self.api, ns, name)
            pauser = _Pauser(self.apiserver, outages, self._abort)
            done: dict[str, Any] | None = None
            deadline = time.monotonic() + JOB_TIMEOUT
            down_before = self._down()
            while time.monotonic() < deadline + self._down() - down_before:
                if self._abort.is_set():
                    raise RuntimeError("the campaign was stopped")
                tend()
                job: Any = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                if (job.get("status") or {}).get("phase") in FINISHED and not driver.busy():
                    done = job
                    break
                time.sleep(0.5)
            violations += driver.errors
            outages_fired, outages_unfired, errors = pauser.join()
            fired.update(outages_fired)
            violations += errors
            last: dict[str, Any] = done or {}
            if done is None:
                down = self._down() - down_before
                violations.append(
                    f"unfinished after {JOB_TIMEOUT:.0f}s and {down:.0f}s of apiserver outages"
                )
            else:
                violations += self._after_end(ns, name, done, scenario, tend)
            for o in (op, standby):
                if o is not None:
                    o.stop()
                    reap(o)
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
            evidence.write(
                self.workdir / f"{name}.evidence.json",
                self.api,
                ns,
                last,
                monitor.timeline,
                violations,
            )
        for o in operators:
            violations += inv.tracebacks(o.log_path.read_text(errors="replace"), o.log_path.name)
        violations += inv.unexpected_exits(exits, inv.fault_kills(seen))
        unfired = Counter(kind for kind, _ in pending)
        unfired.update(outages_unfired)
        kills = len(inv.fault_kills(seen))
        seconds = time.monotonic() - began
        return Run(result, fired, unfired, kills, [f"{name}: {v}" for v in violations], seconds)

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

    def references(self, parallel: int = 1) -> None:
        with ThreadPoolExecutor(parallel) as pool:
            refs = [
                (s, pool.submit(self.run, s, [], True, self.next_index())) for s in self.scenarios
            ]
            for s, future in refs:
                ref = future.result()
                self.reference[s.name] = ref.outcome
                missed = ref.violations + expectation_missed(s, ref.outcome)
                self.tally[s.name].violations += [f"reference run: {v}" for v in missed]
                print(f"reference {s.name} ({ref.seconds:.0f} s): {ref.outcome}", flush=True)

    def judge(self, scenario: Scenario, got: Run) -> Run:
        """A run's own violations, and an outcome other than the reference's; tallied."""
        if got.outcome:
            got.violations += inv.outcome_differs(self.reference[scenario.name], got.outcome)
        with self._lock:
            t = self.tally[scenario.name]
            t.runs += 1
            t.fired.update(got.fired)
            t.unfired.update(got.unfired)
            t.kills += got.kills
            t.violations += got.violations
            t.seconds.append(got.seconds)
        return got

    def campaign(
        self,
        faults_wanted: int,
        per_run: int,
        runs_wanted: int = 0,
        minutes: float = 0,
        parallel: int = 1,
    ) -> bool:
        """Runs until enough faults fired in enough runs, or (`minutes` > 0) no run starts
        after that many minutes: the tally then says how far it got. `parallel` runs at once,
        each in a namespace of its own with operators of its own; every run's scenario, name
        and faults are drawn here, in order, so the schedule is the seed's whatever the
        timing (how many runs it takes to fire enough faults is not)."""
        stop = time.monotonic() + minutes * 60 if minutes > 0 else float("inf")
        self.references(parallel)
        total = runs = 0
        turn = 0
        stopped = False
        running: dict[Future[Run], Scenario] = {}
        with ThreadPoolExecutor(parallel) as pool, _aborting(self._abort):
            while True:
                while (
                    not stopped
                    and len(running) < parallel
                    and (total < faults_wanted or runs + len(running) < runs_wanted)
                ):
                    if time.monotonic() >= stop:
                        print(f"stopped after {minutes:g} minutes", flush=True)
                        stopped = True
                        break
                    s = self.scenarios[turn % len(self.scenarios)]
                    turn += 1
                    rules = self.schedule(s, per_run)
                    running[pool.submit(self.run, s, rules, False, self.next_index())] = s
                if not running:
                    break
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for future in finished:
                    s = running.pop(future)
                    got = self.judge(s, future.result())
                    total += sum(got.fired.values())
                    runs += 1
                    print(
                        f"{s.name} ({got.seconds:.0f} s): fired {dict(got.fired)}, not fired "
                        f"{dict(got.unfired)}, {got.kills} kills, {len(got.violations)} "
                        f"violations {got.violations}",
                        flush=True,
                    )
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
        every = [x for n in names for x in self.tally[n].seconds]
        cells = [round(_mean(self.tally[n].seconds)) for n in names]
        rows.append(
            "| wall time per run, mean (s) | "
            + " | ".join(map(str, cells))
            + f" | {round(_mean(every))} |"
        )
        return "\n".join(rows)


def create_retrying(create: Callable[[], object]) -> None:
    """A create through an apiserver that another run may be restarting: a 503 (not
    processed) is tried again; a 409 after a create whose answer was lost is ours."""
    deadline = time.monotonic() + 120
    lost = False
    while True:
        try:
            create()
            return
        except ApiException as e:
            if e.status == 409 and lost:
                return
            if e.status != 503 or time.monotonic() > deadline:
                raise
        except urllib3.exceptions.HTTPError:
            if time.monotonic() > deadline:
                raise
            lost = True
        time.sleep(1)


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


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
def _aborting(abort: threading.Event) -> Iterator[None]:
    """An error or ^C in the campaign's thread stops the runs in flight (the pool waits for
    them as it closes)."""
    try:
        yield
    except BaseException:
        abort.set()
        raise


@contextmanager
def _stopping(operators: list[Operator]) -> Iterator[None]:
    """However a run ends (an error, ^C), none of its operators outlives it."""
    try:
        yield
    finally:
        for o in operators:
            o.stop()


class _Pauser:
    """The run's apiserver faults in turn, each `after` seconds from the start (or from the
    end of the previous one): a pause (SIGSTOP, then SIGCONT) or a restart (SIGKILL, then
    started again). Others' runs wait meanwhile (one at a time, Apiserver); a fault that
    could not be carried out is the run's violation."""

    def __init__(
        self,
        apiserver: Apiserver | None,
        outages: list[tuple[str, dict[str, Any]]],
        abort: threading.Event,
    ) -> None:
        self.fired: Counter[str] = Counter()
        self.unfired = Counter(kind for kind, _ in outages)
        self.errors: list[str] = []
        self._abort = abort
        self._thread: threading.Thread | None = None
        if apiserver is not None and outages:
            self._thread = threading.Thread(target=self._go, args=(apiserver, outages), daemon=True)
            self._thread.start()

    def _go(self, apiserver: Apiserver, outages: list[tuple[str, dict[str, Any]]]) -> None:
        for kind, o in outages:
            if self._abort.wait(o["after"]):
                return  # the campaign stopped: its cluster may be gone
            try:
                if o["apiserver"] == "pause":
                    apiserver.pause(o["seconds"])
                else:
                    apiserver.restart(o["seconds"])
            except Exception as e:  # noqa: BLE001 - the run's violation
                self.errors.append(f"{kind}: {e!r}")
                return
            self.fired[kind] += 1
            self.unfired[kind] -= 1

    def join(self) -> tuple[Counter[str], Counter[str], list[str]]:
        """(fired, not fired, errors), once every fault was carried out."""
        if self._thread is not None:
            self._thread.join()
        return self.fired, +self.unfired, self.errors


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
    p.add_argument("--parallel", type=int, default=1, help="this many runs at once")
    p.add_argument("--kinds", default="", help="comma-separated fault kinds: only these")
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
            kinds = frozenset(k for k in args.kinds.split(",") if k)
            c = Campaign(
                kubeconfig, workdir, args.seed, scenarios, apiserver=apiserver, kinds=kinds
            )
            try:
                ok = c.campaign(
                    args.faults, args.per_run, args.runs, args.minutes, max(args.parallel, 1)
                )
            finally:
                report(c, args, started)
        return 0 if ok else 1
    finally:
        if os.environ.get("FAULTRUN_KEEP") != "1":
            shutil.rmtree(workdir, ignore_errors=True)


@contextmanager
def cluster_for(
    kubeconfig: Path | None, workdir: Path, scenarios: list[Scenario] | None = None
) -> Iterator[tuple[Path, Apiserver | None]]:
    """The cluster given (it must have what the scenarios need), or one of our own with
    what they need (then also its apiserver: the campaign may stop or restart it)."""
    if kubeconfig is not None:
        yield kubeconfig, None
    else:
        with local_cluster(workdir, needs_of(scenarios or [])) as cluster:
            yield Path(cluster.kubeconfig), Apiserver(cluster)


def report(c: Campaign, args: argparse.Namespace, started: float) -> None:
    """The table and every violation, also when the campaign was cut short."""
    table = c.table()
    print(table)
    for n, t in c.tally.items():
        if t.seconds:
            print(
                f"{n}: {t.runs} runs, wall time per run {_mean(t.seconds):.0f} s mean, "
                f"{max(t.seconds):.0f} s longest"
            )
    every = [x for t in c.tally.values() for x in t.seconds]
    print(
        f"{len(every)} runs ({args.parallel} at once) in {(time.monotonic() - started) / 60:.1f}"
        f" minutes, {_mean(every):.0f} s per run"
    )
    for t in c.tally.values():
        for v in t.violations:
            print("VIOLATION:", v)
    if args.json:
        tally = {
            n: {"runs": t.runs, "fired": t.fired, "unfired": t.unfired, "kills": t.kills,
                "violations": t.violations, "seconds": t.seconds}
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
