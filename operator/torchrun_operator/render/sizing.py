"""How many processes a pod runs and how large the world is."""

from __future__ import annotations

from typing import Any

from ..api.spec import JobSpec, trainer_gpu_limit


def job_spec(job: dict[str, Any] | JobSpec) -> JobSpec:
    """Accept a job object (dict with `spec`) or an already validated spec."""
    if isinstance(job, JobSpec):
        return job
    return JobSpec.model_validate(job.get("spec") or {})


def nproc_per_node(job: dict[str, Any] | JobSpec) -> int:
    """Worker processes per pod, always an integer.

    torchrun's own `gpu`/`auto` would count devices or CPUs the container can see, not what
    the pod asked for, so the operator resolves `gpu` from the trainer's nvidia.com/gpu limit.
    """
    spec = job_spec(job)
    if isinstance(spec.nproc_per_node, int):
        return spec.nproc_per_node
    gpus = trainer_gpu_limit(spec)
    if spec.nproc_per_node == "gpu":
        if not gpus:
            raise ValueError('nprocPerNode "gpu" needs a nvidia.com/gpu limit on the trainer')
        return gpus
    return gpus if gpus else 1


def world_size(job: dict[str, Any] | JobSpec) -> int:
    """Ranks when all `spec.nodes` pods take part."""
    spec = job_spec(job)
    return spec.nodes * nproc_per_node(spec)
