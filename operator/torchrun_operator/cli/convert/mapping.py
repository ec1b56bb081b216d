"""A PyTorchJob as a DistributedTrainingJob: its replicas, template, command and
nprocPerNode here, its policies in policies.py. Pure: data in (checked by parse.py), a
Conversion out."""

from __future__ import annotations

import copy
import re
from typing import Any

from torchrun_operator.api import launchcmd, models, names

from . import parse, policies
from .result import Conversion, ConvertError, bounded

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
_DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


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


def _metadata(meta: dict[str, Any], out: Conversion) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in meta.items():
        if key in ("name", "namespace", "labels"):
            result[key] = copy.deepcopy(value)
        elif key == "annotations":
            kept = {k: v for k, v in (value or {}).items() if k != names.ANNOTATION_LAST_APPLIED}
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
        return bounded(value, 1, models.MAX_PROCS_PER_NODE, where or "nprocPerNode", out)
    out.warn(where, f"{value!r} has no counterpart here: nprocPerNode is 1, set it yourself")
    return 1


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
    parse.check(doc)
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
        job_spec["nodes"] = policies.elastic(elastic, nodes, _count(worker), job, out)
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
            torchrun["maxRestarts"] = bounded(value, 0, models.MAX_RESTARTS, trainer_at, out)
    policies.run_policy(
        spec.get("runPolicy") or {},
        policies.restart_policy(master, worker, kind, out),
        kind,
        job,
        out,
    )
    policy = (spec.get("runPolicy") or {}).get("schedulingPolicy")
    if policy is not None:
        policies.scheduling_policy(policy, pod, out)
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
