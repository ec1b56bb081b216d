"""Pure rendering: job -> Service, launcher ConfigMap, Pods (plain dicts)."""

from __future__ import annotations

from typing import Any

from .configmap import LAUNCHER_KEY, render_launcher_configmap
from .pod import render_pod, restarts_possible, torchrun_args
from .service import render_service
from .sizing import job_spec, nproc_per_node, world_size


def children(job: dict[str, Any], launcher_source: str) -> list[dict[str, Any]]:
    """The objects a job needs besides its pods; the shell creates them idempotently."""
    return [render_service(job), render_launcher_configmap(job, launcher_source)]


__all__ = [
    "LAUNCHER_KEY",
    "children",
    "job_spec",
    "nproc_per_node",
    "render_launcher_configmap",
    "render_pod",
    "render_service",
    "restarts_possible",
    "torchrun_args",
    "world_size",
]
