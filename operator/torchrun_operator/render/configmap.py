"""The ConfigMap that carries the launcher into every training pod."""

from __future__ import annotations

import hashlib
from functools import cache
from importlib import resources
from typing import Any

from ..api import names
from ..launcher import launcher as contract
from .common import child_metadata

LAUNCHER_KEY = contract.LAUNCHER_FILE


@cache
def packaged_launcher() -> str:
    """The launcher this operator ships (operator/torchrun_operator/launcher/launcher.py)."""
    return resources.files("torchrun_operator.launcher").joinpath(LAUNCHER_KEY).read_text()


@cache
def packaged_launcher_digest() -> str:
    return launcher_digest(packaged_launcher())


def launcher_digest(source: str) -> str:
    """sha256 of the launcher's bytes, as the pod checks it before running it."""
    return hashlib.sha256(source.encode()).hexdigest()


def render_launcher_configmap(job: dict[str, Any], launcher_source: str) -> dict[str, Any]:
    """One per job and launcher version, immutable: a job's pods run the launcher the operator
    rendered even when the operator is upgraded mid-run, and nobody can edit it in place."""
    name = names.launcher_configmap_name(job["metadata"]["name"], launcher_digest(launcher_source))
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": child_metadata(job, name),
        "immutable": True,
        "data": {LAUNCHER_KEY: launcher_source},
    }
