"""What a campaign run leaves for explaining a violation: the job's last status, every pod
event with the wall time the monitor saw it, and the namespace's Events, in one JSON file
beside the operators' logs and fault logs (kept with FAULTRUN_KEEP=1). The operators' logs
carry no times; these and the fault logs' do."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from kubernetes import client


def pod_line(type_: str, pod: dict[str, Any]) -> dict[str, Any]:
    """One pod event, compact: when it was seen, the pod's phase, readiness, whether it is
    being deleted, and its containers' terminations."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready = next(
        (c.get("status") for c in status.get("conditions") or [] if c.get("type") == "Ready"),
        None,
    )
    ended = [
        {k: term.get(k) for k in ("exitCode", "reason", "finishedAt")}
        for cs in status.get("containerStatuses") or []
        if (term := (cs.get("state") or {}).get("terminated"))
    ]
    line = {
        "t": round(time.time(), 2),
        "type": type_,
        "pod": meta.get("name"),
        "uid": meta.get("uid"),
        "phase": status.get("phase"),
        "ready": ready,
        "deleting": meta.get("deletionTimestamp") is not None,
    }
    if ended:
        line["ended"] = ended
    return line


def write(
    path: Path,
    api: client.ApiClient,
    ns: str,
    job: dict[str, Any],
    pods: list[dict[str, Any]],
    violations: list[str],
) -> None:
    """Writes the evidence file; the Events are read now (best effort: the apiserver may be
    what failed)."""
    try:
        listed: Any = client.CoreV1Api(api).list_namespaced_event(ns, _request_timeout=10)
        events = [
            {
                "last": str(e.last_timestamp or e.event_time or ""),
                "object": f"{e.involved_object.kind}/{e.involved_object.name}",
                "reason": e.reason,
                "message": (e.message or "")[:500],
                "count": e.count,
            }
            for e in listed.items
        ]
    except Exception as e:  # noqa: BLE001 - evidence only; the run is judged already
        events = [{"error": repr(e)[:300]}]
    body = {
        "written": round(time.time(), 2),
        "violations_in_run": violations,  # the outcome is compared with the reference later
        "status": job.get("status") or {},
        "pods": pods,
        "events": events,
    }
    path.write_text(json.dumps(body, indent=1, default=str))
