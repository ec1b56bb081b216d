"""kubectl dtj convert: a Kubeflow PyTorchJob (kubeflow.org/v1) as a DistributedTrainingJob.

    kubectl dtj convert -f pytorchjob.yaml > job.yaml     (or from stdin: -f - or no -f)

Prints the equivalent DistributedTrainingJob YAML on stdout and, on stderr, a warning for
every field it cannot carry over or whose meaning changes: nothing is dropped silently. The
mapping and its reasons are in docs/migrating.md; in short:

- Master + Worker replicas -> nodes; the Master's pod template (the Worker's without a
  Master) -> template, warning where the Worker's differs;
- nprocPerNode (or elasticPolicy.nProcPerNode, or the command's --nproc-per-node) ->
  nprocPerNode, "auto" -> "gpu" with a GPU limit; a command without torchrun ran one process
  per pod, and still does (nprocPerNode: 1);
- elasticPolicy: minReplicas/maxReplicas -> elastic.minNodes/maxNodes, maxRestarts ->
  torchrun.maxRestarts, rdzvPort -> rendezvous.port, rdzvConf join_timeout ->
  rendezvous.joinTimeoutSeconds;
- runPolicy: cleanPodPolicy None -> KeepAll, All -> Delete, Running -> KeepFailed;
  ttlSecondsAfterFinished, activeDeadlineSeconds and suspend as they are; backoffLimit ->
  failurePolicy.maxRestarts;
- restartPolicy: ExitCode is this operator's own rule (exit 1-127 fails the job, 128-255 and
  signals restart it); OnFailure and Always restarted on any failure, which here only
  infrastructure failures do (a warning says so); Never -> failurePolicy.maxRestarts: 0;
- runPolicy.schedulingPolicy -> spec.scheduling where a field only one gang scheduler reads
  says which (queue: Volcano; scheduleTimeoutSeconds: Coscheduling), priorityClass -> the
  template's priorityClassName;
- a launcher in the command stays (the operator unwraps it), less the flags the spec now says.

The input is untrusted: convert_input.py loads it within bounds, convert_parse.py checks the
type of every field read here. The conversion is pure (`convert`); `run` reads and prints.
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml
from pydantic import ValidationError

from torchrun_operator.api import launchcmd, models, names, scheduling

from . import convert_parse
from .convert_input import MAX_DEPTH, MAX_INPUT_BYTES, MAX_VALUES, ConvertError, load

__all__ = [
    "MAX_DEPTH",
    "MAX_INPUT_BYTES",
    "MAX_VALUES",
    "TODO_COMMAND",
    "Conversion",
    "ConvertError",
    "add_parser",
    "convert",
    "documents",
    "run",
    "validate",
]

KUBEFLOW_API_VERSION = "kubeflow.org/v1"
PYTORCHJOB = "PyTorchJob"
TODO_COMMAND = "TODO-set-the-command-the-image-entrypoint-runs"

# Set on every worker by torchrun under the operator (or read by the operator's torchrun, for
# PET_*): a template's own value would be overridden, or would change torchrun's flags.
_LAUNCHER_ENV = re.compile(
    r"^(PET_.*|MASTER_ADDR|MASTER_PORT|WORLD_SIZE|RANK|LOCAL_RANK|LOCAL_WORLD_SIZE|GROUP_RANK)$"
)
# Written by the apiserver or kubectl, not by the job's author.
_SERVER_METADATA = {
    "uid",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "managedFields",
    "selfLink",
}
_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_JOIN_TIMEOUT_KEYS = {"join_timeout", "join-timeout"}


@dataclass
class Conversion:
    job: dict[str, Any]
    warnings: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    """What the job printed lacks: it needs editing before it can run (exit status 1)."""

    def warn(self, where: str, text: str) -> None:
        self.warnings.append(f"{where}: {text}")

    def error(self, where: str, text: str) -> None:
        self.errors.append(f"{where}: {text}")


def _replicas(spec: dict[str, Any], out: Conversion) -> tuple[dict[str, Any] | None, ...]:
    """(Master, Worker) replica specs; other replica types are warned about."""
    found: dict[str, dict[str, Any]] = {}
    for key, value in (spec.get("pytorchReplicaSpecs") or {}).items():
        kind = str(key).capitalize()  # as the training operator's defaulting does
        if kind in ("Master", "Worker") and isinstance(value, dict):
            found[kind] = value
        else:
            out.warn(
                f"spec.pytorchReplicaSpecs.{key}",
                "not carried over: a PyTorchJob has Master and Worker replicas only",
            )
    if not found:
        raise ConvertError("spec.pytorchReplicaSpecs has neither a Master nor a Worker")
    return found.get("Master"), found.get("Worker")


def _count(replica: dict[str, Any] | None) -> int:
    if replica is None:
        return 0
    n = replica.get("replicas", 1)
    return int(n) if n is not None else 1


def _differences(a: Any, b: Any, path: str) -> list[str]:
    """Paths (as a.b[0].c) where two JSON values differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[str] = []
        for k in sorted(set(a) | set(b), key=str):
            out += _differences(a.get(k), b.get(k), f"{path}.{k}" if path else str(k))
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            out += _differences(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [path or "(the whole template)"]


def _bounded(value: Any, low: int, high: int, where: str, out: Conversion) -> int:
    n = int(value)
    if n < low or n > high:
        clamped = min(max(n, low), high)
        out.warn(
            where, f"{n} is outside {low}..{high}, the bounds of the operator's API: {clamped}"
        )
        return clamped
    return n


def _metadata(meta: dict[str, Any], out: Conversion) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in meta.items():
        if key in ("name", "namespace", "labels"):
            result[key] = copy.deepcopy(value)
        elif key == "annotations":
            kept = {k: v for k, v in (value or {}).items() if k != _LAST_APPLIED}
            if kept:
                result["annotations"] = kept
        elif key not in _SERVER_METADATA:
            out.warn(f"metadata.{key}", "not carried over")
    name = str(result.get("name") or "")
    if not _DNS_1035.match(name):
        out.warn(
            "metadata.name",
            f"{name!r} is not a DNS-1035 label (lowercase letters, digits and '-', starting "
            "with a letter), which a DistributedTrainingJob's name must be: rename it",
        )
    for label in result.get("labels") or {}:
        if label.startswith("kueue.x-k8s.io/"):
            out.warn(
                f"metadata.labels.{label}",
                "kept, but Kueue does not manage DistributedTrainingJobs unless it is set up "
                "for them",
            )
    return result


def _template(
    master: dict[str, Any] | None, worker: dict[str, Any] | None, out: Conversion
) -> tuple[dict[str, Any], str]:
    """The pod template every node runs, and the replica type it came from."""
    source, kind = (master, "Master") if master is not None else (worker, "Worker")
    assert source is not None
    template = copy.deepcopy(source.get("template") or {})
    if master is not None and worker is not None:
        diff = _differences(master.get("template") or {}, worker.get("template") or {}, "")
        if diff:
            shown = ", ".join(diff[:8]) + (f" and {len(diff) - 8} more" if len(diff) > 8 else "")
            out.warn(
                "spec.pytorchReplicaSpecs.Worker.template",
                f"differs from the Master's at {shown}: every pod runs the Master's template "
                "(a DistributedTrainingJob has one)",
            )
    return template, kind


def _trainer_first(pod: dict[str, Any], where: str, out: Conversion) -> None:
    containers = pod.get("containers") or []
    names_ = [c.get("name") for c in containers]
    if "pytorch" in names_ and names_[0] != "pytorch":
        i = names_.index("pytorch")
        containers.insert(0, containers.pop(i))
        out.warn(
            f"{where}.containers",
            "the pytorch container moved first: the first container is the trainer here",
        )


def _nproc_source(spec: dict[str, Any], elastic: dict[str, Any]) -> tuple[str | None, str]:
    if spec.get("nprocPerNode") is not None:
        return str(spec["nprocPerNode"]), "spec.nprocPerNode"
    if elastic.get("nProcPerNode") is not None:
        return str(elastic["nProcPerNode"]), "spec.elasticPolicy.nProcPerNode"
    return None, ""


def _gpu_limit(container: dict[str, Any]) -> int | None:
    limits = (container.get("resources") or {}).get("limits") or {}
    if models.GPU_RESOURCE not in limits:
        return None
    return models.gpu_count(limits[models.GPU_RESOURCE])


def _launcher_flags(
    container: dict[str, Any], where: str, out: Conversion
) -> dict[str, str | None]:
    """Takes out of a launcher command the flags the spec now says or the operator owns;
    returns those the spec takes over (by option canonical name)."""
    command = list(container.get("command") or [])
    args = list(container.get("args") or [])
    try:
        launch = launchcmd.parse(command + args)
    except launchcmd.LaunchCommandError as e:
        out.warn(f"{where}.command", f"left as it is, the operator cannot take it apart: {e}")
        return {}
    nested = launchcmd.nested_launcher(command + args)
    if nested is not None:
        out.warn(
            f"{where}.command",
            f"runs a launcher inside a shell command ({nested}), which the operator refuses: "
            "make the launcher (or the script) the command itself",
        )
    if launch is None:
        return {}
    taken: dict[str, str | None] = {}
    remove: set[int] = set()
    for g in launch.given:
        handling, name = g.option.handling, g.option.canonical
        if handling not in ("owned", "nproc"):
            continue
        remove.update(range(*g.tokens))
        if name in ("--nproc-per-node", "--max-restarts"):
            taken[name] = g.value
            spec_field = "nprocPerNode" if name == "--nproc-per-node" else "torchrun.maxRestarts"
            out.warn(f"{where}.command", f"{g.text} moved to spec.{spec_field}")
        elif name == "--nnodes":
            out.warn(f"{where}.command", f"{g.text} removed: spec.nodes (and spec.elastic) say it")
        else:
            out.warn(f"{where}.command", f"{g.text} removed: {g.option.why}")
    if remove:
        container["command"] = [t for i, t in enumerate(command) if i not in remove]
        new_args = [t for j, t in enumerate(args) if len(command) + j not in remove]
        if "args" in container or new_args:
            container["args"] = new_args
    return taken


def _nproc(
    spec: dict[str, Any],
    elastic: dict[str, Any],
    from_command: str | None,
    is_launcher: bool,
    gpus: int | None,
    out: Conversion,
) -> int | str:
    given, where = _nproc_source(spec, elastic)
    if from_command is not None and given is not None and from_command != given:
        out.warn(
            where,
            f"{given!r} differs from the command's --nproc-per-node {from_command!r}: the "
            "command's is kept, as torchrun's flag won over PET_NPROC_PER_NODE",
        )
    value = from_command if from_command is not None else given
    if not is_launcher:
        if value not in (None, "1", "auto"):
            out.warn(
                where,
                f"{value!r} not carried over: the command does not start with torchrun, so the "
                "PyTorchJob ran one process per pod, and this job does too (nprocPerNode: 1); "
                "to run more, set nprocPerNode (torchrun runs the command in each process)",
            )
        return 1
    if value is None or value in ("auto", "gpu"):
        if gpus:
            return "gpu"
        what = "the node's CPUs" if value in (None, "auto") else "GPUs, and the trainer has none"
        out.warn(
            where or "spec.nprocPerNode",
            f"{value or 'auto'!r} counted {what}: nprocPerNode is 1 here, set it to the number "
            "of processes each pod should run",
        )
        return 1
    if value.isdigit() and int(value) >= 1:
        return _bounded(value, 1, models.MAX_PROCS_PER_NODE, where or "nprocPerNode", out)
    out.warn(where, f"{value!r} has no counterpart here: nprocPerNode is 1, set it yourself")
    return 1


def _elastic(
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
    lo = _bounded(lo, 1, models.MAX_NODES, f"{where}.minReplicas", out)
    hi = _bounded(hi, lo, models.MAX_NODES, f"{where}.maxReplicas", out)
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
            spec.setdefault("torchrun", {})["maxRestarts"] = _bounded(
                value, 0, models.MAX_RESTARTS, at, out
            )
        elif key == "rdzvBackend":
            if value != "c10d":
                out.warn(at, f"{value!r} not carried over: the operator runs c10d on pod 0")
        elif key == "rdzvPort":
            spec.setdefault("rendezvous", {})["port"] = _bounded(value, 1, 65535, at, out)
        elif key == "rdzvConf":
            for item in value or []:
                k, v = str(item.get("key")), item.get("value")
                if k in _JOIN_TIMEOUT_KEYS and str(v).isdigit():
                    spec.setdefault("rendezvous", {})["joinTimeoutSeconds"] = _bounded(
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


def _restart_policy(
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


def _run_policy(
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
            run_policy[key] = _bounded(value, 0, models.MAX_DURATION_SECONDS, at, out)
        elif key == "activeDeadlineSeconds":
            run_policy[key] = _bounded(value, 1, models.MAX_DURATION_SECONDS, at, out)
        elif key == "suspend":
            run_policy["suspend"] = bool(value)
        elif key == "backoffLimit":
            if restart_policy == "Never":
                out.warn(at, "not carried over: restartPolicy Never restarts nothing")
            else:
                failure["maxRestarts"] = _bounded(value, 0, models.MAX_RESTARTS, at, out)
        elif key == "schedulingPolicy":
            continue  # _scheduling
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


def _scheduling(policy: dict[str, Any], pod: dict[str, Any], out: Conversion) -> None:
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
            result["scheduleTimeoutSeconds"] = _bounded(
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


def _env(container: dict[str, Any], where: str, out: Conversion) -> None:
    env = container.get("env")
    if not env:
        return
    kept = []
    for e in env:
        name = str(e.get("name", ""))
        if _LAUNCHER_ENV.match(name):
            out.warn(
                f"{where}.env.{name}",
                "removed: torchrun sets it in every worker (PET_*: the operator passes "
                "torchrun's flags itself)",
            )
        else:
            kept.append(e)
    if kept:
        container["env"] = kept
    else:
        del container["env"]


def convert(doc: dict[str, Any], entrypoint: list[str] | None = None) -> Conversion:
    """One PyTorchJob as a DistributedTrainingJob, with what did not carry over.
    `entrypoint` stands in for a container without a command (the image's ENTRYPOINT)."""
    if doc.get("kind") != PYTORCHJOB or doc.get("apiVersion") != KUBEFLOW_API_VERSION:
        raise ConvertError(
            f"not a {KUBEFLOW_API_VERSION} {PYTORCHJOB}: {doc.get('apiVersion')} {doc.get('kind')}"
        )
    convert_parse.check(doc)
    out = Conversion(job={})
    spec = doc.get("spec") or {}
    for key in spec:
        if key not in ("pytorchReplicaSpecs", "runPolicy", "elasticPolicy", "nprocPerNode"):
            out.warn(f"spec.{key}", "not carried over")
    for key in doc:
        if key not in ("apiVersion", "kind", "metadata", "spec", "status"):
            out.warn(key, "not carried over")
    master, worker = _replicas(spec, out)
    if master is not None and _count(master) != 1:
        out.warn("spec.pytorchReplicaSpecs.Master.replicas", "a PyTorchJob has one Master")
    job: dict[str, Any] = {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": _metadata(doc.get("metadata") or {}, out),
        "spec": {},
    }
    out.job = job
    nodes = _count(master) + _count(worker)
    template, kind = _template(master, worker, out)
    where = f"spec.pytorchReplicaSpecs.{kind}.template.spec"
    pod = template.setdefault("spec", {})
    _trainer_first(pod, where, out)
    containers = pod.get("containers") or []
    if not containers:
        raise ConvertError(f"{where}.containers is empty")
    trainer = containers[0]
    trainer_at = f"{where}.containers[0]"
    if not trainer.get("command"):
        if entrypoint:
            trainer["command"] = list(entrypoint)
        else:
            trainer["command"] = [TODO_COMMAND]
            out.error(
                f"{trainer_at}.command",
                "missing: the image's ENTRYPOINT ran (with args), but a DistributedTrainingJob "
                "names its command; pass --entrypoint 'python /path/train.py' (what the "
                f"ENTRYPOINT runs) or replace {TODO_COMMAND}",
            )
        # command before args, as people write them
        first = ["name", "image", "command"]
        reordered = {k: trainer[k] for k in first if k in trainer}
        reordered.update((k, v) for k, v in trainer.items() if k not in first)
        trainer.clear()
        trainer.update(reordered)
    if pod.pop("restartPolicy", None) is not None:
        out.warn(
            f"{where}.restartPolicy",
            "removed: the operator's pods never restart in place (failurePolicy restarts them)",
        )
    _env(trainer, trainer_at, out)
    taken = _launcher_flags(trainer, trainer_at, out)
    is_launcher = launchcmd.is_launcher(
        list(trainer.get("command") or []) + list(trainer.get("args") or [])
    )
    elastic = spec.get("elasticPolicy") or {}

    job_spec = job["spec"]
    job_spec["nodes"] = nodes
    if spec.get("elasticPolicy") is not None:
        job_spec["nodes"] = _elastic(elastic, nodes, _count(worker), job, out)
    job_spec["nprocPerNode"] = _nproc(
        spec, elastic, taken.get("--nproc-per-node"), is_launcher, _gpu_limit(trainer), out
    )
    if taken.get("--max-restarts") is not None:
        torchrun = job_spec.setdefault("torchrun", {})
        if "maxRestarts" in torchrun and str(torchrun["maxRestarts"]) != taken["--max-restarts"]:
            out.warn(
                "spec.elasticPolicy.maxRestarts",
                f"differs from the command's --max-restarts {taken['--max-restarts']}: the "
                "command's is kept, as torchrun's flag won",
            )
        value = str(taken["--max-restarts"])
        if value.isdigit():
            torchrun["maxRestarts"] = _bounded(value, 0, models.MAX_RESTARTS, trainer_at, out)
    _run_policy(
        spec.get("runPolicy") or {}, _restart_policy(master, worker, kind, out), kind, job, out
    )
    policy = (spec.get("runPolicy") or {}).get("schedulingPolicy")
    if policy is not None:
        _scheduling(policy, pod, out)
    job_spec["template"] = template
    # Keys in a readable order.
    order = [
        "nodes",
        "elastic",
        "nprocPerNode",
        "torchrun",
        "rendezvous",
        "failurePolicy",
        "runPolicy",
        "scheduling",
        "template",
    ]
    job["spec"] = {k: job_spec[k] for k in order if k in job_spec}
    return out


def documents(text: str) -> list[dict[str, Any]]:
    """The objects of a YAML or JSON stream (a List's items included), loaded within bounds
    (convert_input.py)."""
    docs: list[dict[str, Any]] = []
    for doc in load(text):
        if not doc:
            continue
        if not isinstance(doc, dict):
            raise ConvertError("the input is not a Kubernetes object")
        if str(doc.get("kind", "")).endswith("List") and isinstance(doc.get("items"), list):
            for i, item in enumerate(doc["items"]):
                if not isinstance(item, dict):
                    raise ConvertError(
                        f"items[{i}] of the {doc['kind']} is not a Kubernetes object"
                    )
                docs.append(item)
        else:
            docs.append(doc)
    return docs


def _say(kind: str, text: str) -> None:
    """One line on stderr: keys and values from the input may hold newlines or control
    characters, shown escaped."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    print(f"{kind}: {shown}", file=sys.stderr)


def _name(doc: dict[str, Any]) -> str:
    """The object's kind and name for messages, whatever their types."""
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    kind = doc.get("kind")
    return f"{kind if isinstance(kind, str) else '?'} {name if isinstance(name, str) else '?'}"


def validate(job: dict[str, Any]) -> str | None:
    """Why the converted job is not a valid DistributedTrainingJob, None if it is."""
    try:
        models.JobSpec.model_validate(job["spec"])
    except ValidationError as e:
        return "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'spec'}: {err['msg']}" for err in e.errors()
        )
    return None


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "convert",
        help="print a Kubeflow PyTorchJob as a DistributedTrainingJob",
        description="Print the DistributedTrainingJob equivalent to a Kubeflow PyTorchJob "
        "(kubeflow.org/v1); what cannot be carried over is listed on stderr "
        "(docs/migrating.md).",
    )
    p.add_argument(
        "-f", "--filename", default="-", help="the PyTorchJob's YAML or JSON (default: stdin)"
    )
    p.add_argument(
        "--entrypoint",
        help="the command the image's ENTRYPOINT runs, for a container without one, e.g. "
        "'python /opt/mnist/src/mnist.py'",
    )
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")


def run(args: argparse.Namespace) -> int:
    try:
        if args.filename == "-":
            text = sys.stdin.read(MAX_INPUT_BYTES + 1)  # more is refused: read no further
        else:
            with open(args.filename) as f:
                text = f.read(MAX_INPUT_BYTES + 1)
        docs = documents(text)
    except (OSError, UnicodeDecodeError, ConvertError) as e:
        _say("error", str(e))
        return 1
    if not docs:
        _say("error", "no PyTorchJob in the input")
        return 1
    try:
        entrypoint = shlex.split(args.entrypoint) if args.entrypoint else None
    except ValueError as e:
        _say("error", f"--entrypoint {args.entrypoint!r}: {e}")
        return 1
    status = 0
    jobs = []
    for doc in docs:
        what = _name(doc)
        try:
            result = convert(doc, entrypoint)
        except ConvertError as e:
            _say("error", f"{what}: {e}")
            status = 1
            continue
        for w in result.warnings:
            _say("warning", f"{what}: {w}")
        for e in result.errors:
            _say("error", f"{what}: {e}")
            status = 1
        invalid = validate(result.job)
        if invalid:
            _say("error", f"{what}: the result is not a valid {names.KIND} until edited: {invalid}")
            status = 1
        jobs.append(result.job)
    if not jobs:
        return status
    if args.output == "json":
        listed = {"apiVersion": "v1", "kind": "List", "items": jobs}
        print(json.dumps(jobs[0] if len(jobs) == 1 else listed, indent=2))
    else:
        print("---\n".join(yaml.safe_dump(j, sort_keys=False) for j in jobs), end="")
    return status
