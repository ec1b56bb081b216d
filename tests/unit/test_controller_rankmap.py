"""The controller feeds the rank-map reader's answers into reconcile (`live=`) and tells the
reader which pods to read after each reconcile; the job's NetworkPolicy admits the operator."""

from __future__ import annotations

from typing import Any

import pytest
from test_controller import Harness, make_job, running, start, terminated
from torchrun_operator.controller import Controller


class FakeReader:
    def __init__(self) -> None:
        self.answers: dict[str, Any] = {}
        self.tracked: list[tuple[list[str], int | None]] = []
        self.ports: list[int] = []
        self.forgotten: list[Any] = []

    def live(self, key: Any) -> dict[str, Any]:
        return dict(self.answers)

    def track(self, key: Any, pods: list[dict[str, Any]], attempt: int | None, port: int) -> None:
        self.tracked.append((sorted(p["metadata"]["name"] for p in pods), attempt))
        self.ports.append(port)

    def forget(self, key: Any) -> None:
        self.forgotten.append(key)

    def stop(self) -> None:
        pass


def with_reader(h: Harness) -> FakeReader:
    reader = FakeReader()
    h.ctrl.rankmap = reader  # type: ignore[assignment]
    return reader


def test_live_answers_reach_the_status_and_the_reader_follows_the_pods() -> None:
    h = Harness(make_job())
    reader = with_reader(h)
    start(h)
    assert reader.tracked[-1] == (["job-0", "job-1"], 0)
    for name in ("job-0", "job-1"):
        h.api.set_pod(name, {**running(), "podIP": "10.0.0.1"})
    uid = h.api.pods()["job-1"]["metadata"]["uid"]
    data = {"v": 1, "index": 1, "rdzvId": "job-uid-0", "groupRank": 0, "ranks": [0], "round": 0}
    reader.answers = {uid: {"at": 1.0, "data": data}}
    h.sync(1)
    ranks = h.status["ranks"]
    assert (ranks[1]["index"], ranks[1]["nodeRank"], ranks[1]["globalRanks"]) == (1, 0, "0")
    assert "nodeRank" not in ranks[0]
    # A finished job is no longer read.
    h.api.set_pod("job-0", terminated(0))
    h.api.set_pod("job-1", terminated(0))
    h.sync(1)
    assert h.status["phase"] == "Succeeded"
    assert reader.tracked[-1] == ([], 0)
    assert set(reader.ports) == {29401}  # the pod contract's status port


def test_a_host_network_jobs_pods_are_read_on_its_own_status_port() -> None:
    job = make_job()
    job["spec"]["template"]["spec"]["hostNetwork"] = True
    h = Harness(job)
    reader = with_reader(h)
    start(h)
    pod = h.api.pods()["job-0"]
    declared = {p["name"]: p["containerPort"] for p in pod["spec"]["containers"][0]["ports"]}
    assert reader.ports[-1] == declared["torchrun-status"] != 29401


def test_a_forgotten_job_is_forgotten_by_the_reader() -> None:
    h = Harness(make_job())
    reader = with_reader(h)
    start(h)
    h.ctrl.on_job_event("DELETED", h.api.job)
    assert reader.forgotten == [("ns", "job")]


@pytest.mark.parametrize("namespace", [None, "torchrun-system"])
def test_the_policy_admits_the_operator_where_it_knows_its_namespace(
    namespace: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    h = Harness(make_job())
    h.ctrl = Controller(None, workers=1, operator_namespace=namespace)  # type: ignore[arg-type]
    h.ctrl.custom = h.api  # type: ignore[assignment]
    h.ctrl.writes = h.api  # type: ignore[assignment]
    h.ctrl.active.set()
    h.sync()
    policy = h.api.objects[("NetworkPolicy", "job")]
    rules = policy["spec"]["ingress"]
    if namespace is None:
        assert len(rules) == 1
    else:
        (peer,) = rules[1]["from"]
        assert peer["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "torchrun-system"
        }
        assert rules[1]["ports"] == [{"port": 29401, "protocol": "TCP"}]


def test_pod_namespace_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    ctrl = Controller(None, workers=1)  # type: ignore[arg-type]
    assert ctrl._operator_peer is not None and ctrl._operator_peer.namespace == "ops"
    assert Controller(None, live_status=False).rankmap is None  # type: ignore[arg-type]
