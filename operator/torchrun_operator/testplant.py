"""Planted bugs, for the fault campaign's own tests only (TEST-ONLY: never set this in a
deployment).

The campaign (tests/integration/faultrun.py) says a run kept its invariants; its tests
(tests/integration/test_campaign_plants.py) prove each invariant can fail by running an
operator with one known bug planted and finding the matching violation. Off unless the
environment variable TORCHRUN_OPERATOR_TEST_PLANT names a plant; read here, once, and
nowhere else. Unset, every hook below is one comparison that changes nothing.

Plants (each breaks one invariant of docs/reliability.md):

- keep-stale: the reconciler never sees pods of earlier attempts, and the controller never
  deletes them, so a new attempt is created beside the old one's pods. (Hiding them alone
  was not enough: the restart's own reconcile still deleted them, and when the deletes
  finished before the new creates, as finished pods' often do, nothing was caught.)
- double-create: each attempt's first pod create also creates a twin of that pod under
  another name (a retry that did not see its first create).
- recount: the first reconcile of a finished job in each operator process counts one more
  restart (a counter a restarted operator changes).
- traceback: the first reconcile in each operator process logs an unhandled-looking error.
- exit: the operator exits by itself (status 3) right after it created pods.
- early-ttl: a job with a TTL (runPolicy.ttlSecondsAfterFinished) is deleted while it runs,
  not once it has finished.
"""

from __future__ import annotations

import copy
import logging
import os
from typing import Any

from torchrun_operator.api.names import LABEL_ATTEMPT
from torchrun_operator.api.status_names import FINISHED

ENV = "TORCHRUN_OPERATOR_TEST_PLANT"
PLANTS = frozenset({"keep-stale", "double-create", "recount", "traceback", "exit", "early-ttl"})

log = logging.getLogger(__name__)

PLANTED = os.environ.get(ENV, "")
if PLANTED and PLANTED not in PLANTS:
    # A typo must not turn a test of the campaign into one that plants nothing.
    raise ValueError(f"{ENV} must be one of {sorted(PLANTS)}: {PLANTED!r}")
_done: set[str] = set()  # what a once-per-process plant already did


def _once(what: str) -> bool:
    if what in _done:
        return False
    _done.add(what)
    return True


def _of_attempt(status: dict[str, Any], pod: dict[str, Any]) -> bool:
    """Whether `pod` belongs to the attempt `status` is at."""
    attempt = str(status.get("attempt", 0))
    return (pod["metadata"].get("labels") or {}).get(LABEL_ATTEMPT) == attempt


def visible_pods(job: dict[str, Any], pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """keep-stale: only the pods of the job's current attempt."""
    if PLANTED != "keep-stale":
        return pods
    status = job.get("status") or {}
    return [p for p in pods if _of_attempt(status, p)]


def deletions(status: dict[str, Any], names: list[str], pods: list[dict[str, Any]]) -> list[str]:
    """keep-stale: the plan's deletes, less the pods of attempts before `status`'s."""
    if PLANTED != "keep-stale":
        return names
    stale = {p["metadata"]["name"] for p in pods if not _of_attempt(status, p)}
    return [n for n in names if n not in stale]


def reconciled_from(job: dict[str, Any]) -> dict[str, Any]:
    """recount: a finished job with one restart more, once per job and process."""
    status = job.get("status") or {}
    if PLANTED != "recount" or status.get("phase") not in FINISHED:
        return job
    if not _once(f"recount {job['metadata'].get('uid')}"):
        return job
    job = copy.deepcopy(job)
    counters = job["status"].setdefault("counters", {})
    counters["restarts"] = counters.get("restarts", 0) + 1
    return job


def twin(pod: dict[str, Any]) -> dict[str, Any] | None:
    """double-create: a second pod for the slot of `pod`, once per attempt and process."""
    if PLANTED != "double-create":
        return None
    labels = pod["metadata"].get("labels") or {}
    if not _once(f"twin {pod['metadata'].get('ownerReferences')} {labels.get(LABEL_ATTEMPT)}"):
        return None
    got = copy.deepcopy(pod)
    got["metadata"]["name"] = f"{pod['metadata']['name']}-twin"
    for c in got["spec"]["containers"]:
        c["command"] = ["python", "-c", "pass"]
        c.pop("args", None)
    return got


def after_reconcile() -> None:
    """traceback: one logged exception per process."""
    if PLANTED == "traceback" and _once("traceback"):
        try:
            raise RuntimeError("planted bug (TORCHRUN_OPERATOR_TEST_PLANT=traceback)")
        except RuntimeError:
            log.exception("planted bug")


def after_creates(created: int) -> None:
    """exit: the process ends once it created pods."""
    if PLANTED == "exit" and created:
        log.error("planted bug: exiting (TORCHRUN_OPERATOR_TEST_PLANT=exit)")
        logging.shutdown()
        os._exit(3)


def deleted_early(job: dict[str, Any], status: dict[str, Any]) -> bool:
    """early-ttl: whether to delete `job`, which has a TTL, now that `status` says it runs."""
    if PLANTED != "early-ttl" or status.get("phase") != "Running":
        return False
    policy = (job.get("spec") or {}).get("runPolicy") or {}
    return policy.get("ttlSecondsAfterFinished") is not None
