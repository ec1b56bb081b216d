"""Bad DistributedTrainingJobs, shared by two tests.

tests/integration/test_admission.py applies each to a real apiserver, which must refuse it,
and writes the messages to docs/bad-input.md; tests/unit/api/test_bad_input.py checks that the
pydantic model refuses every spec-level one too (the reconciler's second line of defence).

A case is a good job (GOOD) with `changes` applied: each maps a dotted path (a number indexes
a list) to a new value, or to DELETE to remove the field. A transition case (`update` set) is
created with `changes` and then patched with `update`, which the apiserver must refuse.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from typing import Any

import jobs

GOOD: dict[str, Any] = jobs.job("bad", nproc=2, image="pytorch/pytorch", command=["python", "t.py"])

TRAINER = "spec.template.spec.containers.0"
DELETE = object()


@dataclass(frozen=True)
class Case:
    id: str
    """A DNS label: transition cases name their job after it."""
    changes: dict[str, Any]
    expected: str
    """What the apiserver's message must contain: the field or the problem."""
    update: dict[str, Any] | None = None
    why: str = ""
    """The rule it breaks, for the table; empty when the changes say it all."""
    model_expected: str | None = None
    """What the model's error must contain, where it words it differently."""

    @property
    def spec_level(self) -> bool:
        """Whether the model alone can refuse it: a spec without the old spec to compare."""
        return self.update is None and all(p.startswith("spec.") for p in self.changes)


def apply(doc: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    doc = copy.deepcopy(doc)
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node: Any = doc
        for p in parents:
            node = node[int(p)] if p.isdigit() else node.setdefault(p, {})
        if value is DELETE:
            del node[leaf]
        else:
            node[leaf] = value
    return doc


def job(case: Case) -> dict[str, Any]:
    return apply(GOOD, case.changes)


def describe(changes: dict[str, Any]) -> str:
    """The changes as `path: value` lines, paths as Kubernetes writes them."""

    def path(p: str) -> str:
        return ".".join(f"[{part}]" if part.isdigit() else part for part in p.split(".")).replace(
            ".[", "["
        )

    def value(v: Any) -> str:
        return "(removed)" if v is DELETE else json.dumps(v)

    return "; ".join(f"{path(p)}: {value(v)}" for p, v in changes.items())


def _gpu(**tables: Any) -> dict[str, Any]:
    return {f"{TRAINER}.resources": {t: {"nvidia.com/gpu": q} for t, q in tables.items()}}


_ELASTIC = {"spec.elastic": {"minNodes": 1, "maxNodes": 4}}

CASES: list[Case] = [
    # ---- the trainer container and the pod template
    Case("no-image", {f"{TRAINER}.image": DELETE}, "image"),
    Case("empty-image", {f"{TRAINER}.image": ""}, "image"),
    Case("no-command", {f"{TRAINER}.command": DELETE}, "command"),
    Case("empty-command", {f"{TRAINER}.command": []}, "command"),
    Case("no-containers", {"spec.template.spec.containers": []}, "containers"),
    # ---- sizes and bounds
    Case("zero-nodes", {"spec.nodes": 0}, "nodes"),
    Case("too-many-nodes", {"spec.nodes": 5000}, "nodes"),
    Case("zero-procs", {"spec.nprocPerNode": 0}, "nprocPerNode"),
    Case("too-many-procs", {"spec.nprocPerNode": 2000}, "nprocPerNode"),
    Case("procs-not-gpu", {"spec.nprocPerNode": "cpu"}, "nprocPerNode"),
    Case("port-out-of-range", {"spec.rendezvous.port": 70000}, "port"),
    Case(
        "port-is-the-status-port",
        {"spec.rendezvous.port": 29401},
        "status port",
        why="29401 is the launcher's status endpoint in every pod",
    ),
    # ---- spec.checkpoint (docs/progress.md, "Checkpoints")
    Case(
        "checkpoint-two-sources",
        {"spec.checkpoint": {"claimName": "ckpt", "volume": {"emptyDir": {}}}},
        "exactly one of claimName",
    ),
    Case("checkpoint-no-source", {"spec.checkpoint": {"mountPath": "/ckpt"}}, "exactly one"),
    Case(
        "checkpoint-reserved-path",
        {"spec.checkpoint": {"claimName": "ckpt", "mountPath": "/var/run/torchrun/ckpt"}},
        "checkpoint.mountPath may not be",
    ),
    # ---- spec.scheduling (docs/scheduling.md)
    Case("unknown-gang", {"spec.scheduling": {"gang": "Kueue"}}, "gang"),
    Case(
        "scheduler-name-without-gang",
        {"spec.scheduling": {"schedulerName": "volcano"}},
        "schedulerName needs a gang",
        why="without a gang the template's schedulerName is the place",
    ),
    Case(
        "queue-without-volcano",
        {"spec.scheduling": {"gang": "Native", "queue": "research"}},
        "queue is Volcano's",
    ),
    Case(
        "timeout-without-coscheduling",
        {"spec.scheduling": {"gang": "Volcano", "scheduleTimeoutSeconds": 60}},
        "scheduleTimeoutSeconds is coscheduling's",
    ),
    Case(
        "exclusive-without-topology-key",
        {"spec.scheduling": {"placement": {"exclusive": True}}},
        "exclusive needs placement.topologyKey",
        why="exclusive is of a topology domain",
    ),
    Case(
        "bad-topology-key",
        {"spec.scheduling": {"placement": {"topologyKey": "rack name"}}},
        "topologyKey",
    ),
    Case(
        "straggler-factor-too-small",
        {"spec.monitoring.straggler": {"factor": 1.0}},
        "factor",
        why="a straggler is at least 1.1 times the median",
    ),
    Case(
        "straggler-window-too-short",
        {"spec.monitoring.straggler": {"windowSeconds": 1}},
        "windowSeconds",
        why="a window of at least 5 s",
    ),
    Case(
        "deadline-too-long",
        {"spec.runPolicy.activeDeadlineSeconds": 99999999999},
        "activeDeadlineSeconds",
        why="durations at most a year",
    ),
    Case(
        "ttl-too-long",
        {"spec.runPolicy.ttlSecondsAfterFinished": 99999999999},
        "ttlSecondsAfterFinished",
        why="durations at most a year",
    ),
    Case(
        "progress-timeout-too-long",
        {"spec.runPolicy.progressTimeoutSeconds": 100000},
        "progressTimeoutSeconds",
        why="timeouts at most a day",
    ),
    Case(
        "zero-progress-timeout",
        {"spec.runPolicy.progressTimeoutSeconds": 0},
        "progressTimeoutSeconds",
    ),
    Case(
        "join-timeout-too-long",
        {"spec.rendezvous.joinTimeoutSeconds": 100000},
        "joinTimeoutSeconds",
        why="timeouts at most a day",
    ),
    Case(
        "dns-timeout-too-long",
        {"spec.rendezvous.dnsTimeoutSeconds": 100000},
        "dnsTimeoutSeconds",
        why="timeouts at most a day",
    ),
    Case(
        "too-many-gang-restarts",
        {"spec.failurePolicy.maxRestarts": 1001},
        "maxRestarts",
        why="restarts at most 1000",
    ),
    Case("negative-gang-restarts", {"spec.failurePolicy.maxRestarts": -1}, "maxRestarts"),
    Case(
        "backoff-too-long",
        {"spec.failurePolicy.backoffSeconds": 100000},
        "backoffSeconds",
        why="back-off at most a day",
    ),
    Case(
        "max-backoff-too-long",
        {"spec.failurePolicy.maxBackoffSeconds": 100000},
        "maxBackoffSeconds",
        why="back-off at most a day",
    ),
    Case(
        "too-many-torchrun-restarts",
        {"spec.torchrun.maxRestarts": 5000},
        "maxRestarts",
        why="restarts at most 1000",
    ),
    Case(
        "exit-code-out-of-range",
        {"spec.failurePolicy.retryableExitCodes": [300]},
        "retryableExitCodes",
    ),
    # ---- enums and unknown fields
    Case("unknown-clean-pod-policy", {"spec.runPolicy.cleanPodPolicy": "Never"}, "cleanPodPolicy"),
    Case("unknown-success-policy", {"spec.successPolicy": "Majority"}, "successPolicy"),
    Case("unknown-field", {"spec.nodez": 3}, "nodez"),
    Case("unknown-nested-field", {"spec.rendezvous": {"port": 29400, "bogus": 1}}, "bogus"),
    # ---- elastic bounds
    Case("min-over-max", {"spec.elastic": {"minNodes": 3, "maxNodes": 2}}, "minNodes"),
    Case(
        "nodes-over-max",
        {"spec.nodes": 4, "spec.elastic": {"minNodes": 1, "maxNodes": 3}},
        "minNodes",
    ),
    Case("nodes-under-min", {"spec.elastic": {"minNodes": 3}}, "minNodes"),
    Case("zero-min-nodes", {"spec.elastic": {"minNodes": 0}}, "minNodes"),
    # ---- GPUs
    Case("gpu-without-limit", {"spec.nprocPerNode": "gpu"}, "nvidia.com/gpu"),
    Case(
        "gpu-with-zero-limit",
        {"spec.nprocPerNode": "gpu", **_gpu(limits=0)},
        "nvidia.com/gpu limit of at least 1",
    ),
    Case("gpu-milli", _gpu(limits="500m"), "whole number of GPUs"),
    Case("gpu-fraction", _gpu(limits="0.5"), "whole number of GPUs"),
    Case("gpu-exponent", _gpu(limits="1e3"), "whole number of GPUs"),
    Case("gpu-leading-zero", _gpu(limits="08"), "whole number of GPUs"),
    Case("gpu-negative", _gpu(limits=-1), "whole number of GPUs"),
    Case("gpu-too-many", _gpu(limits=65), "whole number of GPUs", why="at most 64 GPUs a pod"),
    Case("gpu-float", _gpu(limits=0.5), "nvidia.com/gpu"),
    Case("gpu-request-milli", _gpu(limits=1, requests="500m"), "whole number of GPUs"),
    Case("gpu-request-without-limit", _gpu(requests=2), "needs an equal nvidia.com/gpu limit"),
    Case(
        "gpu-request-not-limit",
        _gpu(limits=8, requests="4"),
        "needs an equal nvidia.com/gpu limit",
    ),
    # ---- what the operator reserves
    Case(
        "reserved-volume-name",
        {"spec.template.spec.volumes": [{"name": "torchrun-state", "emptyDir": {}}]},
        "reserved",
    ),
    Case(
        "mount-on-state-dir",
        {
            f"{TRAINER}.volumeMounts": [{"name": "data", "mountPath": "/var/run/torchrun"}],
            "spec.template.spec.volumes": [{"name": "data", "emptyDir": {}}],
        },
        "/var/run/torchrun",
    ),
    Case(
        "mount-under-launcher-dir",
        {
            f"{TRAINER}.volumeMounts": [
                {"name": "data", "mountPath": "/opt/torchrun-operator/launcher.py"}
            ],
            "spec.template.spec.volumes": [{"name": "data", "emptyDir": {}}],
        },
        "/opt/torchrun-operator",
    ),
    Case(
        "mount-on-termination-log",
        {
            f"{TRAINER}.volumeMounts": [{"name": "data", "mountPath": "/dev/termination-log"}],
            "spec.template.spec.volumes": [{"name": "data", "emptyDir": {}}],
        },
        "/dev/termination-log",
    ),
    # ---- a launcher in the trainer's command, with a flag the operator owns (docs/migrating.md;
    # CEL sees the first flags written as --flag=value, the model every flag)
    Case(
        "torchrun-nnodes",
        {f"{TRAINER}.command": ["torchrun", "--nnodes=2", "t.py"]},
        "a flag the operator sets",
        why="spec.nodes says it",
        model_expected="spec.nodes",
    ),
    Case(
        "torchrun-rendezvous-in-args",
        {
            f"{TRAINER}.command": ["torchrun"],
            f"{TRAINER}.args": ["--rdzv-backend=c10d", "--rdzv-endpoint=master:29400", "t.py"],
        },
        "a flag the operator sets",
        why="the operator hosts the rendezvous on pod 0",
        model_expected="spec.rendezvous",
    ),
    Case(
        "launch-master-port",
        {
            f"{TRAINER}.command": [
                "python",
                "-m",
                "torch.distributed.launch",
                "--nproc_per_node=2",
                "--master_port=29501",
                "t.py",
            ]
        },
        "a flag the operator sets",
        model_expected="--master_port=29501",
    ),
    Case(
        "torchrun-standalone",
        {f"{TRAINER}.command": ["/opt/conda/bin/torchrun", "--standalone", "t.py"]},
        "a flag the operator sets",
        model_expected="spec.nodes: 1",
    ),
    Case(
        "torchrun-max-restarts",
        {f"{TRAINER}.command": ["torchrun", "--max_restarts=3", "t.py"]},
        "a flag the operator sets",
        why="spec.torchrun.maxRestarts says it",
        model_expected="spec.torchrun.maxRestarts",
    ),
    # ---- a launcher flag whose value looks like a flag: the pod's torchrun would read it as one
    Case(
        "torchrun-flag-as-value",
        {f"{TRAINER}.command": ["torchrun", "--role=--nnodes=9", "t.py"]},
        "looks like a flag",
        why="the pod's torchrun would read --nnodes=9 as a flag",
        model_expected="--role=--nnodes=9 gives --role a value that looks like a flag",
    ),
    Case(
        "torchrun-short-flag-as-value",
        {f"{TRAINER}.command": ["torchrun", "-r=--nnodes=3", "t.py"]},
        "looks like a flag",
        model_expected="-r=--nnodes=3 gives -r a value",
    ),
    Case(
        "torchrun-flag-without-value",
        {f"{TRAINER}.command": ["torchrun"], f"{TRAINER}.args": ["--role", "--log-dir=/x", "t.py"]},
        "looks like a flag",
        model_expected="--role needs a value, and --log-dir=/x after it looks like a flag",
    ),
    Case("unknown-local-rank-arg", {"spec.torchrun.localRankArg": "--rank"}, "localRankArg"),
    # ---- the job's name
    Case("name-too-long", {"metadata.name": "a" * 62}, "too long"),
    Case("name-not-dns", {"metadata.name": "9lives"}, "DNS-1035"),
    # ---- changes to a running job (create, then update)
    Case("nodes-changed", {}, "nodes cannot change", update={"spec.nodes": 3}),
    Case(
        "elastic-nodes-without-max",
        {"spec.elastic": {"minNodes": 1}},
        "nodes cannot change",
        update={"spec.nodes": 3},
        why="without maxNodes the bounds would move with nodes",
    ),
    Case(
        "elastic-nodes-out-of-bounds",
        _ELASTIC,
        "minNodes <= nodes <= maxNodes",
        update={"spec.nodes": 5},
    ),
    Case("elastic-changed", _ELASTIC, "elastic cannot change", update={"spec.elastic.maxNodes": 8}),
    Case("procs-changed", {}, "nprocPerNode cannot change", update={"spec.nprocPerNode": 4}),
    Case(
        "procs-set",
        {"spec.nprocPerNode": DELETE},
        "nprocPerNode cannot change",
        update={"spec.nprocPerNode": 4},
    ),
    Case(
        "template-changed",
        {},
        "template cannot change",
        update={f"{TRAINER}.image": "pytorch/pytorch:2"},
    ),
    Case(
        "rendezvous-changed",
        {},
        "rendezvous cannot change",
        update={"spec.rendezvous.port": 29500},
    ),
    Case(
        "scheduling-changed",
        {},
        "scheduling cannot change",
        update={"spec.scheduling.gang": "Native"},
        why="the running attempt's pods and gang were made for the old choice",
    ),
]
