"""PyTorchJob policies as the job's: elasticPolicy, restartPolicy, runPolicy and its
schedulingPolicy (docs/migrating.md's mapping)."""

from __future__ import annotations

from typing import Any

from torchrun_operator.api import models, scheduling

from .result import Conversion, bounded

_JOIN_TIMEOUT_KEYS = {"join_timeout", "join-timeout"}


def elastic(
    elastic: dict[str, Any], nodes: int, workers: int, job: dict[str, Any], out: Conversion
) -> int:
    """Fills spec.elastic, torchrun.maxRestarts and rendezvous from elasticPolicy; returns
    nodes (clamped into the elastic bounds)."""
    where = "spec.elasticPolicy"
    spec = job["spec"]
    lo, hi = elastic.get("minReplicas"), elastic.get("maxReplicas")
    lo, hi = (lo if lo is not None else hi), (hi if hi is not None else lo)
    if lo is None or hi is None:
        lo = hi = workers
    lo = bounded(lo, 1, models.MAX_NODES, f"{where}.minReplicas", out)
    hi = bounded(hi, lo, models.MAX_NODES, f"{where}.maxReplicas", out)
    if not lo <= nodes <= hi:
        clamped = min(max(nodes, lo), hi)
        out.warn(
            f"{where}",
            f"the job's {nodes} replicas lie outside minReplicas..maxReplicas ({lo}..{hi}): "
            f"nodes is {clamped}",
        )
        nodes = clamped
    if lo < hi:
        spec["elastic"] = {"minNodes": lo, "maxNodes": hi}
    for key, value in elastic.items():
        if key in ("minReplicas", "maxReplicas", "nProcPerNode"):
            continue
        at = f"{where}.{key}"
        if key == "maxRestarts":
            spec.setdefault("torchrun", {})["maxRestarts"] = bounded(
                value, 0, models.MAX_RESTARTS, at, out
            )
        elif key == "rdzvBackend":
            if value != "c10d":
                out.warn(at, f"{value!r} not carried over: the operator runs c10d on pod 0")
        elif key == "rdzvPort":
            spec.setdefault("rendezvous", {})["port"] = bounded(value, 1, 65535, at, out)
        elif key == "rdzvConf":
            for item in value or []:
                k, v = str(item.get("key")), item.get("value")
                if k in _JOIN_TIMEOUT_KEYS and str(v).isdigit():
                    spec.setdefault("rendezvous", {})["joinTimeoutSeconds"] = bounded(
                        v, 1, models.MAX_TIMEOUT_SECONDS, at, out
                    )
                else:
                    out.warn(at, f"{k}={v} not carried over: the operator owns the rendezvous")
        elif key == "metrics":
            out.warn(
                at,
                "not carried over: the operator creates no HorizontalPodAutoscaler; an elastic "
                "job may change spec.nodes within elastic.minNodes..maxNodes",
            )
        elif key in ("rdzvHost", "rdzvId", "standalone"):
            out.warn(at, "not carried over: the operator's c10d rendezvous is hosted by pod 0")
        else:
            out.warn(at, "not carried over")
    return nodes


def restart_policy(
    master: dict[str, Any] | None, worker: dict[str, Any] | None, kind: str, out: Conversion
) -> str:
    policies = {
        k: (r.get("restartPolicy") or "OnFailure")
        for k, r in (("Master", master), ("Worker", worker))
        if r is not None
    }
    policy = policies[kind]
    if len(set(policies.values())) > 1:
        out.warn(
            "spec.pytorchReplicaSpecs.Worker.restartPolicy",
            f"{policies['Worker']} differs from the Master's {policies['Master']}: the "
            "job follows the Master's",
        )
    return policy


def run_policy(
    run: dict[str, Any], restart_policy: str, kind: str, job: dict[str, Any], out: Conversion
) -> None:
    spec = job["spec"]
    run_policy: dict[str, Any] = {}
    failure: dict[str, Any] = {}
    clean = run.get("cleanPodPolicy") or "None"
    run_policy["cleanPodPolicy"] = {"None": "KeepAll", "All": "Delete"}.get(clean, "KeepFailed")
    if clean == "Running":
        out.warn(
            "spec.runPolicy.cleanPodPolicy",
            "Running -> KeepFailed: the pods still running at the end are deleted, as before, "
            "and so are the succeeded ones; the failed ones are kept",
        )
    elif clean not in ("None", "All"):
        out.warn("spec.runPolicy.cleanPodPolicy", f"{clean!r} is unknown: KeepFailed")
    for key, value in run.items():
        at = f"spec.runPolicy.{key}"
        if key == "cleanPodPolicy" or value is None:
            continue
        if key == "ttlSecondsAfterFinished":
            run_policy[key] = bounded(value, 0, models.MAX_DURATION_SECONDS, at, out)
        elif key == "activeDeadlineSeconds":
            run_policy[key] = bounded(value, 1, models.MAX_DURATION_SECONDS, at, out)
        elif key == "suspend":
            run_policy["suspend"] = bool(value)
        elif key == "backoffLimit":
            if restart_policy == "Never":
                out.warn(at, "not carried over: restartPolicy Never restarts nothing")
            else:
                failure["maxRestarts"] = bounded(value, 0, models.MAX_RESTARTS, at, out)
        elif key == "schedulingPolicy":
            continue  # scheduling_policy maps it, once nodes and the template are known
        else:
            out.warn(at, "not carried over")
    where = f"spec.pytorchReplicaSpecs.{kind}.restartPolicy"
    if restart_policy == "Never":
        failure["maxRestarts"] = 0
    elif restart_policy in ("OnFailure", "Always"):
        budget = failure.get("maxRestarts", models.FailurePolicy().max_restarts)
        unset = "backoffLimit" not in run or run["backoffLimit"] is None
        out.warn(
            where,
            f"{restart_policy} restarted a pod after any failure"
            + (" (no backoffLimit: without limit)" if unset else "")
            + ". Here a failure of the training program (an exception, an exit code of 1 to "
            "127) fails the job; lost pods and nodes, signals and exit codes of 128 to 255 "
            f"restart the whole gang, at most {budget} times (failurePolicy.maxRestarts). List "
            "exit codes under failurePolicy.retryableExitCodes to restart on them too",
        )
    elif restart_policy != "ExitCode":
        out.warn(where, f"{restart_policy!r} is unknown: failurePolicy keeps its defaults")
    if failure:
        spec["failurePolicy"] = failure
    spec["runPolicy"] = run_policy


# What says which gang scheduler ran a PyTorchJob's PodGroup: the training operator's
# --gang-scheduler-name did, which the job does not carry; a field only one of them reads, or
# the template's schedulerName, does.
_GANG_OF_SCHEDULER = {name: gang for gang, name in scheduling.DEFAULT_SCHEDULER_NAMES.items()}


def scheduling_policy(policy: dict[str, Any], pod: dict[str, Any], out: Conversion) -> None:
    """runPolicy.schedulingPolicy as spec.scheduling (docs/scheduling.md), and the template's
    priorityClassName (which the operator's PodGroup takes)."""
    where = "spec.runPolicy.schedulingPolicy"
    spec = out.job["spec"]
    hints: dict[str, str] = {}
    if policy.get("queue") is not None:
        hints["Volcano"] = "queue is Volcano's"
    if policy.get("scheduleTimeoutSeconds") is not None:
        hints["Coscheduling"] = "scheduleTimeoutSeconds is coscheduling's"
    named = pod.get("schedulerName")
    if named in _GANG_OF_SCHEDULER:
        hints.setdefault(_GANG_OF_SCHEDULER[named], f"the template's schedulerName {named}")
    if len(hints) == 1:
        ((gang, why),) = hints.items()
        result: dict[str, Any] = {"gang": gang}
        if gang == "Volcano" and policy.get("queue") is not None:
            result["queue"] = policy["queue"]
        if gang == "Coscheduling" and policy.get("scheduleTimeoutSeconds") is not None:
            result["scheduleTimeoutSeconds"] = bounded(
                policy["scheduleTimeoutSeconds"],
                1,
                models.MAX_TIMEOUT_SECONDS,
                f"{where}.scheduleTimeoutSeconds",
                out,
            )
        spec["scheduling"] = result
        out.warn(
            where,
            f"spec.scheduling.gang {gang} ({why}): the PyTorchJob's gang scheduler was the "
            "training operator's --gang-scheduler-name, which the job does not say; check it "
            "is the one your cluster runs (docs/scheduling.md)",
        )
        gang_size, counted = (
            (spec["elastic"]["minNodes"], "elastic.minNodes")
            if "elastic" in spec
            else (spec["nodes"], "nodes")
        )
        wanted = policy.get("minAvailable")
        if wanted is not None and wanted != gang_size:
            out.warn(
                f"{where}.minAvailable",
                f"{wanted} not carried over: the gang is every pod of an attempt, {gang_size} "
                f"({counted})",
            )
    else:
        both = " (queue is Volcano's, scheduleTimeoutSeconds coscheduling's)" if hints else ""
        out.warn(
            where,
            f"not carried over{both}: the PyTorchJob's gang scheduler was the training "
            "operator's --gang-scheduler-name, which the job does not say; set "
            "spec.scheduling.gang (Volcano, Coscheduling or Native) and its fields yourself "
            "(docs/scheduling.md)",
        )
    priority = policy.get("priorityClass")
    if priority is not None:
        own = pod.get("priorityClassName")
        if own is None:
            pod["priorityClassName"] = priority
            out.warn(
                f"{where}.priorityClass",
                "moved to template.spec.priorityClassName: the pods' priority, and the "
                "PodGroup's where the operator makes one",
            )
        elif own != priority:
            out.warn(
                f"{where}.priorityClass",
                f"{priority} not carried over: the template's priorityClassName {own} is kept",
            )
    if policy.get("minResources") is not None:
        out.warn(
            f"{where}.minResources",
            "not carried over: the operator's PodGroup sets no minResources",
        )
    known = {"queue", "scheduleTimeoutSeconds", "minAvailable", "priorityClass", "minResources"}
    for key in policy:
        if key not in known:
            out.warn(f"{where}.{key}", "not carried over")
