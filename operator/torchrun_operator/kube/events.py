"""Events on the job, for the moments a person cares about."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from torchrun_operator.api.timefmt import fmt
from torchrun_operator.kube.client import Writes

log = logging.getLogger(__name__)

Obj = dict[str, Any]

COMPONENT = "torchrun-operator"


def event(job: dict[str, Any], type_: str, reason: str, msg: str, now: dt.datetime) -> Obj:
    """A core/v1 Event on the job, as a dict (the request body as it goes out)."""
    meta = job["metadata"]
    stamp = fmt(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
        "involvedObject": {
            "apiVersion": job["apiVersion"],
            "kind": job["kind"],
            "name": meta["name"],
            "namespace": meta["namespace"],
            "uid": meta["uid"],
        },
        "type": type_,
        "reason": reason,
        "message": msg[:1024],
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
    }


def post(writes: Writes, job: dict[str, Any], type_: str, reason: str, msg: str) -> None:
    body = event(job, type_, reason, msg, dt.datetime.now(dt.UTC))
    try:
        writes.create(job["metadata"]["namespace"], body)
    except Exception as e:  # noqa: BLE001 - an event lost is not worth a failed reconcile
        log.warning("could not post event %s on %s: %s", reason, job["metadata"]["name"], e)
