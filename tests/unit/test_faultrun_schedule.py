"""The fault campaign's pure parts (tests/integration/faultrun.py): its schedule (a function
of the seed, of the kinds asked for only, split brain aimed at the leader's Lease renewals)
and the pod monitor's relist after an apiserver restart (campaign_monitor.py)."""

from __future__ import annotations

import random
import sys
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
import faultrun  # noqa: E402
from campaign_cluster import Apiserver  # noqa: E402
from campaign_monitor import relist_events  # noqa: E402
from campaign_run import Run, deleted_unfinished  # noqa: E402
from campaign_scenarios import HOLD, SCENARIOS  # noqa: E402
from faultrun import Campaign, Tally  # noqa: E402
from torchrun_operator.kube.leader import LEASE_DURATION_SECONDS, RETRY_PERIOD_SECONDS  # noqa: E402


def campaign(seed: int, kinds: frozenset[str] = frozenset(), apiserver: bool = True) -> Any:
    """A Campaign as far as scheduling goes: no cluster needed to draw faults."""
    c = object.__new__(Campaign)
    c.rng = random.Random(seed)
    c.kinds = kinds
    c.apiserver = object.__new__(Apiserver) if apiserver else None  # not started
    c.drawn = 0
    return c


def draws(c: Any, runs: int = 20) -> list[list[tuple[str, dict[str, Any]]]]:
    s = SCENARIOS
    return [c.schedule(s[i % len(s)], 4) for i in range(runs)]


def test_the_schedule_is_the_seeds() -> None:
    assert draws(campaign(5)) == draws(campaign(5))
    assert draws(campaign(5)) != draws(campaign(6))


def test_only_the_kinds_asked_for_are_scheduled() -> None:
    kinds = frozenset({"split brain", "apiserver restarted"})
    got = {k for run in draws(campaign(1, kinds), 40) for k, _ in run}
    assert got == kinds


def test_split_brain_fails_the_lease_renewals_and_outages_need_our_own_apiserver() -> None:
    runs = draws(campaign(2, frozenset({"split brain"})))
    rules = [r for run in runs for _, r in run]
    assert rules and all(r["method"] == "PUT" and "/leases/" in r["path"] for r in rules)
    # Longer than the leader's term and lease, at one renewal a retry period.
    assert all(
        r["action"] == "status" and r["times"] * RETRY_PERIOD_SECONDS > LEASE_DURATION_SECONDS
        for r in rules
    )
    outages = frozenset({"apiserver restarted", "apiserver stopped 20 s"})
    assert draws(campaign(3, outages, apiserver=False)) == [[]] * 20
    rules = [r for run in draws(campaign(3, outages)) for _, r in run]
    assert {r["apiserver"] for r in rules} == {"pause", "restart"}


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fault kinds"):
        Campaign(Path("/nonexistent"), Path("/tmp"), 1, kinds=frozenset({"5OO"}))


def pod(uid: str, rv: str, created: str) -> dict[str, Any]:
    meta = {"uid": uid, "name": f"p-{uid}", "resourceVersion": rv, "creationTimestamp": created}
    return {"metadata": meta}


def test_a_relist_after_a_restart_records_what_changed_gone_first() -> None:
    live = {"a": pod("a", "1", "t1"), "b": pod("b", "2", "t1"), "c": pod("c", "3", "t1")}
    items = [pod("e", "9", "t3"), pod("b", "2", "t1"), pod("c", "7", "t1"), pod("d", "8", "t2")]
    got = [(t, p["metadata"]["uid"]) for t, p in relist_events(live, items)]
    assert got == [("DELETED", "a"), ("ADDED", "d"), ("ADDED", "e"), ("MODIFIED", "c")]
    assert relist_events({}, []) == []


def runnable(seed: int, scenarios: int) -> Any:
    """A campaign over the first `scenarios` scenarios that can run, once given its `run`."""
    c = campaign(seed, apiserver=False)
    c.scenarios = SCENARIOS[:scenarios]
    c.tally = {s.name: Tally() for s in c.scenarios}
    c.reference = {}
    c._lock, c._abort, c._n = threading.Lock(), threading.Event(), 0
    return c


def test_a_run_the_harness_cannot_finish_is_counted_and_the_campaign_goes_on() -> None:
    # One run's own request to the cluster fails (a namespace that got no ServiceAccount in
    # time): the campaign records it apart from the operator's violations, fails, and
    # carries on with the other runs instead of losing them all.
    c = runnable(4, 2)
    broken = c.scenarios[0].name

    def run(scenario: Any, rules: Any, reference: bool = False, index: Any = None) -> Run:
        if scenario.name == broken and not reference:
            raise TimeoutError("timed out waiting for default ServiceAccount")
        return Run({}, Counter({"500": 1}), Counter(), 0, [], 1.0)

    c.run = run
    ok = c.campaign(faults_wanted=0, per_run=1, runs_wanted=4, parallel=2)
    assert not ok
    assert len(c.tally[broken].harness) == 2 and "ServiceAccount" in c.tally[broken].harness[0]
    assert c.tally[broken].runs == 0 and not c.tally[broken].violations
    assert c.tally[c.scenarios[1].name].runs == 2
    assert "runs the harness could not finish | 2 | 0 | 2 |" in c.table()


def test_a_harness_that_cannot_finish_a_run_ends_a_campaign_that_still_wants_faults() -> None:
    c = runnable(4, 2)
    started: list[str] = []

    def run(scenario: Any, rules: Any, reference: bool = False, index: Any = None) -> Run:
        if reference:
            return Run({}, Counter(), Counter(), 0, [], 1.0)
        started.append(scenario.name)
        raise RuntimeError("the harness cannot reach the cluster")

    c.run = run
    assert not c.campaign(faults_wanted=8, per_run=1, parallel=2)
    harness = sum(len(t.harness) for t in c.tally.values())
    # Stopped at the limit; the runs already in flight then finished.
    assert faultrun.HARNESS_ERRORS_MAX <= harness == len(started) <= faultrun.HARNESS_ERRORS_MAX + 1


def stubbed(seed: int) -> tuple[Any, list[tuple[str, Any]]]:
    """A campaign whose runs only record their scenario and schedule; each fires one 500."""
    c = runnable(seed, 3)
    ran: list[tuple[str, Any]] = []

    def run(scenario: Any, rules: Any, reference: bool = False, index: Any = None) -> Run:
        if not reference:
            ran.append((scenario.name, rules))
        return Run({}, Counter({"500": 1}), Counter(), 0, [], 1.0)

    c.run = run
    return c, ran


def test_a_resumed_campaign_goes_on_with_the_schedule_and_the_tally_of_an_unbroken_one() -> None:
    whole, ran_whole = stubbed(9)
    assert whole.campaign(faults_wanted=0, per_run=3, runs_wanted=7)
    first, ran_first = stubbed(9)
    assert first.campaign(faults_wanted=0, per_run=3, runs_wanted=4)
    second, ran_second = stubbed(9)
    second.load_tally(first.dump_tally())
    second.skip(first.drawn, per_run=3)
    # The earlier part's 4 runs count towards the 7 wanted: 3 more run.
    assert second.campaign(faults_wanted=0, per_run=3, runs_wanted=7)
    assert ran_first + ran_second == ran_whole
    assert {n: t["runs"] for n, t in second.dump_tally().items()} == {
        n: t["runs"] for n, t in whole.dump_tally().items()
    }
    assert second.table() == whole.table()


def test_resume_refuses_another_campaign_or_other_code(tmp_path: Path, monkeypatch: Any) -> None:
    saved = tmp_path / "tally.json"
    args = faultrun.argparse.Namespace(
        seed=1, per_run=6, scenarios="", kinds="", json=saved, parallel=3
    )
    with pytest.raises(SystemExit, match="needs --json"):
        faultrun.resumed(args)
    monkeypatch.setattr(faultrun, "commit", lambda: "abc123")
    saved.write_text(faultrun.json.dumps({"meta": faultrun.meta(args, 5, []), "tally": {}}))
    assert faultrun.resumed(args)["meta"]["drawn"] == 5
    other = faultrun.argparse.Namespace(**{**vars(args), "seed": 2})
    with pytest.raises(SystemExit, match="seed"):
        faultrun.resumed(other)
    monkeypatch.setattr(faultrun, "commit", lambda: "def456")
    with pytest.raises(SystemExit, match="commit"):
        faultrun.resumed(args)
    monkeypatch.setattr(faultrun, "commit", lambda: "abc123-dirty")
    with pytest.raises(SystemExit, match="not the same campaign"):
        faultrun.resumed(args)


def test_a_drivers_wait_does_not_count_the_apiservers_outages() -> None:
    """A driver's wait ends at its timeout on the cluster's time: an outage of the apiserver
    meanwhile (another run's, they share it) extends it by as long."""
    c = campaign(1)
    c.apiserver.down = 0.0
    polls: list[int] = []

    def check() -> bool:
        polls.append(1)
        if len(polls) == 3:
            c.apiserver.down += 0.5  # an outage ended while this wait waited
        return len(polls) == 20

    assert c.wait("the job", check, timeout=0.2, interval=0.03)
    c.apiserver.down = 0.0
    with pytest.raises(TimeoutError, match="after 0s and 0s of apiserver outages waiting for"):
        c.wait("the job", lambda: False, timeout=0.1, interval=0.03)


def test_the_ttl_job_is_held_and_a_deletion_before_its_end_is_a_violation() -> None:
    ttl = next(s for s in SCENARIOS if s.ttl)
    assert ttl.doc("ttl-1")["metadata"]["finalizers"] == [HOLD]
    assert all(HOLD not in (s.doc("x")["metadata"].get("finalizers") or []) for s in SCENARIOS
               if not s.ttl)  # fmt: skip

    def job(phase: str | None) -> dict[str, Any]:
        return {"metadata": {"name": "j"}, "status": {"phase": phase}}

    assert deleted_unfinished(job("Succeeded")) == deleted_unfinished(job("Failed")) == []
    assert deleted_unfinished(job("Running")) == ["deleted while 'Running', unfinished"]
    assert deleted_unfinished({"metadata": {"name": "j"}}) == ["deleted while None, unfinished"]


def test_the_tables_header_counts_judged_runs_and_says_what_was_not_judged() -> None:
    args = faultrun.argparse.Namespace(seed=13, per_run=6, runs=3, faults=4)
    parts = [{"minutes": 10.2}, {"minutes": 20.4}]
    tally = {"a": Tally(runs=2, fired=Counter(kill=5)), "b": Tally(harness=["TimeoutError: x"])}
    header = faultrun.table_header(tally, args, parts, "2026-11-28 10:00 UTC", "abc123")
    assert header.startswith("Last full run: 2026-11-28 10:00 UTC, commit abc123, seed 13, 6 ")
    assert "2 runs, 5 faults fired, 31 minutes" in header
    assert "in 2 parts (--resume); 1 more runs not judged (harness errors)" in header
    assert header.endswith("(short of the 3 runs and 4 faults asked for).")
    tally["b"] = Tally(runs=1)
    header = faultrun.table_header(tally, args, parts[:1], "when", "abc123")
    assert header.endswith("3 runs, 5 faults fired, 10 minutes on the 2-core development machine.")
