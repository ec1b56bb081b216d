"""The DistributedTrainingJob API: pydantic models are the single source of truth.

The CRD schema (api/crd.py) is generated from these models: field docstrings become the
descriptions `kubectl explain` shows, and each model's CEL rules (`RULES`) sit next to the
Python check that refuses the same input. The apiserver so refuses a bad job at `kubectl
apply`; whatever reaches the reconciler anyway (a CRD installed without the rules, an
apiserver too old for them) fails `JobSpec.model_validate` there and the job turns Failed with
reason InvalidSpec. Transition rules (they compare with `oldSelf`) are CEL only: the
reconciler never sees the previous spec. docs/bad-input.md lists the refusals.
Wire names are camelCase; Python attributes are snake_case.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from ..launcher import contract
from . import launchcmd
from .scheduling import Scheduling, SchedulingStatus
from .status_names import Phase, RestartKind
from .wire import Rule, _Open, _Wire

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

# What the operator itself puts into every pod (render/pod.py uses these): a user volume
# with the prefix would be replaced by the operator's, and a trainer mount at or under one of
# the paths would hide the launcher, its state or the termination message. /dev/shm is not
# reserved: the renderer keeps a user's own /dev/shm mount.
RESERVED_VOLUME_PREFIX = "torchrun-"
RESERVED_MOUNT_PATHS = (contract.LAUNCHER_DIR, contract.STATE_DIR, contract.TERMINATION_LOG)

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
_GPU_SPELLINGS = tuple(str(n) for n in range(MAX_GPUS_PER_POD + 1))
_GPU_SPELLINGS_CEL = "[" + ", ".join(f"'{n}'" for n in _GPU_SPELLINGS) + "]"


def gpu_count(quantity: Quantity) -> int | None:
    """A GPU quantity as a whole number of GPUs (0 to MAX_GPUS_PER_POD), None if it is not."""
    if isinstance(quantity, bool):
        return None
    if isinstance(quantity, int):
        return quantity if 0 <= quantity <= MAX_GPUS_PER_POD else None
    return int(quantity) if quantity in _GPU_SPELLINGS else None


def _cel_gpu_count_ok(q: str) -> str:
    """CEL for `gpu_count(q) is not None`; q is an int-or-string (dyn) expression."""
    as_int = f"{q} >= 0 && {q} <= {MAX_GPUS_PER_POD}"
    return f"(type({q}) == int ? ({as_int}) : {q} in {_GPU_SPELLINGS_CEL})"


def _cel_same_gpu_count(a: str, b: str) -> str:
    """CEL for `gpu_count(a) == gpu_count(b) is not None`, by trying each count: int() of a
    quantity is as costly as a regex (see above)."""
    counts = "[" + ", ".join(f"[dyn({n}), dyn('{n}')]" for n in _GPU_SPELLINGS) + "]"
    return f"{counts}.exists(n, {a} in n && {b} in n)"


def _cel_gpu_rule(table: str) -> Rule:
    entry = f"self.{table}['{GPU_RESOURCE}']"
    return Rule(
        f"!has(self.{table}) || !('{GPU_RESOURCE}' in self.{table}) || {_cel_gpu_count_ok(entry)}",
        f"{GPU_RESOURCE} must be a whole number of GPUs from 0 to {MAX_GPUS_PER_POD}, "
        'e.g. 8 or "8" (not "500m", "0.5" or "1e3")',
        f".{table}",
    )


_GPU_LIMIT_FORMAT = _cel_gpu_rule("limits")
_GPU_REQUEST_FORMAT = _cel_gpu_rule("requests")
_REQ, _LIM = (f"self.{t}['{GPU_RESOURCE}']" for t in ("requests", "limits"))
_GPU_REQUEST_NEEDS_LIMIT = Rule(
    # A malformed request is the format rule's to report.
    f"!has(self.requests) || !('{GPU_RESOURCE}' in self.requests) || "
    f"!{_cel_gpu_count_ok(_REQ)} || (has(self.limits) && '{GPU_RESOURCE}' in self.limits && "
    f"{_cel_same_gpu_count(_REQ, _LIM)})",
    f"a {GPU_RESOURCE} request needs an equal {GPU_RESOURCE} limit (Kubernetes requires it "
    "of GPUs; a limit alone is enough)",
    ".requests",
)


class Resources(_Open):
    """The container's compute resources, as in a Pod."""

    RULES = (_GPU_LIMIT_FORMAT, _GPU_REQUEST_FORMAT, _GPU_REQUEST_NEEDS_LIMIT)

    limits: dict[str, Quantity] | None = None
    """Most of each resource the container may use, e.g. {nvidia.com/gpu: 8, memory: 64Gi}."""
    requests: dict[str, Quantity] | None = None
    """What the scheduler reserves for the container; for nvidia.com/gpu equal to the limit."""

    @model_validator(mode="after")
    def _check_gpus(self) -> Resources:
        for table, rule in ((self.limits, _GPU_LIMIT_FORMAT), (self.requests, _GPU_REQUEST_FORMAT)):
            if table and GPU_RESOURCE in table and gpu_count(table[GPU_RESOURCE]) is None:
                raise ValueError(rule.message)
        if self.requests and GPU_RESOURCE in self.requests:
            limit = (self.limits or {}).get(GPU_RESOURCE)
            if limit is None or gpu_count(limit) != gpu_count(self.requests[GPU_RESOURCE]):
                raise ValueError(_GPU_REQUEST_NEEDS_LIMIT.message)
        return self


# ---- pod template ---------------------------------------------------------------------------


class VolumeMount(_Open):
    """A volume mounted into the container, as in a Pod."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    """The volume's name in the pod's volumes."""
    mount_path: Annotated[str, Field(min_length=1, max_length=MAX_PATH_LENGTH)]
    """Where the volume appears in the container."""


class Container(_Open):
    """The fields of a container we read; the rest of the container passes through."""

    name: Annotated[str, Field(min_length=1, max_length=63)]
    """The container's name, unique in the pod."""
    image: Annotated[str, Field(min_length=1, max_length=4096)]
    """The container image."""
    command: Annotated[
        list[Annotated[str, Field(max_length=65536)]], Field(min_length=1, max_length=4096)
    ]
    """The training program, e.g. [python, train.py]; in the trainer torchrun runs it. Required.
    A trainer command that starts with torchrun, python -m torch.distributed.run or python -m
    torch.distributed.launch is unwrapped: the script runs under the operator's torchrun, and
    flags that set what the spec sets are refused (docs/migrating.md)."""
    args: list[str] | None = None
    """Arguments appended to command."""
    resources: Resources | None = None
    """Compute resources; the trainer's nvidia.com/gpu limit can set nprocPerNode."""
    volume_mounts: Annotated[list[VolumeMount], Field(max_length=MAX_VOLUME_MOUNTS)] | None = None
    """Volumes mounted into the container; the trainer may not use the operator's paths."""


_RESERVED_VOLUME = Rule(
    f"!self.name.startsWith('{RESERVED_VOLUME_PREFIX}')",
    f'volume names starting with "{RESERVED_VOLUME_PREFIX}" are reserved for the '
    "operator's own volumes",
    ".name",
)


class Volume(_Open):
    """A volume of the pod, as in a Pod; only its name is checked here."""

    RULES = (_RESERVED_VOLUME,)

    name: Annotated[str, Field(min_length=1, max_length=63)]
    """The volume's name, unique in the pod; names starting with "torchrun-" are reserved."""

    @model_validator(mode="after")
    def _check_name(self) -> Volume:
        if self.name.startswith(RESERVED_VOLUME_PREFIX):
            raise ValueError(_RESERVED_VOLUME.message)
        return self


def _reserved_path(path: str) -> bool:
    return any(path == p or path.startswith(p + "/") for p in RESERVED_MOUNT_PATHS)


_RESERVED_PATHS_CEL = "[" + ", ".join(f"'{p}'" for p in RESERVED_MOUNT_PATHS) + "]"
_RESERVED_MOUNT = Rule(
    # An empty list is minItems' to report; containers[0] of it would be a CEL error. A job
    # with a runtime may give no containers (they come from the runtime).
    "!has(self.containers) || size(self.containers) == 0 || "
    "!has(self.containers[0].volumeMounts) || "
    "self.containers[0].volumeMounts.all(m, "
    f"!{_RESERVED_PATHS_CEL}.exists(p, m.mountPath == p || m.mountPath.startsWith(p + '/')))",
    "the trainer (first container) may not mount anything at or under "
    f"{', '.join(RESERVED_MOUNT_PATHS)}: the operator puts its launcher, its state and the "
    "termination message there",
    ".containers",
)


# A launcher in the trainer's command (api/launchcmd.py) must not set what the operator owns.
# The model parses the whole command as torchrun does; CEL cannot (which flags take a value
# decides where the script starts, and the script's own arguments may reuse the names), so
# this rule checks only the first few tokens after the launcher while every one before them
# starts with "-": flags written as --flag=value, the common way. Each token is an index into
# command + args, so the rule costs the same whatever their length.
_CEL_LAUNCHER_TOKENS = 4
_CMD, _ARGS = "self.containers[0].command", "self.containers[0].args"


def _cel_token(j: int) -> str:
    """CEL: token j of the trainer's command + args, '' past their end."""
    return (
        f"(size({_CMD}) > {j} ? {_CMD}[{j}] : (has({_ARGS}) && size({_ARGS}) > {j} - "
        f"size({_CMD}) ? {_ARGS}[{j} - size({_CMD})] : ''))"
    )


def _cel_owned_flag_after(start: int) -> str:
    owned = "[" + ", ".join(f"'{p}'" for p in launchcmd.OWNED_FLAG_PREFIXES) + "]"
    terms = []
    for i in range(_CEL_LAUNCHER_TOKENS):
        before = [f"{_cel_token(start + j)}.startsWith('-')" for j in range(i)]
        owned_here = f"{owned}.exists(p, {_cel_token(start + i)}.startsWith(p))"
        terms.append("(" + " && ".join([*before, owned_here]) + ")")
    return "(" + " || ".join(terms) + ")"


# No trainer command to check: a job with a runtime may leave it to the runtime.
_NO_COMMAND = (
    f"!has(self.containers) || size(self.containers) == 0 || !has({_CMD}) || size({_CMD}) == 0"
)
_CEL_PYTHON = (
    f"({_CMD}[0] in ['python', 'python3'] || {_CMD}[0].endsWith('/python') || "
    f"{_CMD}[0].endsWith('/python3'))"
)
_LAUNCHER_OWNED_FLAGS = Rule(
    f"{_NO_COMMAND} || !("
    f"(({_CMD}[0] == 'torchrun' || {_CMD}[0].endsWith('/torchrun')) && "
    f"{_cel_owned_flag_after(1)}) || "
    f"({_CEL_PYTHON} && {_cel_token(1)} == '-m' && "
    f"{_cel_token(2)} in ['torch.distributed.run', 'torch.distributed.launch'] && "
    f"{_cel_owned_flag_after(3)}))",
    "the trainer's command starts with torchrun (or python -m torch.distributed.run or "
    "launch), which the operator runs itself, and gives it a flag the operator sets: remove "
    "--nnodes, --rdzv-*, --standalone, --max-restarts, --node-rank, --master-addr, "
    "--master-port and --local-addr; spec.nodes, spec.elastic, spec.rendezvous and "
    "spec.torchrun.maxRestarts say these (docs/migrating.md)",
    ".containers",
)


def _cel_flag_as_value_after(start: int) -> str:
    """CEL: among the first tokens after the launcher (all flags so far), one gives a flag a
    value starting with "--": attached (`--role=--nnodes=9`, `-r=--nnodes=3`, `-r--x`) or as
    the next token (`--role --log-dir=x`). The model refuses every value starting with "-"
    but a negative number; CEL, with startsWith of constants only (a regex over an argument
    is over the cost budget), the "--" ones, which no number is."""
    names = launchcmd.VALUE_FLAGS
    attached = [f"'{n}=--'" for n in names] + [f"'{n}--'" for n in names if not n.startswith("--")]
    listed = "[" + ", ".join(f"'{n}'" for n in names) + "]"
    terms = []
    for i in range(_CEL_LAUNCHER_TOKENS):
        here, after = _cel_token(start + i), _cel_token(start + i + 1)
        before = [f"{_cel_token(start + j)}.startsWith('-')" for j in range(i)]
        bad = (
            f"([{', '.join(attached)}].exists(p, {here}.startsWith(p)) || "
            f"({here} in {listed} && {after}.startsWith('--')))"
        )
        terms.append("(" + " && ".join([*before, bad]) + ")")
    return "(" + " || ".join(terms) + ")"


_LAUNCHER_FLAG_AS_VALUE = Rule(
    f"{_NO_COMMAND} || !("
    f"(({_CMD}[0] == 'torchrun' || {_CMD}[0].endsWith('/torchrun')) && "
    f"{_cel_flag_as_value_after(1)}) || "
    f"({_CEL_PYTHON} && {_cel_token(1)} == '-m' && "
    f"{_cel_token(2)} in ['torch.distributed.run', 'torch.distributed.launch'] && "
    f"{_cel_flag_as_value_after(3)}))",
    "the trainer's command starts with torchrun (or python -m torch.distributed.run or "
    "launch) and gives one of its flags a value that looks like a flag (as --role=--nnodes=9, "
    "-r=--nnodes=3 or --role --log-dir=x do): torchrun would read it as one; give the flag a "
    "value that does not start with '-', or remove it",
    ".containers",
)


class PodSpec(_Open):
    """The pods' spec, as in a Pod; the operator adds torchrun to the first container."""

    RULES = (_RESERVED_MOUNT, _LAUNCHER_OWNED_FLAGS, _LAUNCHER_FLAG_AS_VALUE)

    containers: Annotated[list[Container], Field(min_length=1, max_length=MAX_CONTAINERS)]
    """The first container is the trainer; torchrun runs in it."""
    volumes: Annotated[list[Volume], Field(max_length=MAX_VOLUMES)] | None = None
    """The pod's volumes; the operator adds its own, named "torchrun-*"."""

    @model_validator(mode="after")
    def _check_trainer_mounts(self) -> PodSpec:
        mounts = self.containers[0].volume_mounts or []
        if any(_reserved_path(m.mount_path) for m in mounts):
            raise ValueError(_RESERVED_MOUNT.message)
        return self


class PodTemplateSpec(_Open):
    """The pod every node runs, as in a Deployment's template."""

    metadata: dict[str, Any] | None = None
    """Labels and annotations copied onto every pod."""
    spec: PodSpec
    """The pod's spec."""


# ---- the job's spec -------------------------------------------------------------------------


class Elastic(_Wire):
    """Elastic bounds handed to torchrun as `--nnodes MIN:MAX`.

    `spec.nodes` is how many pods the operator runs; it must lie within [minNodes, maxNodes]
    (maxNodes defaults to `nodes`). With minNodes < maxNodes a lost pod (other than pod 0,
    which hosts the rendezvous store) is replaced alone while at least minNodes pods still
    run; below minNodes the whole gang restarts.
    """

    min_nodes: Annotated[int, Field(ge=1, le=MAX_NODES)]
    """Fewest pods training goes on with."""
    max_nodes: Annotated[int, Field(ge=1, le=MAX_NODES)] | None = None
    """Most pods; unset: nodes. Set it to change nodes without suspending the job."""


_STATUS_PORT_RESERVED = Rule(
    f"!has(self.port) || self.port != {contract.STATUS_PORT}",
    f"rendezvous.port {contract.STATUS_PORT} is the launcher's status port in every training pod "
    "(docs/pod-contract.md); choose another",
    ".port",
)


class Rendezvous(_Wire):
    """torchrun's c10d rendezvous, hosted by pod 0."""

    RULES = (_STATUS_PORT_RESERVED,)

    port: Annotated[int, Field(ge=1, le=65535)] = 29400
    """The c10d store's TCP port on pod 0 (not 29401, the launcher's status port)."""
    join_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] = 600
    """How long a pod waits for the others to join (torchrun's join_timeout)."""
    dns_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] = 300
    """How long a pod waits for pod 0's host name to resolve before starting torchrun."""

    @model_validator(mode="after")
    def _check_port(self) -> Rendezvous:
        if self.port == contract.STATUS_PORT:
            raise ValueError(_STATUS_PORT_RESERVED.message)
        return self


class Torchrun(_Wire):
    """Options of the torchrun in every pod."""

    max_restarts: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = 0
    """torchrun's in-pod worker restarts (--max-restarts), before the pod fails."""
    local_rank_arg: Literal["--local-rank", "--local_rank"] | None = None
    """Pass each worker's script its local rank as an argument, --local-rank=<N> (or
    --local_rank=<N>, as torch before 2.0 spelled it), right after the script, as
    torch.distributed.launch did: for launch-era scripts whose argparse requires it. Unset: no
    such argument, unless the trainer's command is python -m torch.distributed.launch without
    --use-env, which implies --local-rank. Every worker has the LOCAL_RANK environment
    variable either way, which scripts may read instead. See docs/migrating.md."""


class FailurePolicy(_Wire):
    """Gang restarts: every pod of the attempt is replaced, with back-off between attempts."""

    max_restarts: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = 3
    """Gang restarts (and elastic replacements) before the job fails."""
    backoff_seconds: Annotated[int, Field(ge=0, le=MAX_TIMEOUT_SECONDS)] = 10
    """Wait before the first restart; it doubles with each restart after."""
    max_backoff_seconds: Annotated[int, Field(ge=0, le=MAX_TIMEOUT_SECONDS)] = 300
    """The longest wait between restarts."""
    retryable_exit_codes: Annotated[
        list[Annotated[int, Field(ge=-255, le=255)]], Field(max_length=256)
    ] = Field(default_factory=list)
    """Exit codes of the training program that count as infrastructure failures (restarted);
    any other failure of the program fails the job."""
    crash_loop_detection: bool = True
    """Fail the job (reason CrashLoopNoProgress) instead of restarting it when an attempt fails
    with the same root cause as the attempt before it (exception type and message with numbers
    and addresses masked, whatever the rank; for a hang, where it hangs) and made no progress:
    it failed at that attempt's last step, or no further and without getting past the step it
    started at ($TORCHRUN_OPERATOR_PROGRESS_FILE, docs/progress.md). Restarts that made
    progress go on as before."""


class RunPolicy(_Wire):
    """When the job runs, and what is kept once it finished."""

    active_deadline_seconds: Annotated[int, Field(ge=1, le=MAX_DURATION_SECONDS)] | None = None
    """Fail the job (DeadlineExceeded) this long after it started; a resume starts it anew."""
    ttl_seconds_after_finished: Annotated[int, Field(ge=0, le=MAX_DURATION_SECONDS)] | None = None
    """Delete the job this long after it finished; unset: keep it."""
    clean_pod_policy: Literal["KeepFailed", "KeepAll", "Delete"] = "KeepFailed"
    """Which pods stay once the job finished: failed ones, all, or none."""
    suspend: bool = False
    """Delete the pods and wait; false again starts a fresh attempt. While suspended, or in
    the write that suspends or resumes, nodes, nprocPerNode, elastic, template and
    rendezvous may change (as Kueue does)."""
    progress_timeout_seconds: Annotated[int, Field(ge=1, le=MAX_TIMEOUT_SECONDS)] | None = None
    """Opt-in hang detection: when the step counter a training script writes to
    $TORCHRUN_OPERATOR_PROGRESS_FILE stays unchanged this long after rendezvous, the pod turns
    NotReady and the attempt fails with reason ProgressStalled (infrastructure: a gang restart
    within failurePolicy.maxRestarts). See docs/progress.md."""


class Straggler(_Wire):
    """Thresholds of the Straggler condition (docs/progress.md)."""

    factor: Annotated[float, Field(ge=1.1, le=100)] = 2.0
    """A pod is a straggler while its mean step time over the window exceeds this many times
    the median of the job's pods."""
    window_seconds: Annotated[int, Field(ge=5, le=MAX_TIMEOUT_SECONDS)] = 60
    """The window the launcher averages each pod's step time over; a pod is judged only once
    it has reported steps for this long."""


class Monitoring(_Wire):
    """Opt-in judgements on the live progress the launchers report (docs/progress.md)."""

    straggler: Straggler | None = None
    """Set (e.g. {}) to get a Straggler condition naming the pods, node ranks and global ranks
    whose step time stays above factor times the median. Unset: no such condition."""


# A checkpoint path a script reports is shown in the status and handed to the next attempt's
# pods in an environment variable: bounded like any path (docs/progress.md, "Checkpoints").
MAX_CHECKPOINT_PATH = 1024

_CHECKPOINT_ONE_SOURCE = Rule(
    "has(self.claimName) != has(self.volume)",
    "checkpoint: give exactly one of claimName (a PersistentVolumeClaim) or volume (a volume "
    "source, as in a Pod: nfs, hostPath, csi, ...)",
)
_CHECKPOINT_MOUNT_RESERVED = Rule(
    f"!{_RESERVED_PATHS_CEL}.exists(p, self.mountPath == p || self.mountPath.startsWith(p + '/'))",
    "checkpoint.mountPath may not be at or under "
    f"{', '.join(RESERVED_MOUNT_PATHS)}: the operator puts its launcher, its state and the "
    "termination message there",
    ".mountPath",
)


class Checkpoint(_Wire):
    """Storage for checkpoints, mounted at the same path in every pod of every attempt
    (docs/progress.md, "Checkpoints"). The trainer gets TORCHRUN_OPERATOR_CHECKPOINT_DIR (the
    mount path) and, once a script reported a checkpoint, TORCHRUN_OPERATOR_RESUME_FROM."""

    RULES = (_CHECKPOINT_ONE_SOURCE, _CHECKPOINT_MOUNT_RESERVED)

    claim_name: Annotated[str, Field(min_length=1, max_length=253)] | None = None
    """A PersistentVolumeClaim every pod mounts (ReadWriteMany for pods on several nodes)."""
    volume: dict[str, Any] | None = None
    """Or a volume source, as in a Pod's volumes without the name (e.g. {nfs: {server: s,
    path: /ckpt}}); it must be the same storage on every node."""
    mount_path: Annotated[str, Field(min_length=1, max_length=MAX_PATH_LENGTH)] = "/checkpoints"
    """Where the trainer sees it: TORCHRUN_OPERATOR_CHECKPOINT_DIR."""

    @model_validator(mode="after")
    def _check(self) -> Checkpoint:
        if (self.claim_name is None) == (self.volume is None):
            raise ValueError(_CHECKPOINT_ONE_SOURCE.message)
        if _reserved_path(self.mount_path):
            raise ValueError(_CHECKPOINT_MOUNT_RESERVED.message)
        return self


class NetworkPolicy(_Wire):
    """The per-job NetworkPolicy that admits the job's pods only from the job's own pods (and
    the launcher's status port from the operator)."""

    enabled: bool | None = None
    """Render a NetworkPolicy for this job. Unset: the operator's default (--network-policy, on
    unless the chart turns it off)."""


ProcsPerNode = Annotated[int, Field(ge=1, le=MAX_PROCS_PER_NODE)] | Literal["gpu"]

_TRAINER = "self.template.spec.containers[0]"
_NPROC_IN_RANGE = Rule(
    "!has(self.nprocPerNode) || (type(self.nprocPerNode) == int ? "
    f"(self.nprocPerNode >= 1 && self.nprocPerNode <= {MAX_PROCS_PER_NODE}) : "
    "self.nprocPerNode == 'gpu')",
    f'nprocPerNode must be an integer from 1 to {MAX_PROCS_PER_NODE}, or "gpu"',
    ".nprocPerNode",
)
_ELASTIC_BOUNDS = Rule(
    "!has(self.elastic) || (self.elastic.minNodes <= self.nodes && "
    "(!has(self.elastic.maxNodes) || self.nodes <= self.elastic.maxNodes))",
    "elastic: need minNodes <= nodes <= maxNodes",
    ".elastic",
)
_GPU_PROCS_NEED_LIMIT = Rule(
    # With a runtime the trainer's limit may come from it: the merged spec is checked then.
    "has(self.runtimeRef) || !has(self.template) || !has(self.template.spec) || "
    "!has(self.template.spec.containers) || size(self.template.spec.containers) == 0 || "
    "!has(self.nprocPerNode) || type(self.nprocPerNode) != string || "
    "self.nprocPerNode != 'gpu' || "
    f"(has({_TRAINER}.resources) && has({_TRAINER}.resources.limits) && "
    f"'{GPU_RESOURCE}' in {_TRAINER}.resources.limits && "
    f"{_TRAINER}.resources.limits['{GPU_RESOURCE}'] != 0 && "
    f"{_TRAINER}.resources.limits['{GPU_RESOURCE}'] != '0')",
    f'nprocPerNode "gpu" needs a {GPU_RESOURCE} limit of at least 1 on the first container '
    "(the trainer)",
    ".nprocPerNode",
)

# Transition rules. A running attempt's pods were rendered from the spec as it was: their
# torchrun arguments, pod template and rendezvous cannot follow a change. So these change only
# while the job is suspended, which means: suspended before the write or after it, because
# a queue such as Kueue changes the template in the very write that resumes a job (admission:
# node selectors, tolerations) or that suspends it (preemption: restoring the template).
# Either way no pod runs the old spec afterwards: a suspended job's pods are deleted, and a
# resumed one starts a fresh attempt from the new spec.
_SUSPENDED = "self.runPolicy.suspend || oldSelf.runPolicy.suspend"


def _unchanged(field: str) -> str:
    """CEL: the optional field `field` is as it was (both unset, or equal)."""
    return (
        f"has(self.{field}) == has(oldSelf.{field}) && "
        f"(!has(self.{field}) || self.{field} == oldSelf.{field})"
    )


def _frozen_unless_suspended(field: str, condition: str) -> Rule:
    return Rule(
        f"{_SUSPENDED} || {condition}",
        f"{field} cannot change while the job runs: suspend it first (runPolicy.suspend), "
        "or change it in the same write that suspends or resumes it",
        f".{field}",
    )


_NODES_FROZEN = Rule(
    f"{_SUSPENDED} || self.nodes == oldSelf.nodes || "
    "(has(self.elastic) && has(self.elastic.maxNodes))",
    "nodes cannot change while the job runs, except within elastic.minNodes..maxNodes of "
    "an elastic job that sets maxNodes: suspend it first (runPolicy.suspend)",
    ".nodes",
)
_TRANSITIONS = (
    _NODES_FROZEN,
    _frozen_unless_suspended("elastic", _unchanged("elastic")),
    _frozen_unless_suspended("nprocPerNode", _unchanged("nprocPerNode")),
    # Unset is possible for these three: a job with a runtime may leave them to it.
    _frozen_unless_suspended("template", _unchanged("template")),
    _frozen_unless_suspended("rendezvous", _unchanged("rendezvous")),
    _frozen_unless_suspended("scheduling", _unchanged("scheduling")),
    Rule(
        _unchanged("runtimeRef"),
        "runtimeRef cannot change: the job resolved its runtime once (docs/runtimes.md)",
        ".runtimeRef",
    ),
)
# A job without a runtime gives its whole pod template; with one, what it gives is merged onto
# the runtime's (docs/runtimes.md). The CRD leaves template, containers, image and command
# optional for that (api/crd.py); this rule asks for them back on a job without a runtime. In
# Python the model requires them of every spec: the reconciler sees only merged specs.
_TEMPLATE_UNLESS_RUNTIME = Rule(
    "has(self.runtimeRef) || (has(self.template) && has(self.template.spec) && "
    "has(self.template.spec.containers) && "
    "self.template.spec.containers.all(c, has(c.image) && has(c.command)))",
    "a job without runtimeRef needs template.spec.containers, each with an image and a command",
    ".template",
)
RUNTIME_KINDS = ("ClusterDistributedTrainingRuntime", "DistributedTrainingRuntime")


class RuntimeRef(_Wire):
    """The training runtime a job's spec is merged onto (docs/runtimes.md)."""

    kind: Literal["ClusterDistributedTrainingRuntime", "DistributedTrainingRuntime"] = (
        "ClusterDistributedTrainingRuntime"
    )
    """ClusterDistributedTrainingRuntime (cluster-wide, the default) or
    DistributedTrainingRuntime (in the job's namespace)."""
    name: Annotated[
        str,
        Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"),
    ]
    """The runtime's name."""


class JobSpec(_Wire):
    """A distributed PyTorch training job: `nodes` pods run torchrun against a c10d rendezvous."""

    RULES = (
        _ELASTIC_BOUNDS,
        _NPROC_IN_RANGE,
        _GPU_PROCS_NEED_LIMIT,
        _TEMPLATE_UNLESS_RUNTIME,
        *_TRANSITIONS,
    )

    nodes: Annotated[int, Field(ge=1, le=MAX_NODES)]
    """Pods (one per node) the operator runs; with elastic, within its bounds."""
    elastic: Elastic | None = None
    """Elastic training: torchrun goes on with fewer pods than nodes. Unset: a fixed gang."""
    nproc_per_node: ProcsPerNode | None = None
    """Worker processes per pod: an integer, or "gpu" for the trainer's nvidia.com/gpu limit.
    Unset: that GPU limit if the trainer has one of at least 1, else 1."""
    template: PodTemplateSpec
    """The pod every node runs; its first container is the trainer."""
    rendezvous: Rendezvous = Rendezvous()
    """torchrun's c10d rendezvous."""
    torchrun: Torchrun = Torchrun()
    """Options of torchrun itself."""
    success_policy: Literal["AllRanks", "RankZero"] = "AllRanks"
    """When the job succeeded: every pod exited 0, or the pod holding global rank 0 did."""
    failure_policy: FailurePolicy = FailurePolicy()
    """Gang restarts after a failure."""
    run_policy: RunPolicy = RunPolicy()
    """Deadline, suspension, clean-up and hang detection."""
    network_policy: NetworkPolicy = NetworkPolicy()
    """The job's NetworkPolicy."""
    monitoring: Monitoring = Monitoring()
    """Conditions derived from live training progress (Straggler)."""
    scheduling: Scheduling = Scheduling()
    """Gang scheduling (all pods of an attempt or none) and topology placement
    (docs/scheduling.md)."""
    runtime_ref: RuntimeRef | None = None
    """A training runtime this spec is merged onto when the job starts: the runtime gives the
    pod template and defaults for nprocPerNode, torchrun, rendezvous, failurePolicy and
    scheduling; the job gives what differs (docs/runtimes.md). Then template, and the image
    and command of its containers, may be left out. It cannot change, and editing the runtime
    later changes nothing in the job (status.runtime records what it resolved to)."""
    checkpoint: Checkpoint | None = None
    """Shared checkpoint storage and the resume contract (docs/progress.md, "Checkpoints").
    Unset: none. Changed while pods run, it starts the next attempt (restart reason
    SpecChanged), as the template does."""

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        if self.elastic is not None:
            hi = self.elastic.max_nodes if self.elastic.max_nodes is not None else self.nodes
            if not self.elastic.min_nodes <= self.nodes <= hi:
                raise ValueError(_ELASTIC_BOUNDS.message)
        if self.nproc_per_node == "gpu" and not trainer_gpu_limit(self):
            raise ValueError(_GPU_PROCS_NEED_LIMIT.message)
        # A launcher in the trainer's command: its flags must not set what the spec sets.
        # This is _LAUNCHER_OWNED_FLAGS, and more than CEL can check.
        gpus = trainer_gpu_limit(self)
        nproc = self.nproc_per_node if isinstance(self.nproc_per_node, int) else (gpus or 1)
        problem = launchcmd.check([*self.trainer.command, *(self.trainer.args or [])], nproc, gpus)
        if problem is not None:
            raise ValueError(problem)
        return self

    @property
    def trainer(self) -> Container:
        return self.template.spec.containers[0]

    @property
    def min_nodes(self) -> int:
        return self.elastic.min_nodes if self.elastic else self.nodes

    @property
    def max_nodes(self) -> int:
        if self.elastic and self.elastic.max_nodes is not None:
            return self.elastic.max_nodes
        return self.nodes

    @property
    def is_elastic(self) -> bool:
        return self.elastic is not None and self.min_nodes < self.max_nodes


def trainer_gpu_limit(spec: JobSpec) -> int | None:
    """The trainer's nvidia.com/gpu limit, None when absent. A GPU request always has an equal
    limit (validated), so the limit is the whole story."""
    res = spec.trainer.resources
    if res is None or not res.limits or GPU_RESOURCE not in res.limits:
        return None
    return gpu_count(res.limits[GPU_RESOURCE])


# ---- status ---------------------------------------------------------------------------------


class Condition(_Wire):
    """A condition with Kubernetes semantics: lastTransitionTime moves only when status flips."""

    type: str
    """Created, Scheduled, RendezvousDone, Running, Restarting, Suspended, Blocked, Straggler,
    Admitted (jobs queued through Kueue), RuntimeResolved (jobs naming a runtime), Succeeded
    or Failed."""
    status: Literal["True", "False", "Unknown"]
    """Whether the condition holds."""
    reason: str | None = None
    """Why, in one CamelCase word."""
    message: str | None = None
    """Why, for people."""
    last_transition_time: str | None = None
    """When status last flipped (RFC 3339)."""


class NodeCounts(_Wire):
    """The current attempt's pods, counted."""

    desired: int = 0
    """Pods the attempt runs: spec.nodes."""
    scheduled: int = 0
    """Pods bound to a node."""
    running: int = 0
    """Pods running and not terminating."""
    ready: int = 0
    """Pods ready: their node joined the rendezvous and trains."""
    succeeded: int = 0
    """Pods that exited 0."""
    failed: int = 0
    """Pods that failed or were lost."""
    summary: str | None = None
    """Ready pods / desired pods, e.g. "3/4", for kubectl get."""


class RankStatus(_Wire):
    """One pod of the current attempt, by its index. Null fields are left out to keep the
    status small."""

    index: int
    """The pod's index in the job, 0..nodes-1: its hostname is <job>-<index> and its label
    torchrun.dev/index. Fixed when the pod is created; not torchrun's node rank."""
    pod: str | None = None
    """The pod's name."""
    node: str | None = None
    """The Kubernetes node the pod runs on."""
    node_rank: int | None = None
    """torchrun's node rank (GROUP_RANK) of the pod in its latest rendezvous round, as its
    launcher reports it: live while the pod runs, then in its final report. c10d orders nodes
    by address, so it need not equal index."""
    global_ranks: str | None = None
    """The pod's global ranks, compact, e.g. "0-7"; reported by the launcher."""
    round: int | None = None
    """The c10d rendezvous round nodeRank and globalRanks come from (0 first; torchrun's in-pod
    restarts and elastic membership changes start new rounds)."""
    phase: str | None = None
    """The pod's phase; Creating before it exists, Terminating while it is deleted."""
    ready: bool | None = None
    """Whether the pod is ready (its node joined the rendezvous)."""
    restarts: int | None = None
    """torchrun's in-pod worker restarts so far."""
    exit_code: int | None = None
    """The trainer's exit code once it ended."""
    reason: str | None = None
    """Why the pod is not running or succeeded, in one word."""
    message: str | None = None
    """The pod's first error, truncated."""
    started_at: str | None = None
    """When the trainer started (RFC 3339)."""
    finished_at: str | None = None
    """When the trainer ended (RFC 3339)."""
    failure_observed_at: str | None = None
    """When the operator first saw this pod fail, by its own clock. Times the pod's node
    reports are clamped to a few seconds before this, so a node clock that is off cannot
    change the root cause or when the failure is handled."""
    running_observed_at: str | None = None
    """When the operator first saw this pod Running, by its own clock. The rendezvous hang
    timer and a stuck launcher's join timeout count from it, and a pod first seen Running
    after the rendezvous completed (an elastic replacement) is not judged by progress: a
    node clock that is off changes neither (docs/progress.md)."""
    not_ready_observed_at: str | None = None
    """While the pod is Running and not Ready: when the operator first saw it so since it was
    last Ready, by its own clock. runPolicy.progressTimeoutSeconds stalls count from it."""
    step: int | None = None
    """The last training step the pod's script wrote to $TORCHRUN_OPERATOR_PROGRESS_FILE."""
    steps_per_second: float | None = None
    """Steps per second over the launcher's window (docs/progress.md)."""
    step_seconds: float | None = None
    """Mean seconds per step over the window: the script's own stepTime when it reports one,
    else the time between steps. The Straggler condition compares it across pods."""
    last_step_at: str | None = None
    """When the step last changed (RFC 3339, the pod's clock)."""


class Failure(_Wire):
    """The root cause of the latest failure: the first error across all nodes."""

    rank: int | None = None
    """The global rank that failed first, if known."""
    index: int | None = None
    """The index of the pod it ran in (status.ranks[].index)."""
    node_rank: int | None = None
    """torchrun's node rank of that pod, if known."""
    pod: str | None = None
    """That pod's name."""
    node: str | None = None
    """The Kubernetes node the pod ran on."""
    exit_code: int | None = None
    """The exit code, if the process exited."""
    kind: str | None = None
    """What failed (docs/failures.md): what the error says, cuda-oom, gpu-device,
    nccl-timeout, gloo-timeout or nccl-comm, else how the rank or pod ended: exception,
    signal, comm, exit, rendezvous, launcher, oom (the kernel's OOM killer), evicted, lost or
    stalled."""
    reason: str | None = None
    """The reason, in one word."""
    message: str | None = None
    """The error, truncated (e.g. the exception and its message)."""
    at: str | None = None
    """When it happened (RFC 3339)."""
    step: int | None = None
    """The last step the attempt reached (the highest any pod reported), if reported."""
    location: str | None = None
    """For a hang: where the rank that is not inside a collective is (file:line in function,
    its innermost frame); the full stacks are in the pod's log."""


class AvoidedNode(_Wire):
    """A node the job's next pods keep off (required node affinity), after a failure that was
    the node's (docs/failures.md)."""

    node: str
    """The node's name."""
    reason: str
    """Why, in one word (GPUDeviceError, NodeLost, DeletionByTaintManager, Evicted...)."""
    since: str
    """When the operator decided it (RFC 3339)."""
    until: str
    """Until when (RFC 3339); later pods may run there again."""
    kind: str | None = None
    """The failure's kind (status.failure.kind)."""
    index: int | None = None
    """The index of the pod that failed there."""


class RestartRecord(_Wire):
    """One restart, resume or elastic replacement."""

    attempt: int
    """The attempt that started with it."""
    at: str
    """When (RFC 3339)."""
    reason: str | None = None
    """Why, in one word."""
    rank: int | None = None
    """The global rank whose failure caused it, if known."""
    index: int | None = None
    """The index of the pod that failed, if any."""
    node_rank: int | None = None
    """torchrun's node rank of the pod that failed, if known."""
    kind: RestartKind | None = None
    """What caused it: the program (user), the pods or nodes (infrastructure), a resume or a
    spec changed under the running attempt (suspend), or an elastic pod replacement."""
    step: int | None = None
    """The last step the failed attempt reached (the highest any pod reported), if reported."""
    signature: str | None = None
    """The failure's root cause with rank, numbers and addresses masked (a hang: the rank
    outside any collective and its frame, else the pod index and node that went quiet first):
    two attempts that failed alike have equal signatures (failurePolicy.crashLoopDetection)."""


class LastCheckpoint(_Wire):
    """The latest checkpoint a pod's script reported through its progress file."""

    step: int
    """The training step the checkpoint holds."""
    path: str
    """Where the script saved it (as the script wrote it, at most 1024 characters); the next
    attempt's pods get it in TORCHRUN_OPERATOR_RESUME_FROM."""
    time: str | None = None
    """When the operator first saw it (RFC 3339)."""


class JobProgress(_Wire):
    """The job's training progress, from its pods' progress files (docs/progress.md)."""

    step: int
    """The lowest last step of the pods that report one: every pod got at least this far."""
    total_steps: int | None = None
    """The step count the script declared (a second number in the progress file)."""
    steps_per_second: float | None = None
    """The median of the pods' steps per second."""
    eta: str | None = None
    """When training reaches totalSteps at that rate (RFC 3339)."""
    start_step: int | None = None
    """The first step the operator saw of this attempt (the lowest any pod reported then):
    where it resumed, give or take a read. Crash-loop detection judges the attempt's
    progress from it (docs/progress.md)."""


class Counters(_Wire):
    """Failures and recoveries over the job's life."""

    user_failures: int = 0
    """Failures of the training program (not restarted)."""
    infrastructure_failures: int = 0
    """Failures of pods or nodes, and retryable exit codes."""
    restarts: int = 0
    """Recoveries spent from failurePolicy.maxRestarts."""


class RuntimeStatus(_Wire):
    """The runtime the job resolved when it started (spec.runtimeRef), recorded before any of
    its pods was created. The job's pods, and those of every later attempt, are rendered from
    spec merged onto this record's spec, never from the runtime as it is now."""

    kind: str
    """ClusterDistributedTrainingRuntime or DistributedTrainingRuntime."""
    name: str
    """The runtime's name."""
    uid: str | None = None
    """The runtime object's uid when it was resolved."""
    resource_version: str | None = None
    """Its resourceVersion when it was resolved."""
    spec_hash: str | None = None
    """A hash (sha256, hex, first 16 digits) of the merged spec when it was resolved."""
    spec: dict[str, Any]
    """The runtime's spec as it was resolved: what the job's spec is merged onto."""


class JobStatus(_Wire):
    """What the operator observed; written by the operator only."""

    phase: Phase | None = None
    """Pending, Queued (waiting for Kueue to admit it; the Admitted condition says why),
    Starting, Waiting (pods the scheduler cannot place yet: the Scheduled condition says why),
    Running, Restarting, Succeeded, Failed or Suspended."""
    conditions: list[Condition] | None = None
    """The job's conditions."""
    observed_generation: int | None = None
    """The metadata.generation this status was computed from."""
    attempt: int | None = None
    """The gang attempt, from 0; each gang restart or resume starts the next."""
    attempt_spec_hash: str | None = None
    """A hash of the spec fields the current attempt's pods are rendered from (the template,
    nodes or the elastic bounds, nprocPerNode, rendezvous, torchrun, scheduling and
    checkpoint), recorded when the attempt starts. A spec that hashes otherwise while the
    attempt's pods run starts the next attempt (restart reason SpecChanged): no attempt mixes
    pods of two specs."""
    world_size: int | None = None
    """Ranks when all spec.nodes pods take part: nodes times processes per pod."""
    nodes: NodeCounts | None = None
    """The current attempt's pods, counted."""
    ranks: list[RankStatus] | None = None
    """One entry per pod (index) of the current attempt."""
    progress: JobProgress | None = None
    """Training progress of the current attempt, when the pods report it."""
    failure: Failure | None = None
    """The root cause of the latest failure."""
    avoided_nodes: list[AvoidedNode] | None = None
    """Nodes the job's pods keep off for a while after a failure that was the node's (a GPU
    device error, a lost node, an eviction for node pressure), at most a few, newest last;
    cleared when the job ends (docs/failures.md)."""
    restarts: list[RestartRecord] | None = None
    """The latest restarts, oldest first."""
    counters: Counters | None = None
    """Failures and restarts over the job's life."""
    start_time: str | None = None
    """When the job started pods (RFC 3339); a resume clears it. The deadline counts from it."""
    completion_time: str | None = None
    """When the job succeeded or failed (RFC 3339)."""
    last_restart_time: str | None = None
    """When the latest gang restart was decided (RFC 3339); back-off counts from it."""
    scheduling: SchedulingStatus | None = None
    """The current attempt's gang objects (spec.scheduling.gang); absent without a gang."""
    runtime: RuntimeStatus | None = None
    """The runtime spec.runtimeRef resolved to, recorded once when the job started."""
    last_checkpoint: LastCheckpoint | None = None
    """The latest checkpoint the job's pods reported (the highest step), kept across attempts:
    every restart, replacement and resume starts from it (docs/progress.md)."""
