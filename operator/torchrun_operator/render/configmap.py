"""The ConfigMap that carries the launcher into every training pod."""

from __future__ import annotations

from typing import Any

from ..api import names
from .common import child_metadata

LAUNCHER_KEY = "launcher.py"


def render_launcher_configmap(job: dict[str, Any], launcher_source: str) -> dict[str, Any]:
    """One per job (not per operator), so a job keeps the launcher it started with even when
    the operator is upgraded mid-run."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(job, names.launcher_configmap_name(job["metadata"]["name"])),
        "data": {LAUNCHER_KEY: launcher_source},
    }
