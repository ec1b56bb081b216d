"""Kubeconfig files with the credentials embedded, so each file stands alone (CoreDNS, the
controllers and the process node read the same admin file)."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import yaml


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def render_kubeconfig(
    server: str,
    ca_pem: bytes,
    user: str,
    *,
    cert_pem: bytes | None = None,
    key_pem: bytes | None = None,
    token: str | None = None,
    cluster: str = "localkube",
    namespace: str | None = None,
) -> dict[str, Any]:
    if (cert_pem is None) != (key_pem is None):
        raise ValueError("client certificate and key go together")
    if (cert_pem is None) == (token is None):
        raise ValueError("exactly one of a client certificate or a token")
    creds: dict[str, str] = {}
    if cert_pem is not None and key_pem is not None:
        creds = {"client-certificate-data": _b64(cert_pem), "client-key-data": _b64(key_pem)}
    elif token is not None:
        creds = {"token": token}
    context: dict[str, str] = {"cluster": cluster, "user": user}
    if namespace:
        context["namespace"] = namespace
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": cluster,
                "cluster": {"server": server, "certificate-authority-data": _b64(ca_pem)},
            }
        ],
        "users": [{"name": user, "user": creds}],
        "contexts": [{"name": f"{user}@{cluster}", "context": context}],
        "current-context": f"{user}@{cluster}",
        "preferences": {},
    }


def write_kubeconfig(path: Path, config: dict[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
