"""One training pod per index; see docs/pod-contract.md for what the launcher expects."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from ..api import launchcmd, names
from ..api.bounds import RESERVED_VOLUME_PREFIX
from ..api.spec import JobSpec
from ..launcher import contract
from . import gang, placement
from .common import child_metadata
from .configmap import packaged_launcher_digest
from .ports import host_network, ports
from .sizing import job_spec, nproc_per_node

LAUNCHER_PATH = f"{contract.LAUNCHER_DIR}/{contract.LAUNCHER_FILE}"
READY_FILE = f"{contract.STATE_DIR}/{contract.READY_FILE}"
PROGRESS_FILE = f"{contract.STATE_DIR}/{contract.PROGRESS_FILE}"

# The pod runs the launcher only if its bytes hash to the digest the operator rendered: the
# ConfigMap is owned and immutable, and this check makes a swapped file fail loudly instead of
# running. The launcher is a zipapp (render/configmap.py): runpy.run_path puts the archive on
# sys.path and runs its __main__, which runs the launcher package's main.
LAUNCHER_BOOTSTRAP = (
    "import hashlib,runpy,sys;p,h=sys.argv[1:3];"
    "hashlib.sha256(open(p,'rb').read()).hexdigest()==h or "
    "sys.exit(f'torchrun-operator: {p} is not the launcher the operator rendered');"
    "sys.argv=[p,*sys.argv[3:]];runpy.run_path(p,run_name='__main__')"
)

# Prefixed so they never clash with the user's own volume names.
VOLUME_SHM = "torchrun-shm"
VOLUME_LAUNCHER = "torchrun-launcher"
VOLUME_STATE = "torchrun-state"
VOLUME_CHECKPOINT = "torchrun-checkpoint"

# Environment the renderer owns; a user value of the same name is replaced, not duplicated.
OWNED_ENV = (
    "PET_LOCAL_ADDR",
    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE",
    contract.ENV_STATE_DIR,
    contract.ENV_DNS_TIMEOUT,
    contract.ENV_INDEX,
    contract.ENV_NODE_RANK,
    contract.ENV_ATTEMPT,
    contract.ENV_PROGRESS_FILE,
    contract.ENV_PROGRESS_TIMEOUT,
    contract.ENV_PROGRESS_WINDOW,
    contract.ENV_STATUS_PORT,
    contract.ENV_LOCAL_RANK_ARG,
    contract.ENV_CHECKPOINT_DIR,
    contract.ENV_RESUME_FROM,
)
# The launcher averages step times over this window unless spec.monitoring.straggler sets one.
DEFAULT_PROGRESS_WINDOW_SECONDS = 60


def restarts_possible(spec: JobSpec) -> bool:
    """Whether a pod may meet a rendezvous that outlives one round: then torch's shared
    TCPStore deadlocks (seen with torch 2.13 on elastic scale-up and on a replaced pod), so
    sharing is turned off."""
    return spec.failure_policy.max_restarts > 0 or spec.is_elastic or spec.torchrun.max_restarts > 0


def torchrun_args(job: dict[str, Any], node_index: int, attempt: int) -> list[str]:
    spec = job_spec(job)
    meta = job["metadata"]
    nnodes = f"{spec.min_nodes}:{spec.max_nodes}" if spec.is_elastic else str(spec.nodes)
    rdzv = spec.rendezvous
    port, _ = ports(job, spec)
    is_host = 1 if node_index == 0 else 0
    return [
        "--nnodes",
        nnodes,
        "--nproc-per-node",
        str(nproc_per_node(spec)),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"{names.rendezvous_host(meta['name'], attempt)}:{port}",
        "--rdzv-id",
        names.rdzv_id(meta["uid"], attempt),
        "--rdzv-conf",
        f"is_host={is_host},join_timeout={rdzv.join_timeout_seconds}",
        "--max-restarts",
        str(spec.torchrun.max_restarts),
    ]


def _window(spec: JobSpec) -> int:
    straggler = spec.monitoring.straggler
    return straggler.window_seconds if straggler else DEFAULT_PROGRESS_WINDOW_SECONDS


def resume_from(job: dict[str, Any], mount: str) -> str | None:
    """The path of the latest checkpoint the job's pods reported (status.lastCheckpoint),
    which every pod created from now on resumes from, if it lies in the checkpoint storage
    mounted at `mount` (the reconciler refuses any other; this keeps one the status holds from
    before, from another mountPath or an older operator, from reaching a pod)."""
    last = (job.get("status") or {}).get("lastCheckpoint")
    path = last.get("path") if isinstance(last, dict) else None
    if not isinstance(path, str) or not path or contract.checkpoint_outside(path, mount):
        return None
    return path


def _checkpoint_env(job: dict[str, Any], spec: JobSpec) -> list[dict[str, Any]]:
    if spec.checkpoint is None:
        return []
    env = [{"name": contract.ENV_CHECKPOINT_DIR, "value": spec.checkpoint.mount_path}]
    path = resume_from(job, spec.checkpoint.mount_path)
    if path is not None:
        env.append({"name": contract.ENV_RESUME_FROM, "value": path})
    return env


def _env(spec: JobSpec, node_index: int, attempt: int, status_port: int) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [
        {"name": "PET_LOCAL_ADDR", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": contract.ENV_STATE_DIR, "value": contract.STATE_DIR},
        {"name": contract.ENV_DNS_TIMEOUT, "value": str(spec.rendezvous.dns_timeout_seconds)},
        {"name": contract.ENV_INDEX, "value": str(node_index)},
        # Deprecated name of the index (it is not torchrun's node rank), kept for scripts.
        {"name": contract.ENV_NODE_RANK, "value": str(node_index)},
        {"name": contract.ENV_ATTEMPT, "value": str(attempt)},
        {"name": contract.ENV_PROGRESS_FILE, "value": PROGRESS_FILE},
        {"name": contract.ENV_PROGRESS_WINDOW, "value": str(_window(spec))},
        {"name": contract.ENV_STATUS_PORT, "value": str(status_port)},
    ]
    timeout = spec.run_policy.progress_timeout_seconds
    if timeout is not None:
        # docs/progress.md: the launcher withdraws readiness when the file stops changing.
        env.append({"name": contract.ENV_PROGRESS_TIMEOUT, "value": str(timeout)})
    if restarts_possible(spec):
        env.append({"name": "TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "value": "1"})
    return env


def _trainer(
    job: dict[str, Any], spec: JobSpec, container: dict[str, Any], node_index: int, attempt: int
) -> dict[str, Any]:
    program = list(container.get("command") or []) + list(container.get("args") or [])
    # A launcher in the command (torchrun train.py): rendered as if the user had written the
    # script alone; the model refused the flags that conflict with the spec.
    launch = launchcmd.parse(program)
    if launch is not None:
        program = list(launch.program)
    passthrough = launch.passthrough if launch is not None else []
    digest = packaged_launcher_digest()
    container["command"] = ["python", "-c", LAUNCHER_BOOTSTRAP, LAUNCHER_PATH, digest]
    container["args"] = [*torchrun_args(job, node_index, attempt), *passthrough, "--", *program]
    user_env = [e for e in container.get("env") or [] if e.get("name") not in OWNED_ENV]
    port, status_port = ports(job, spec)
    container["env"] = (
        user_env + _env(spec, node_index, attempt, status_port) + _checkpoint_env(job, spec)
    )
    local_rank_arg = spec.torchrun.local_rank_arg or (launch.local_rank_arg if launch else None)
    if local_rank_arg:
        # The launcher's worker shim passes the script --local-rank=<LOCAL_RANK>.
        container["env"].append({"name": contract.ENV_LOCAL_RANK_ARG, "value": local_rank_arg})
    mounts = list(container.get("volumeMounts") or [])
    paths = {m.get("mountPath") for m in mounts}
    if "/dev/shm" not in paths:
        mounts.append({"name": VOLUME_SHM, "mountPath": "/dev/shm"})
    mounts.append({"name": VOLUME_LAUNCHER, "mountPath": contract.LAUNCHER_DIR, "readOnly": True})
    mounts.append({"name": VOLUME_STATE, "mountPath": contract.STATE_DIR})
    if spec.checkpoint is not None:
        mounts.append({"name": VOLUME_CHECKPOINT, "mountPath": spec.checkpoint.mount_path})
    container["volumeMounts"] = mounts
    # With hostNetwork these become host ports: the scheduler keeps pods that share one apart.
    declared = list(container.get("ports") or [])
    if not any(p.get("name") == "c10d" or p.get("containerPort") == port for p in declared):
        declared.append({"name": "c10d", "containerPort": port, "protocol": "TCP"})
    if not any(p.get("containerPort") == status_port for p in declared):
        # The launcher's read-only status endpoint, which the operator reads (pod contract).
        status = {"containerPort": status_port, "protocol": "TCP"}
        declared.append({"name": contract.STATUS_PORT_NAME, **status})
    container["ports"] = declared
    # Ready means "rendezvous done, training": the launcher creates the file afterwards.
    container["readinessProbe"] = {
        "exec": {"command": ["cat", READY_FILE]},
        "periodSeconds": 5,
        "failureThreshold": 1,
    }
    # The launcher's JSON summary; FallbackToLogsOnError would mix log text into it.
    container["terminationMessagePath"] = contract.TERMINATION_LOG
    container["terminationMessagePolicy"] = "File"
    return container


def _volumes(job: dict[str, Any], spec: JobSpec, pod_spec: dict[str, Any]) -> list[dict[str, Any]]:
    volumes = [
        v
        for v in pod_spec.get("volumes") or []
        if not v.get("name", "").startswith(RESERVED_VOLUME_PREFIX)
    ]
    cm = names.launcher_configmap_name(job["metadata"]["name"], packaged_launcher_digest())
    volumes.append({"name": VOLUME_SHM, "emptyDir": {"medium": "Memory"}})
    volumes.append({"name": VOLUME_LAUNCHER, "configMap": {"name": cm, "defaultMode": 0o444}})
    volumes.append({"name": VOLUME_STATE, "emptyDir": {}})
    checkpoint = spec.checkpoint
    if checkpoint is not None and checkpoint.claim_name is not None:
        claim = {"claimName": checkpoint.claim_name}
        volumes.append({"name": VOLUME_CHECKPOINT, "persistentVolumeClaim": claim})
    elif checkpoint is not None and checkpoint.volume is not None:
        volumes.append({**copy.deepcopy(checkpoint.volume), "name": VOLUME_CHECKPOINT})
    return volumes


def _quantities_as_strings(container: dict[str, Any]) -> None:
    """`nvidia.com/gpu: 8` is a valid quantity in YAML, but a quantity's wire form is a
    string and the official client refuses an integer in a pod it sends."""
    resources = container.get("resources") or {}
    for table in ("limits", "requests"):
        if resources.get(table):
            resources[table] = {k: str(v) for k, v in resources[table].items()}


def render_pod(
    job: dict[str, Any],
    node_index: int,
    attempt: int,
    replacement: int = 0,
    avoid_nodes: Sequence[str] = (),
) -> dict[str, Any]:
    """The pod for node `node_index` of gang attempt `attempt` (`replacement` > 0 for an
    elastic replacement within the attempt), kept off `avoid_nodes` (status.avoidedNodes).
    The template is deep-copied; only the trainer (first container), volumes,
    hostname/subdomain and restart policy are changed, and the API token's automount is
    turned off unless the template decides."""
    spec = job_spec(job)
    job_name = job["metadata"]["name"]
    template = copy.deepcopy(job["spec"]["template"])
    tmeta = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template["spec"]

    metadata = child_metadata(job, names.pod_name(job_name, node_index, attempt, replacement))
    metadata["labels"] = {
        **(tmeta.get("labels") or {}),
        names.LABEL_JOB_NAME: job_name,
        names.LABEL_INDEX: str(node_index),
        names.LABEL_NODE_RANK: str(node_index),  # deprecated name of the index
        names.LABEL_ATTEMPT: str(attempt),
    }
    if tmeta.get("annotations"):
        metadata["annotations"] = dict(tmeta["annotations"])

    containers = pod_spec["containers"]
    containers[0] = _trainer(job, spec, containers[0], node_index, attempt)
    for c in [*containers, *pod_spec.get("initContainers", [])]:
        _quantities_as_strings(c)
    pod_spec["volumes"] = _volumes(job, spec, pod_spec)
    pod_spec["hostname"] = names.hostname(job_name, node_index, attempt)
    pod_spec["subdomain"] = names.service_name(job_name)
    # The operator owns restarts (gang semantics); the kubelet must not restart in place.
    pod_spec["restartPolicy"] = "Never"
    if host_network(job):
        # The pods still resolve the rendezvous host through the cluster's DNS.
        pod_spec.setdefault("dnsPolicy", "ClusterFirstWithHostNet")
    # Training code (the user's image, whatever its packages pull in) has no use for an API
    # token: neither torchrun nor the launcher talks to the API. Without this, the kubelet
    # mounts the token of the pod's ServiceAccount ("default" unless set) into every pod. A
    # template that sets the field, either way, keeps its choice (docs/security.md).
    pod_spec.setdefault("automountServiceAccountToken", False)
    # spec.scheduling: the attempt's gang and the placement's affinity terms.
    gang.apply_to_pod(job, spec, metadata, pod_spec)
    placement.apply_to_pod(job, spec, metadata, pod_spec)
    placement.avoid_nodes(metadata, pod_spec, avoid_nodes)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}
