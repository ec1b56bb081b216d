"""The API's bounds and reserved names: every limit a field is checked against, the GPU
resource and its whole-number spellings, and what the operator reserves in every pod.

Apart from the models because the models (api/template.py, api/spec.py), their CEL rules
(api/celrules.py), the renderer and the converter all read them: each bound is stated once.
"""

from __future__ import annotations

from ..launcher import contract

GPU_RESOURCE = "nvidia.com/gpu"

# Bounds. Besides what each comment gives as its reason, every bound is finite so that CEL
# rules stay inside the apiserver's cost budget and a typo (an extra digit) is refused.
MAX_NODES = 4096  # more pods than the largest training clusters have nodes
MAX_CONTAINERS = 64
# Pods have a few volumes; cloud disks attach at most ~128 per node.
MAX_VOLUMES = 256
MAX_VOLUME_MOUNTS = 256
# Linux PATH_MAX: no mount path is longer.
MAX_PATH_LENGTH = 4096
# Worker processes per pod: one per GPU or core, and no node has a thousand of either.
MAX_PROCS_PER_NODE = 1024
# A job's run time and how long a finished job is kept: no training run lasts a year; the
# reconciler's timers wake at least hourly, so any length costs nothing.
MAX_DURATION_SECONDS = 366 * 24 * 3600
# Waits for what takes seconds or minutes (a rendezvous join, DNS, one training step, the
# back-off between attempts): a job stuck longer than a day is better failed than waiting.
MAX_TIMEOUT_SECONDS = 24 * 3600
# Restarts (gang or torchrun's in-pod): each costs a rendezvous and a checkpoint load; a
# thousand of them is a crash loop, not a recovery.
MAX_RESTARTS = 1000
# A checkpoint path a script reports is shown in the status and handed to the next attempt's
# pods in an environment variable: bounded like any path (docs/progress.md, "Checkpoints").
MAX_CHECKPOINT_PATH = 1024

# What the operator itself puts into every pod (render/pod.py uses these): a user volume
# with the prefix would be replaced by the operator's, and a trainer mount at or under one of
# the paths would hide the launcher, its state or the termination message. /dev/shm is not
# reserved: the renderer keeps a user's own /dev/shm mount.
RESERVED_VOLUME_PREFIX = "torchrun-"
RESERVED_MOUNT_PATHS = (contract.LAUNCHER_DIR, contract.STATE_DIR, contract.TERMINATION_LOG)


def reserved_path(path: str) -> bool:
    """Whether a mount path is at or under one of RESERVED_MOUNT_PATHS."""
    return any(path == p or path.startswith(p + "/") for p in RESERVED_MOUNT_PATHS)


# A Kubernetes quantity: an integer or a string such as "2" or "500m".
Quantity = int | str


# ---- GPU quantities -------------------------------------------------------------------------

# Whole GPUs only, written plainly: "500m" and "0.5" are fractions, and "1e3" or "08", though
# Kubernetes quantities, are surely typos. A string count is checked against the list of every
# allowed spelling, because equality with short constants is all the apiserver's CEL cost
# budget affords: its estimator takes a quantity string for as long as a whole request (3 MiB),
# so a regex, int() or string() of one is over budget (Kubernetes 1.34 would honour a maxLength
# there, older versions do not). Hence the list, and a bound that keeps it short: the largest
# hosts have 16 GPUs.
MAX_GPUS_PER_POD = 64
GPU_SPELLINGS = tuple(str(n) for n in range(MAX_GPUS_PER_POD + 1))


def gpu_count(quantity: Quantity) -> int | None:
    """A GPU quantity as a whole number of GPUs (0 to MAX_GPUS_PER_POD), None if it is not."""
    if isinstance(quantity, bool):
        return None
    if isinstance(quantity, int):
        return quantity if 0 <= quantity <= MAX_GPUS_PER_POD else None
    return int(quantity) if quantity in GPU_SPELLINGS else None
