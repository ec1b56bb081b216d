"""The fault campaign can fail: each of its invariant families catches a bug planted in the
operator (TORCHRUN_OPERATOR_TEST_PLANT, operator/torchrun_operator/testplant.py), and the
same runs without the plant report nothing.

Each planted run is one short campaign run (no faults: the bug alone), judged exactly as
the campaign judges every run (faultrun.Campaign.run, then judge against the fault-free
reference). Like test_fault_injection.py, it starts a cluster of its own on the local
cluster: the campaign's operators, one at a time and scoped to the run's namespace, must not
share jobs with the suite's operator. On another cluster it runs on the session's, with the
suite's operator stopped for the module (the plants need no apiserver fault).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from campaign_cluster import local_cluster
from campaign_scenarios import BY_NAME
from faultrun import Campaign
from localkube.testing import use_external_cluster

SCENARIOS = [BY_NAME["success"], BY_NAME["gang-restart"], BY_NAME["ttl"]]


@pytest.fixture(scope="module")
def kubeconfig(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Path]:
    if use_external_cluster():
        cluster: Any = request.getfixturevalue("cluster")
        operator: Any = request.getfixturevalue("operator")
        operator.kill()
        try:
            yield Path(cluster.kubeconfig)
        finally:
            operator.start()
        return
    with local_cluster(tmp_path_factory.mktemp("campaign-cluster")) as c:
        yield Path(c.kubeconfig)


@pytest.fixture(scope="module")
def reference(kubeconfig: Path, tmp_path_factory: pytest.TempPathFactory) -> Campaign:
    """The fault-free outcomes, from an operator without a plant."""
    c = Campaign(kubeconfig, tmp_path_factory.mktemp("reference"), seed=1, scenarios=SCENARIOS)
    c.references()
    assert [v for t in c.tally.values() for v in t.violations] == []
    return c


def violations(reference: Campaign, scenario: str, plant: str | None, tmp: Path) -> list[str]:
    """The violations of one campaign run of `scenario` (no faults) with `plant`."""
    s = BY_NAME[scenario]
    c = Campaign(reference.kubeconfig, tmp, seed=2, scenarios=[s], plant=plant)
    c.reference = reference.reference
    return c.judge(s, c.run(s, [])).violations


@pytest.mark.timeout(600)
@pytest.mark.parametrize("scenario", ["success", "gang-restart", "ttl"])
def test_without_a_plant_a_run_keeps_every_invariant(
    reference: Campaign, scenario: str, tmp_path: Path
) -> None:
    # The operator restarted once more, its logs, its exits and the pod watch: all clean.
    assert violations(reference, scenario, None, tmp_path) == []


@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    ("plant", "scenario", "caught"),
    [
        # Attempts mix: the gang restart's new pods beside the failed attempt's.
        ("keep-stale", "gang-restart", "of attempt 1 created while"),
        # Pods per attempt: a twin of the first pod, not counted anywhere.
        ("double-create", "success", "attempt 0: 3 pods created, at most 2 allowed"),
        # The outcome after one more restart: a restarted operator counts a restart.
        ("recount", "success", "outcome counters:"),
        # The log: an error logged with its traceback.
        ("traceback", "success", "traceback in"),
        # Exits: an operator that ended by itself, not by a kill fault.
        ("exit", "success", "exited by itself (status 3)"),
        # The TTL: a job deleted before it finished (held, so read as it was deleted).
        ("early-ttl", "ttl", "deleted while 'Running', unfinished"),
    ],
)
def test_each_invariant_catches_its_planted_bug(
    reference: Campaign, plant: str, scenario: str, caught: str, tmp_path: Path
) -> None:
    found = violations(reference, scenario, plant, tmp_path)
    assert [v for v in found if caught in v], found
