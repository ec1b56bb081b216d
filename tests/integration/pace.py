"""How long a test gives what it starts to get there, on the machine CI runs the suite on.

A wait for something a user would see keeps a deadline (a test that hangs says nothing), but
one sized from what the test itself starts on a loaded machine, not a constant that held on a
quiet one: `make test` runs three pytest-xdist workers, each with a local cluster of its own,
on two cores, and a load average of 13 has been seen there (issue 52: a per-test limit picked
on a quiet machine failed a test that was only slow). pytest-timeout (pyproject.toml: 600 s a
test) stays the last guard against a hang, above any of these.

Measured on that machine (2 cores, load average about 9 from the other work on it, the test
venv's torch 2.15, resource.getrusage of the children): the launcher with one worker, start to
exit of a job that does one all-reduce, took 7.9 s of CPU; with two workers 14.0 s. So every
torch process the test starts (torchrun's agent in the launcher, and each worker) costs about
5 s of CPU, mostly `import torch`, before it does anything of its own.

A CPU-bound process on a machine with R runnable processes on C cores gets C/R of a core.
The bounds here take R = 18 (13 seen under `make test`, a third more under `TEST_WORKERS=4`,
the README's stress run, rounded up) and let the test's own processes run one at a time: an
upper bound for an honest run, never a guess of its usual time. For scale: the launcher test
that CI's 120 s limit killed (three launches, about 63 s of CPU) took 120.18 s at a load of
13; these bounds give it about 600 s.
"""

from __future__ import annotations

from typing import Any

# The CI machine's cores, and the runnable processes on it at the worst load the suite is run
# under (see above).
CPUS = 2
RUNNABLE = 18
SLOWDOWN = RUNNABLE / CPUS
# CPU seconds a torch process costs from start to exit of a trivial job (measured, see above).
TORCH_PROCESS_CPU_S = 5.0


def cpu(seconds: float) -> float:
    """The wall-clock seconds work of `seconds` of CPU on an idle core takes on the loaded
    machine."""
    return seconds * SLOWDOWN


def torch_processes(n: int) -> float:
    """Seconds for `n` torch processes to start, run a trivial job and exit there."""
    return cpu(n * TORCH_PROCESS_CPU_S)


def launchers(pods: int, nproc: int = 1) -> float:
    """Seconds for `pods` launchers of `nproc` workers each (one pod's, or one node's, torch
    processes: the agent and its workers) to start, rendezvous, run a trivial job and exit.
    `nproc=0`: workers that do not import torch (a shell command, a script of the standard
    library) cost next to nothing beside the launchers."""
    return torch_processes(pods * (1 + nproc))


def attempts(n: int = 1, pods: int = 2, nproc: int = 1) -> float:
    """Seconds for `n` attempts of a job of `pods` pods of `nproc` workers each to run a
    trivial job, one after the other (each attempt's launchers and workers start anew)."""
    return n * launchers(pods, nproc)


# CPU seconds an epoch of examples/scripts/train_ddp.py on 256 samples, two ranks of batch 16
# (8 steps), costs beyond the launch: 3 epochs took 21.2 s of CPU with the launcher and its two
# workers, a trivial job 14.0 s (measured as above).
TRAIN_DDP_EPOCH_CPU_S = 2.4


def train_ddp(epochs: int, step_sleep: float = 0.0) -> float:
    """Seconds train_ddp's `epochs` of 256 samples on two ranks take beyond the launch: their
    CPU, and the `--step-sleep` of each of their 8 steps an epoch."""
    return cpu(epochs * TRAIN_DDP_EPOCH_CPU_S) + epochs * 8 * step_sleep


def job(spec: dict[str, Any], attempts_: int = 1) -> float:
    """`attempts(attempts_, pods, nproc)` of a DistributedTrainingJob's spec: its nodes (an
    elastic job's most) and nprocPerNode ("gpu" or "auto" count as one on these CPU nodes, as
    does one a runtime gives: the tests' runtimes give one)."""
    nodes = spec.get("nodes", 1)
    pods = int(nodes) if isinstance(nodes, int | str) and str(nodes).isdigit() else 1
    pods = max(pods, int((spec.get("elastic") or {}).get("maxNodes") or 0))
    nproc = spec.get("nprocPerNode", 1)
    return attempts(attempts_, pods, nproc if isinstance(nproc, int) else 1)
