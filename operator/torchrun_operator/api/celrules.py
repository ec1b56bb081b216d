"""The CEL side of the API's checks: builders of CEL expressions, and the rules that are CEL
only, for the CRD's x-kubernetes-validations (api/crd.py).

Apart from the models because these are string-building code, not the API's shape: the GPU
quantity expressions, the reserved mount paths as a CEL list, the checks on a launcher in the
trainer's command (their Python side is api/launchcmd.py) and the transition rules (they
compare with `oldSelf`; the reconciler never sees the previous spec, so they have no Python
side). The rules that do have a Python check sit beside it in api/template.py and api/spec.py.
"""

from __future__ import annotations

from . import launchcmd
from .bounds import GPU_RESOURCE, GPU_SPELLINGS, MAX_GPUS_PER_POD, RESERVED_MOUNT_PATHS
from .wire import Rule

_GPU_SPELLINGS_CEL = "[" + ", ".join(f"'{n}'" for n in GPU_SPELLINGS) + "]"


def cel_gpu_count_ok(q: str) -> str:
    """CEL for `gpu_count(q) is not None`; q is an int-or-string (dyn) expression."""
    as_int = f"{q} >= 0 && {q} <= {MAX_GPUS_PER_POD}"
    return f"(type({q}) == int ? ({as_int}) : {q} in {_GPU_SPELLINGS_CEL})"


def cel_same_gpu_count(a: str, b: str) -> str:
    """CEL for `gpu_count(a) == gpu_count(b) is not None`, by trying each count: int() of a
    quantity is as costly as a regex (api/bounds.py says why)."""
    counts = "[" + ", ".join(f"[dyn({n}), dyn('{n}')]" for n in GPU_SPELLINGS) + "]"
    return f"{counts}.exists(n, {a} in n && {b} in n)"


def cel_gpu_rule(table: str) -> Rule:
    """The rule that the nvidia.com/gpu entry of resources.<table>, if any, is whole GPUs."""
    entry = f"self.{table}['{GPU_RESOURCE}']"
    return Rule(
        f"!has(self.{table}) || !('{GPU_RESOURCE}' in self.{table}) || {cel_gpu_count_ok(entry)}",
        f"{GPU_RESOURCE} must be a whole number of GPUs from 0 to {MAX_GPUS_PER_POD}, "
        'e.g. 8 or "8" (not "500m", "0.5" or "1e3")',
        f".{table}",
    )


# The reserved mount paths as a CEL list, for the trainer's mounts and the checkpoint's.
RESERVED_PATHS_CEL = "[" + ", ".join(f"'{p}'" for p in RESERVED_MOUNT_PATHS) + "]"

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
LAUNCHER_OWNED_FLAGS = Rule(
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


LAUNCHER_FLAG_AS_VALUE = Rule(
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
    """The rule that `field` keeps `condition` unless the job is or was suspended."""
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
# The job spec's transition rules (in JobSpec.RULES).
JOB_TRANSITIONS = (
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
