"""The fault campaign's scenarios (tests/integration/campaign_scenarios.py), without a
cluster: every job is one the API takes, the scripts end as the scenarios need, and the
checks and cluster needs they add say what they should."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))

import campaign_scenarios as cs  # noqa: E402
from torchrun_operator.api.models import JobSpec  # noqa: E402


def test_scenario_names_are_unique_and_all_listed() -> None:
    assert len(cs.BY_NAME) == len(cs.SCENARIOS)
    for name in ("elastic", "hang", "kueue-evict", "gang-native", "hostile-status"):
        assert name in cs.BY_NAME


@pytest.mark.parametrize("scenario", cs.SCENARIOS, ids=lambda s: s.name)
def test_every_scenarios_job_is_one_the_api_takes(scenario: cs.Scenario) -> None:
    doc = scenario.doc(f"{scenario.name}-1")
    spec = JobSpec.model_validate(doc["spec"])
    assert spec.nodes == scenario.nodes


def test_needs_are_the_union_of_the_selected_scenarios() -> None:
    assert cs.needs_of([cs.BY_NAME["success"], cs.BY_NAME["hang"]]) == frozenset()
    picked = [cs.BY_NAME["kueue-evict"], cs.BY_NAME["skewed-clocks"], cs.BY_NAME["ttl"]]
    assert cs.needs_of(picked) == {cs.KUEUE, cs.SKEWED_NODES}


def test_the_kueue_scenario_queues_its_job_and_runs_operators_with_kueue() -> None:
    s = cs.BY_NAME["kueue-evict"]
    doc = s.doc("kueue-evict-1")
    assert doc["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q"
    assert s.prepare is not None and s.during is not None
    assert "--kueue" in s.operator_args


def test_the_skewed_scenario_runs_only_on_the_skewed_nodes_one_pod_each() -> None:
    pod = cs.BY_NAME["skewed-clocks"].doc("skewed-clocks-1")["spec"]["template"]["spec"]
    [toleration] = pod["tolerations"]
    assert {k: toleration[k] for k in ("key", "value", "effect")} == cs.CLOCK_TAINT
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    [[expr]] = [t["matchExpressions"] for t in terms["nodeSelectorTerms"]]
    assert expr == {"key": cs.CLOCK_LABEL, "operator": "Exists"}
    [anti] = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    # An hour ahead and far behind, as issue 25 names them.
    assert sorted(cs.CLOCK_SKEWS.values()) == [-6 * 3600.0, 3600.0]


def test_expectation_missed_names_each_field_not_as_expected() -> None:
    s = cs.Scenario("x", cs.campaign_job, expect={"phase": "Succeeded", "attempt": 1})
    assert cs.expectation_missed(s, {"phase": "Succeeded", "attempt": 1, "counters": {}}) == []
    missed = cs.expectation_missed(s, {"phase": "Failed", "attempt": 1})
    assert missed == ["outcome phase: 'Failed', expected 'Succeeded'"]
    assert cs.expectation_missed(cs.BY_NAME["success"], {"phase": "Failed"}) == []


def code_of(scenario: str) -> str:
    command: list[str] = cs.BY_NAME[scenario].doc("j")["spec"]["template"]["spec"]["containers"][0][
        "command"
    ]
    assert command[:2] == ["python", "-c"]
    return command[2]


def run_script(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # A timeout only so that a script that would sleep fails the test instead of hanging it.
    return subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(
    ("pod", "marked"), [("j-2-a0r1", False), ("j-0", True)], ids=["replacement", "survivor"]
)
def test_elastic_workers_end_at_once_in_a_replacement_or_after_a_full_round(
    pod: str, marked: bool, tmp_path: Path
) -> None:
    mark = tmp_path / "full-round"
    if marked:  # left by this pod's workers of a full round before the round changed
        mark.touch()
    code = code_of("elastic").replace("/scratch/full-round", str(mark))
    done = run_script(code, {"POD_NAME": pod, "RANK": "0", "WORLD_SIZE": "3"})
    assert done.returncode == 0, done.stderr


def test_the_hang_scripts_later_attempt_reports_three_steps_and_ends(tmp_path: Path) -> None:
    progress = tmp_path / "progress"
    env = {
        "TORCHRUN_OPERATOR_PROGRESS_FILE": str(progress),
        "TORCHELASTIC_RUN_ID": "uid-1",
        "RANK": "1",
    }
    done = run_script(code_of("hang"), env)
    assert done.returncode == 0, done.stderr
    assert progress.read_text() == "3\n"


def test_the_skewed_hang_must_end_as_the_unskewed_hang_does() -> None:
    # The hang's fault-free outcome on plain nodes (a reference run, 2026-11-27), in the
    # form campaign_invariants.outcome gives it: what the skewed run's reference must equal.
    plain = {
        "phase": "Succeeded",
        "attempt": 1,
        "counters": {"infrastructureFailures": 1, "restarts": 1, "userFailures": 0},
        "failure": {"rank": None, "kind": "stalled", "reason": "ProgressStalled", "exitCode": None},
        "restarts": [(1, "infrastructure", "ProgressStalled")],
    }
    skewed = cs.BY_NAME["skewed-clocks"]
    assert cs.expectation_missed(skewed, plain) == []
    # A node far behind failing the job as a user error at once would be caught.
    wrong = {**plain, "phase": "Failed", "attempt": 0, "restarts": []}
    assert len(cs.expectation_missed(skewed, wrong)) == 3
