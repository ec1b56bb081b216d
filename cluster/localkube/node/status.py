"""Pure pod-status computation: observed container states -> the `status` a kubelet reports.

`pod_status(previous, observation)` is the only entry point the sync loop needs; everything
is data in, data out, so the table tests in tests/unit/localkube/test_node_status.py cover it.
Restart decisions (`should_restart`, `backoff_seconds`) live here too.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

State = Literal["waiting", "running", "terminated"]

# Signals a kubelet maps to 128+N exit codes; SIGKILL with a memory limit may be OOM.
SIGKILL = 9


@dataclass(frozen=True)
class Observed:
    """One container as the runtime sees it right now."""

    name: str
    image: str = ""
    state: State = "waiting"
    reason: str | None = None  # waiting: ContainerCreating/CrashLoopBackOff/...; terminated
    message: str | None = None
    exit_code: int | None = None
    signal: int | None = None
    started_at: str | None = None
    finished_at: str | None = None
    restart_count: int = 0
    ready: bool = False
    container_id: str | None = None
    last_terminated: Mapping[str, Any] | None = None  # lastState.terminated


@dataclass(frozen=True)
class PodObservation:
    init: Sequence[Observed]
    containers: Sequence[Observed]
    now: str
    restart_policy: str = "Always"
    pod_ip: str | None = None
    host_ip: str | None = None
    start_time: str | None = None
    sandbox_ready: bool = False
    # No more restarts will happen (pod deleted, node shutting down): decide a final phase.
    final: bool = False
    extra: Mapping[str, Any] = field(default_factory=dict)


def exit_code_for(returncode: int | None, signal: int | None) -> int:
    """A process killed by signal N exits 128+N, as a kubelet reports it."""
    if signal:
        return 128 + signal
    return returncode or 0


def terminated_reason(exit_code: int, oom: bool = False) -> str:
    if oom:
        return "OOMKilled"
    return "Completed" if exit_code == 0 else "Error"


def should_restart(policy: str, exit_code: int) -> bool:
    return policy == "Always" or (policy == "OnFailure" and exit_code != 0)


def backoff_seconds(restarts: int, base: float = 10.0, cap: float = 300.0) -> float:
    """Delay before restart number `restarts` (1-based): base, 2*base, ... capped."""
    if restarts <= 0:
        return 0.0
    return float(min(cap, base * (2 ** (restarts - 1))))


def state_dict(o: Observed) -> dict[str, Any]:
    if o.state == "running":
        return {"running": {"startedAt": o.started_at}}
    if o.state == "terminated":
        t: dict[str, Any] = {
            "exitCode": o.exit_code if o.exit_code is not None else 0,
            "reason": o.reason or terminated_reason(o.exit_code or 0),
            "startedAt": o.started_at,
            "finishedAt": o.finished_at,
            "containerID": o.container_id,
        }
        if o.signal:
            t["signal"] = o.signal
        if o.message:
            t["message"] = o.message
        return {"terminated": t}
    w: dict[str, Any] = {"reason": o.reason or "ContainerCreating"}
    if o.message:
        w["message"] = o.message
    return {"waiting": w}


def container_status(o: Observed) -> dict[str, Any]:
    status: dict[str, Any] = {
        "name": o.name,
        "image": o.image,
        "imageID": f"localkube://{o.image}" if o.image else "",
        "ready": o.ready and o.state == "running",
        "started": o.state == "running",
        "restartCount": o.restart_count,
        "state": state_dict(o),
        "lastState": {"terminated": dict(o.last_terminated)} if o.last_terminated else {},
    }
    if o.container_id:
        status["containerID"] = o.container_id
    return status


def _failed(o: Observed) -> bool:
    return o.state == "terminated" and (o.exit_code or 0) != 0


def _succeeded(o: Observed) -> bool:
    return o.state == "terminated" and (o.exit_code or 0) == 0


def initialized(obs: PodObservation) -> bool:
    return all(_succeeded(o) for o in obs.init)


def phase(obs: PodObservation) -> str:
    policy = "Never" if obs.final else obs.restart_policy
    if not initialized(obs):
        if policy == "Never" and any(_failed(o) for o in obs.init):
            return "Failed"
        return "Pending"
    cs = obs.containers
    if not cs:
        return "Succeeded"
    if any(o.state == "running" for o in cs):
        return "Running"
    # A waiting container that ran before is restarting (CrashLoopBackOff): the pod runs.
    waiting = [o for o in cs if o.state == "waiting"]
    if waiting:
        if obs.final:
            return "Failed"
        return "Running" if any(o.restart_count > 0 for o in waiting) else "Pending"
    # All terminated.
    if policy == "Always":
        return "Running"
    if policy == "OnFailure":
        return "Running" if any(_failed(o) for o in cs) else "Succeeded"
    return "Failed" if any(_failed(o) for o in cs) else "Succeeded"


def _condition(
    previous: Mapping[str, Mapping[str, Any]],
    ctype: str,
    ok: bool,
    now: str,
    reason: str | None = None,
    message: str | None = None,
) -> dict[str, Any]:
    status = "True" if ok else "False"
    prev = previous.get(ctype)
    since = prev.get("lastTransitionTime") if prev and prev.get("status") == status else None
    cond: dict[str, Any] = {
        "type": ctype,
        "status": status,
        "lastProbeTime": None,
        "lastTransitionTime": since or now,
    }
    if not ok and reason:
        cond["reason"] = reason
    if not ok and message:
        cond["message"] = message
    return cond


OWN_CONDITIONS = ("PodReadyToStartContainers", "Initialized", "ContainersReady", "Ready")


def conditions(previous: Sequence[Mapping[str, Any]], obs: PodObservation) -> list[dict[str, Any]]:
    prev = {c.get("type", ""): c for c in previous}
    p = phase(obs)
    terminal = p in ("Succeeded", "Failed")
    init_ok = initialized(obs) or (terminal and not obs.init)
    unready = [o.name for o in obs.containers if not (o.ready and o.state == "running")]
    uninit = [o.name for o in obs.init if not _succeeded(o)]
    ready_reason = "PodCompleted" if terminal else "ContainersNotReady"
    ready_msg = None if terminal else f"containers with unready status: [{' '.join(unready)}]"
    init_reason = "PodCompleted" if terminal and init_ok else "ContainersNotInitialized"
    own = [
        _condition(prev, "PodReadyToStartContainers", obs.sandbox_ready and not terminal, obs.now),
        _condition(
            prev,
            "Initialized",
            initialized(obs),
            obs.now,
            init_reason,
            None if terminal else f"containers with incomplete status: [{' '.join(uninit)}]",
        ),
        _condition(
            prev, "ContainersReady", not unready and not terminal, obs.now, ready_reason, ready_msg
        ),
        _condition(prev, "Ready", not unready and not terminal, obs.now, ready_reason, ready_msg),
    ]
    # Keep conditions others own (PodScheduled from the scheduler, DisruptionTarget...).
    kept = [dict(c) for c in previous if c.get("type") not in OWN_CONDITIONS]
    return kept + own


def pod_status(previous: Mapping[str, Any], obs: PodObservation) -> dict[str, Any]:
    """The full new `status` given the previous one (kept: qosClass, foreign conditions)."""
    status: dict[str, Any] = {
        k: v for k, v in previous.items() if k in ("qosClass", "nominatedNodeName", "resize")
    }
    status["phase"] = phase(obs)
    status["conditions"] = conditions(previous.get("conditions") or [], obs)
    if obs.host_ip:
        status["hostIP"] = obs.host_ip
        status["hostIPs"] = [{"ip": obs.host_ip}]
    if obs.pod_ip:
        status["podIP"] = obs.pod_ip
        status["podIPs"] = [{"ip": obs.pod_ip}]
    if obs.start_time:
        status["startTime"] = obs.start_time
    if obs.init:
        status["initContainerStatuses"] = [container_status(o) for o in obs.init]
    status["containerStatuses"] = [container_status(o) for o in obs.containers]
    status.update(obs.extra)
    return status


def without_times(status: Mapping[str, Any]) -> dict[str, Any]:
    """Status minus fields that change on every computation, for change detection."""
    out = dict(status)
    out["conditions"] = [
        {k: v for k, v in c.items() if k not in ("lastProbeTime",)}
        for c in status.get("conditions") or []
    ]
    return out
