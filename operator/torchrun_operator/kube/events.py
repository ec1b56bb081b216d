"""Events on the job, for the moments a person cares about."""

from __future__ import annotations

import datetime as dt
import logging
from typing import Any

from kubernetes import client

log = logging.getLogger(__name__)

COMPONENT = "torchrun-operator"


def post(core: client.CoreV1Api, job: dict[str, Any], type_: str, reason: str, msg: str) -> None:
    meta = job["metadata"]
    now = dt.datetime.now(dt.UTC)
    body = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta["namespace"]),
        involved_object=client.V1ObjectReference(
            api_version=job["apiVersion"],
            kind=job["kind"],
            name=meta["name"],
            namespace=meta["namespace"],
            uid=meta["uid"],
        ),
        type=type_,
        reason=reason,
        message=msg[:1024],
        first_timestamp=now,
        last_timestamp=now,
        count=1,
        source=client.V1EventSource(component=COMPONENT),
        reporting_component=COMPONENT,
    )
    try:
        core.create_namespaced_event(meta["namespace"], body)
    except Exception as e:  # noqa: BLE001 - an event lost is not worth a failed reconcile
        log.warning("could not post event %s on %s: %s", reason, meta["name"], e)
