"""Pure rendering: job -> Service, launcher ConfigMap, NetworkPolicy, Pods (plain dicts)."""

from __future__ import annotations

from typing import Any

from .configmap import LAUNCHER_KEY, render_launcher_configmap
from .networkpolicy import OperatorPeer, render_network_policy, wants_network_policy
from .pod import render_pod, restarts_possible, torchrun_args
from .service import render_service
from .sizing import job_spec, nproc_per_node, world_size


def children(
    job: dict[str, Any],
    launcher: bytes,
    network_policy_default: bool = True,
    operator: OperatorPeer | None = None,
) -> list[dict[str, Any]]:
    """The objects a job needs besides its pods; the shell creates them idempotently.

    `network_policy_default` is the operator's --network-policy setting, which a job's
    spec.networkPolicy.enabled overrides either way; `operator` (where its pods run) is
    admitted to the launchers' status port."""
    out = [render_service(job), render_launcher_configmap(job, launcher)]
    if wants_network_policy(job, network_policy_default):
        out.append(render_network_policy(job, operator))
    return out


__all__ = [
    "LAUNCHER_KEY",
    "OperatorPeer",
    "children",
    "job_spec",
    "nproc_per_node",
    "render_launcher_configmap",
    "render_network_policy",
    "render_pod",
    "render_service",
    "restarts_possible",
    "torchrun_args",
    "wants_network_policy",
    "world_size",
]
