"""One run of the fault campaign (tests/integration/faultrun.py): a scenario's job in a
namespace of its own, under operators whose requests fail as the run's schedule says (a
killed one started again at once) and the apiserver outages it drew, with what the
invariants (tests/campaign_invariants.py) say of that run alone. Comparing its outcome with
the reference's, and the tally, are the Campaign's."""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import campaign_evidence as evidence
import campaign_invariants as inv
import urllib3
from campaign_cluster import RESTARTING_STATUSES, Apiserver, Pauser, resilient_client
from campaign_faults import LEASE
from campaign_monitor import PodMonitor
from campaign_operator import Operator, stopping
from campaign_scenarios import FINISHED, HOLD, Scenario, Wait
from dtj import GROUP, JOB_LABEL, PLURAL, VERSION, create_job
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube.testing import create_namespace, wait_for

JOB_TIMEOUT = 240.0  # plus the time the apiserver was down meanwhile (Apiserver.down)
# Every run's namespace starts so (a cleanup after a killed campaign finds them by it).
NAMESPACE_PREFIX = "faults-"
# A new namespace's default ServiceAccount comes from kube-controller-manager, which after an
# apiserver restart (another run's fault) lists everything again before it acts: on the
# loaded 2-core machine that took over a minute.
NAMESPACE_READY_SECONDS = 180.0
SETTLE_TIMEOUT = 90.0
# Lists and releases before a run's namespace is deleted: a 409 (an operator wrote the job
# in between) leaves a job held, and its namespace stuck Terminating.
RELEASE_TRIES = 5
PLANT_ENV = "TORCHRUN_OPERATOR_TEST_PLANT"


@dataclass
class Run:
    outcome: dict[str, Any]
    fired: Counter[str]
    unfired: Counter[str]
    kills: int
    violations: list[str]
    seconds: float = 0.0  # wall time, from the namespace's creation to the judgement


class Runner:
    """Runs a scenario's job under a schedule of faults (`run`; runs side by side, each in a
    thread of its own); the Campaign draws the schedules and judges the runs."""

    def __init__(
        self,
        kubeconfig: Path,
        workdir: Path,
        plant: str | None = None,
        apiserver: Apiserver | None = None,
    ) -> None:
        self.kubeconfig = kubeconfig
        self.api = resilient_client(kubeconfig)
        self.workdir = workdir
        # A bug planted in the operators of the runs with faults (never the reference's).
        self.plant = plant
        # The apiserver, when this campaign may stop or restart it (its own cluster).
        self.apiserver = apiserver
        self._n = 0
        self._lock = threading.Lock()  # runs in parallel threads: _n and the tally
        # Set when the campaign ends early (an error, ^C): the runs in flight stop too.
        self._abort = threading.Event()

    def _down(self) -> float:
        return self.apiserver.down if self.apiserver is not None else 0.0

    def wait(self, what: str, check: Any, timeout: float, interval: float = 0.2) -> Any:
        """wait_for for the scenarios' drivers, its `timeout` extended by the apiserver's
        outages while it waits: a job moves not at all while the apiserver is stopped or
        restarting, and the runs side by side share it (kueue-evict-33 of 2026-11-28 waited
        180 s for Running through 105 s of other runs' outages, and the wait ran out)."""
        down = self._down()
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            lived = self._down() - down
            if time.monotonic() > deadline + lived:
                raise TimeoutError(
                    f"timed out after {timeout:.0f}s and {lived:.0f}s of apiserver outages "
                    f"waiting for {what}; last: {result!r}"
                )
            time.sleep(interval)

    def next_index(self) -> int:
        with self._lock:
            self._n += 1
            return self._n

    @contextmanager
    def namespace(self, index: int) -> Iterator[str]:
        # Not from the seeded generator: campaigns on one cluster must not share names.
        ns = f"{NAMESPACE_PREFIX}{index}-{secrets.token_hex(3)}"
        create_retrying(lambda: create_namespace(self.api, ns, NAMESPACE_READY_SECONDS))
        core = client.CoreV1Api(self.api)
        try:
            yield ns
        finally:
            release_held(self.api, ns)  # a run that ended before it let its TTL's job go
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
            stopping(operators),
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
            driver = _Driver(scenario, self.api, ns, name, self.wait)
            pauser = Pauser(self.apiserver, outages, self._abort)
            done: dict[str, Any] | None = None
            deadline = time.monotonic() + JOB_TIMEOUT
            down_before = self._down()
            while time.monotonic() < deadline + self._down() - down_before:
                if self._abort.is_set():
                    raise RuntimeError("the campaign was stopped")
                tend()
                job: Any = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                if job["metadata"].get("deletionTimestamp"):
                    # Deleted by its TTL between two reads; held (HOLD), so judged by the
                    # status it was deleted in.
                    done = job
                    violations += deleted_unfinished(job)
                    break
                if phase_of(job) in FINISHED and not driver.busy():
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
                """Deleted (the job had finished: `job`), let go (HOLD), then gone."""
                tend()
                try:
                    got: Any = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
                except ApiException as e:
                    return e.status == 404
                if got["metadata"].get("deletionTimestamp"):
                    release(custom, ns, got)
                return False

            try:
                wait_for("TTL deletion", gone, 60, interval=0.3)
            except TimeoutError:
                return ["job outlived its TTL"]
        return []


def phase_of(job: dict[str, Any]) -> str | None:
    phase = (job.get("status") or {}).get("phase")
    return phase if isinstance(phase, str) else None


def deleted_unfinished(job: dict[str, Any]) -> list[str]:
    """A TTL deletes a job once it has finished, never before."""
    phase = phase_of(job)
    return [] if phase in FINISHED else [f"deleted while {phase!r}, unfinished"]


def held(job: dict[str, Any]) -> bool:
    return HOLD in (job["metadata"].get("finalizers") or [])


def release(custom: client.CustomObjectsApi, ns: str, job: dict[str, Any]) -> None:
    """Lets a job the harness holds (HOLD) go: its finalizers without ours, at the version
    read (a 409: the caller reads it again; a 404: gone already)."""
    if not held(job):
        return
    meta = job["metadata"]
    rest = [f for f in meta["finalizers"] if f != HOLD]
    patch = {"metadata": {"finalizers": rest, "resourceVersion": meta["resourceVersion"]}}
    try:
        custom.patch_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, meta["name"], patch)
    except ApiException as e:
        if e.status not in (404, 409):
            raise


def release_held(api: client.ApiClient, ns: str) -> None:
    """Lets every job of `ns` that the harness still holds go, so that deleting the
    namespace ends (a run cut short, or a campaign killed, before its TTL's job was let go)."""
    custom = client.CustomObjectsApi(api)
    for _ in range(RELEASE_TRIES):  # a 409: an operator wrote the job meanwhile
        listed: Any = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        holding = [j for j in listed.get("items") or [] if held(j)]
        if not holding:
            return
        for job in holding:
            release(custom, ns, job)


def create_retrying(create: Callable[[], object]) -> None:
    """A create through an apiserver that another run may be restarting: a refusal before
    anything was written (RESTARTING_STATUSES) is tried again; a 409 after a create whose
    answer was lost is ours."""
    deadline = time.monotonic() + 120
    lost = False
    while True:
        try:
            create()
            return
        except ApiException as e:
            if e.status == 409 and lost:
                return
            if e.status not in RESTARTING_STATUSES or time.monotonic() > deadline:
                raise
        except urllib3.exceptions.HTTPError:
            if time.monotonic() > deadline:
                raise
            lost = True
        time.sleep(1)


class _Driver:
    """The scenario's own action while the job runs (suspend and resume), in a thread; an
    error of its own is the run's violation."""

    def __init__(
        self, scenario: Scenario, api: client.ApiClient, ns: str, name: str, wait: Wait
    ) -> None:
        self.errors: list[str] = []
        self._thread: threading.Thread | None = None
        if scenario.during is not None:
            during = scenario.during

            def go() -> None:
                try:
                    during(api, ns, name, wait)
                except Exception as e:  # noqa: BLE001 - reported as the run's violation
                    self.errors.append(f"{scenario.name} driver: {e!r}")

            self._thread = threading.Thread(target=go, daemon=True)
            self._thread.start()

    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
