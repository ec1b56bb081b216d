"""Pure pod-status computation and restart decisions of the process node."""

from __future__ import annotations

from typing import Any

import pytest
from localkube.node.probes import ProbeTracker
from localkube.node.status import (
    Observed,
    PodObservation,
    backoff_seconds,
    exit_code_for,
    phase,
    pod_status,
    should_restart,
)

T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"


def run(name: str = "main", **kw: Any) -> Observed:
    return Observed(name=name, image="img", state="running", started_at=T0, **kw)


def done(code: int, name: str = "main", **kw: Any) -> Observed:
    return Observed(
        name=name,
        image="img",
        state="terminated",
        exit_code=code,
        started_at=T0,
        finished_at=T1,
        **kw,
    )


def wait(name: str = "main", **kw: Any) -> Observed:
    return Observed(name=name, image="img", state="waiting", **kw)


def obs(
    containers: list[Observed],
    init: list[Observed] | None = None,
    policy: str = "Never",
    final: bool = False,
) -> PodObservation:
    return PodObservation(
        init=init or [],
        containers=containers,
        now=T1,
        restart_policy=policy,
        pod_ip="10.246.1.2",
        host_ip="10.246.0.1",
        start_time=T0,
        sandbox_ready=True,
        final=final,
    )


@pytest.mark.parametrize(
    ("containers", "init", "policy", "final", "want"),
    [
        ([wait()], None, "Never", False, "Pending"),
        ([run()], None, "Never", False, "Running"),
        ([done(0)], None, "Never", False, "Succeeded"),
        ([done(1)], None, "Never", False, "Failed"),
        ([done(0), done(2, "b")], None, "Never", False, "Failed"),
        ([done(0), run(name="b")], None, "Never", False, "Running"),
        ([done(1)], None, "OnFailure", False, "Running"),  # about to restart
        ([done(0)], None, "OnFailure", False, "Succeeded"),
        ([done(0)], None, "Always", False, "Running"),
        ([done(143)], None, "Always", True, "Failed"),  # deleted: no more restarts
        ([done(0)], None, "Always", True, "Succeeded"),
        ([wait(restart_count=2, reason="CrashLoopBackOff")], None, "OnFailure", False, "Running"),
        ([wait()], [run("init")], "Never", False, "Pending"),
        ([wait()], [done(1, "init")], "Never", False, "Failed"),
        ([wait()], [done(1, "init")], "OnFailure", False, "Pending"),
        ([run()], [done(0, "init")], "Never", False, "Running"),
        ([wait()], None, "Always", True, "Failed"),  # deleted before it ever started
    ],
)
def test_phase(
    containers: list[Observed], init: list[Observed] | None, policy: str, final: bool, want: str
) -> None:
    assert phase(obs(containers, init, policy, final)) == want


def conds(status: dict[str, Any]) -> dict[str, tuple[str, str | None]]:
    return {c["type"]: (c["status"], c.get("reason")) for c in status["conditions"]}


def test_running_ready_pod_status() -> None:
    scheduled = {"type": "PodScheduled", "status": "True", "lastTransitionTime": T0}
    st = pod_status(
        {"qosClass": "BestEffort", "conditions": [scheduled]},
        obs([run(ready=True, container_id="localkube://1")]),
    )
    assert st["phase"] == "Running" and st["qosClass"] == "BestEffort"
    assert (st["podIP"], st["podIPs"]) == ("10.246.1.2", [{"ip": "10.246.1.2"}])
    assert (st["hostIP"], st["hostIPs"]) == ("10.246.0.1", [{"ip": "10.246.0.1"}])
    assert st["startTime"] == T0
    assert conds(st) == {
        "PodScheduled": ("True", None),
        "PodReadyToStartContainers": ("True", None),
        "Initialized": ("True", None),
        "ContainersReady": ("True", None),
        "Ready": ("True", None),
    }
    cs = st["containerStatuses"][0]
    assert cs["state"] == {"running": {"startedAt": T0}}
    assert (cs["ready"], cs["started"], cs["restartCount"], cs["containerID"]) == (
        True,
        True,
        0,
        "localkube://1",
    )


def test_unready_container_names_itself() -> None:
    st = pod_status({}, obs([run(ready=True), run("side", ready=False)]))
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "ContainersNotReady")
    assert ready["message"] == "containers with unready status: [side]"


def test_terminated_container_status_carries_exit_details() -> None:
    st = pod_status({}, obs([done(137, signal=9, reason="Error", message="killed")]))
    t = st["containerStatuses"][0]["state"]["terminated"]
    assert (t["exitCode"], t["signal"], t["reason"], t["message"]) == (137, 9, "Error", "killed")
    assert (t["startedAt"], t["finishedAt"]) == (T0, T1)
    assert st["phase"] == "Failed"
    assert conds(st)["Ready"] == ("False", "PodCompleted")


def test_last_transition_time_kept_while_status_unchanged() -> None:
    first = pod_status({}, obs([run(ready=True)]))
    later = pod_status(
        first,
        PodObservation(
            init=[],
            containers=[run(ready=True)],
            now="2030-01-01T00:00:00Z",
            restart_policy="Never",
            pod_ip="10.246.1.2",
            sandbox_ready=True,
        ),
    )
    assert later["conditions"] == first["conditions"]
    flipped = pod_status(
        first,
        PodObservation(
            init=[],
            containers=[run(ready=False)],
            now="2030-01-01T00:00:00Z",
            restart_policy="Never",
            pod_ip="10.246.1.2",
            sandbox_ready=True,
        ),
    )
    ready = next(c for c in flipped["conditions"] if c["type"] == "Ready")
    assert ready["lastTransitionTime"] == "2030-01-01T00:00:00Z"


def test_restart_shows_last_state_and_init_statuses() -> None:
    last = {"exitCode": 1, "reason": "Error", "startedAt": T0, "finishedAt": T1}
    st = pod_status(
        {}, obs([run(restart_count=1, last_terminated=last)], [done(0, "init")], policy="OnFailure")
    )
    cs = st["containerStatuses"][0]
    assert cs["lastState"] == {"terminated": last} and cs["restartCount"] == 1
    assert st["initContainerStatuses"][0]["state"]["terminated"]["reason"] == "Completed"


@pytest.mark.parametrize(
    ("policy", "code", "want"),
    [
        ("Always", 0, True),
        ("Always", 1, True),
        ("OnFailure", 0, False),
        ("OnFailure", 2, True),
        ("Never", 1, False),
    ],
)
def test_should_restart(policy: str, code: int, want: bool) -> None:
    assert should_restart(policy, code) is want


def test_backoff_doubles_and_caps() -> None:
    assert [backoff_seconds(n) for n in range(0, 8)] == [0, 10, 20, 40, 80, 160, 300, 300]
    assert backoff_seconds(3, base=0.5) == 2.0


def test_signal_exit_codes() -> None:
    assert exit_code_for(None, 15) == 143 and exit_code_for(None, 9) == 137
    assert exit_code_for(3, None) == 3


def test_probe_tracker_thresholds_and_timing() -> None:
    t = ProbeTracker(
        {
            "initialDelaySeconds": 5,
            "periodSeconds": 2,
            "failureThreshold": 2,
            "successThreshold": 1,
        },
        started=100.0,
    )
    assert not t.due(104.0) and t.due(105.0)
    t.record(True, 105.0)
    assert t.healthy is True and not t.due(106.0) and t.due(107.0)
    t.record(False, 107.0)
    assert t.healthy is True  # one failure is below the threshold
    t.record(False, 109.0)
    assert t.healthy is False
