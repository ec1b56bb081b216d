"""Names, labels and constants shared by the renderer, the reconciler and the shell."""

from __future__ import annotations

import hashlib

GROUP = "torchrun.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "DistributedTrainingJob"
PLURAL = "distributedtrainingjobs"
SINGULAR = "distributedtrainingjob"
SHORT_NAMES = ["dtj", "dtjs"]

# The training runtimes a job can name in spec.runtimeRef (api/runtime.py, docs/runtimes.md).
CLUSTER_RUNTIME_KIND = "ClusterDistributedTrainingRuntime"
CLUSTER_RUNTIME_PLURAL = "clusterdistributedtrainingruntimes"
RUNTIME_KIND = "DistributedTrainingRuntime"
RUNTIME_PLURAL = "distributedtrainingruntimes"


def runtime_plural(kind: str) -> str:
    """The resource a runtime kind is read from; anything but the cluster kind is the
    namespaced one (the model refuses other kinds)."""
    return CLUSTER_RUNTIME_PLURAL if kind == CLUSTER_RUNTIME_KIND else RUNTIME_PLURAL


LABEL_JOB_NAME = f"{GROUP}/job-name"
# The pod's index (0..nodes-1, its name <job>-<index> in attempt 0), not torchrun's node rank.
LABEL_INDEX = f"{GROUP}/index"
# Deprecated: the pod's index under its old, misleading name, still set on every pod (and read
# from pods of earlier operator versions) so that selectors written against it keep working.
LABEL_NODE_RANK = f"{GROUP}/node-rank"
LABEL_ATTEMPT = f"{GROUP}/attempt"
# The nodes the operator's required node affinity keeps a pod off (status.avoidedNodes when
# it was rendered, render/placement.py), comma-separated and sorted; absent when none. The
# reconciler reads it (reconcile/podinput.py) to find a pod kept off a node no longer avoided.
ANNOTATION_AVOIDED_NODES = f"{GROUP}/avoided-nodes"
# kubectl apply's copy of the whole applied object, on the object itself.
ANNOTATION_LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"

# Kubernetes limits: DNS-1123/1035 labels (hostnames, Service names) are at most 63 characters.
MAX_LABEL_LENGTH = 63
# DNS-1123 subdomains (ConfigMap names) are at most 253.
MAX_OBJECT_NAME_LENGTH = 253


def service_name(job_name: str) -> str:
    """The headless Service; its name is also every pod's `subdomain`."""
    return job_name


# Hex digits of the launcher's sha256 in its ConfigMap's name: enough that a different
# launcher (another operator version) never shares a name.
LAUNCHER_DIGEST_CHARS = 10


def launcher_configmap_name(job_name: str, digest: str) -> str:
    """Named by the launcher's content hash: a pod mounts exactly the launcher the operator
    rendered, and a ConfigMap someone pre-created under the old fixed name runs nowhere."""
    suffix = f"-launcher-{digest[:LAUNCHER_DIGEST_CHARS]}"
    return job_name[: MAX_OBJECT_NAME_LENGTH - len(suffix)] + suffix


def hostname(job_name: str, node_index: int, attempt: int) -> str:
    """The hostname of index `node_index`'s pod in gang attempt `attempt`: its pod name without
    an elastic replacement's suffix, so `<job>-0.<job>` in attempt 0 and `<job>-0-a1.<job>`
    in attempt 1. A new attempt never reuses a name an earlier one published: a cluster DNS
    that lags can only fail to answer the new name, never answer it with the address an
    earlier attempt's pod had (which the process node, and many CNIs, hand out again). A
    replacement within an attempt keeps its index's hostname (one rendezvous per attempt)."""
    return pod_name(job_name, node_index, attempt)


def rendezvous_host(job_name: str, attempt: int) -> str:
    """Pod 0 hosts the c10d store; the short form relies on the namespace search domain."""
    return f"{hostname(job_name, 0, attempt)}.{service_name(job_name)}"


def pod_name(job_name: str, node_index: int, attempt: int, replacement: int = 0) -> str:
    """Pod name for index `node_index` of gang attempt `attempt`.

    Attempt 0 is `<job>-<i>`, the common case reads naturally. Later attempts and elastic
    replacements get a suffix (`-a<attempt>`, `r<k>`) so a new pod never collides with a
    terminating pod of an earlier attempt, whose deletion may take the whole grace period. If
    the suffix pushes the name past 63 characters, the job-name part is shortened and a hash
    of the full job name keeps names of different jobs apart.
    """
    base = f"{job_name}-{node_index}"
    if attempt == 0 and replacement == 0:
        return base
    suffix = f"-a{attempt}" + (f"r{replacement}" if replacement else "")
    name = base + suffix
    if len(name) <= MAX_LABEL_LENGTH:
        return name
    digest = hashlib.sha256(job_name.encode()).hexdigest()[:6]
    tail = f"-{digest}-{node_index}{suffix}"
    head = job_name[: MAX_LABEL_LENGTH - len(tail)].rstrip("-")
    return head + tail


def rdzv_id(job_uid: str, attempt: int) -> str:
    """A fresh rendezvous id per gang attempt: an agent that exits closes its rendezvous."""
    return f"{job_uid}-{attempt}"
