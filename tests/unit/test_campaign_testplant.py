"""The operator's planted bugs (torchrun_operator/testplant.py, for the campaign's own tests
only): off unless named, a name that is not a plant refused, and each plant the bug it says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from torchrun_operator import testplant
from torchrun_operator.api.names import LABEL_ATTEMPT

OPERATOR = Path(__file__).resolve().parents[2] / "operator"


def pod(name: str, attempt: int) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {LABEL_ATTEMPT: str(attempt)}, "ownerReferences": []},
        "spec": {"containers": [{"name": "trainer", "command": ["torchrun"], "args": ["x"]}]},
    }


def finished_job(uid: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid}, "status": {"phase": "Succeeded", "counters": {"restarts": 1}}}


def test_unset_every_hook_changes_nothing() -> None:
    assert os.environ.get(testplant.ENV) is None and testplant.PLANTED == ""
    pods = [pod("j-0", 0), pod("j-0-a1", 1)]
    job: dict[str, Any] = {"metadata": {"uid": "u"}, "status": {"attempt": 1, "phase": "Succeeded"}}
    assert testplant.visible_pods(job, pods) is pods
    assert testplant.deletions(job["status"], ["j-0", "j-0-a1"], pods) == ["j-0", "j-0-a1"]
    assert testplant.reconciled_from(job) is job
    assert testplant.twin(pods[0]) is None
    testplant.after_reconcile()
    testplant.after_creates(2)  # would exit the test run if it were planted
    ttl = {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 3}}}
    assert not testplant.deleted_early(ttl, {"phase": "Running"})


def test_a_name_that_is_no_plant_is_refused_at_start() -> None:
    env = dict(os.environ, PYTHONPATH=str(OPERATOR), **{testplant.ENV: "keep-stail"})
    proc = subprocess.run(
        [sys.executable, "-c", "import torchrun_operator.testplant"],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "must be one of" in proc.stderr and "'keep-stail'" in proc.stderr


def test_keep_stale_hides_the_pods_of_earlier_attempts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testplant, "PLANTED", "keep-stale")
    job = {"status": {"attempt": 1}}
    assert [
        p["metadata"]["name"]
        for p in testplant.visible_pods(job, [pod("j-0", 0), pod("j-0-a1", 1)])
    ] == ["j-0-a1"]


def test_keep_stale_never_deletes_the_pods_of_earlier_attempts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The restart's own plan (its status already at attempt 1) deletes attempt 0's pods: the
    plant keeps them, so attempt 1 is created beside them whatever the timing."""
    monkeypatch.setattr(testplant, "PLANTED", "keep-stale")
    pods = [pod("j-0", 0), pod("j-1", 0), pod("j-0-a1", 1)]
    assert testplant.deletions({"attempt": 1}, ["j-0", "j-1", "j-0-a1"], pods) == ["j-0-a1"]


def test_recount_adds_a_restart_once_per_finished_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testplant, "PLANTED", "recount")
    monkeypatch.setattr(testplant, "_done", set())
    job = finished_job("u1")
    got = testplant.reconciled_from(job)
    assert got["status"]["counters"]["restarts"] == 2 and job["status"]["counters"]["restarts"] == 1
    assert testplant.reconciled_from(job) is job  # once per process
    running = {"metadata": {"uid": "u2"}, "status": {"phase": "Running"}}
    assert testplant.reconciled_from(running) is running


def test_double_create_twins_one_pod_per_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testplant, "PLANTED", "double-create")
    monkeypatch.setattr(testplant, "_done", set())
    got = testplant.twin(pod("j-0", 0))
    assert got is not None and got["metadata"]["name"] == "j-0-twin"
    assert got["metadata"]["labels"] == {LABEL_ATTEMPT: "0"}
    assert got["spec"]["containers"][0]["command"] == ["python", "-c", "pass"]
    assert testplant.twin(pod("j-1", 0)) is None
    assert testplant.twin(pod("j-0-a1", 1)) is not None


def test_early_ttl_deletes_a_running_job_that_has_a_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testplant, "PLANTED", "early-ttl")
    ttl = {"spec": {"runPolicy": {"ttlSecondsAfterFinished": 3}}}
    assert testplant.deleted_early(ttl, {"phase": "Running"})
    assert not testplant.deleted_early(ttl, {"phase": "Pending"})
    assert not testplant.deleted_early({"spec": {}}, {"phase": "Running"})  # no TTL
