"""Metadata every child object carries."""

from __future__ import annotations

from typing import Any

from ..api import names


def owner_reference(job: dict[str, Any]) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_metadata(job: dict[str, Any], name: str) -> dict[str, Any]:
    meta = job["metadata"]
    out: dict[str, Any] = {
        "name": name,
        "labels": {names.LABEL_JOB_NAME: meta["name"]},
        "ownerReferences": [owner_reference(job)],
    }
    if meta.get("namespace"):
        out["namespace"] = meta["namespace"]
    return out
