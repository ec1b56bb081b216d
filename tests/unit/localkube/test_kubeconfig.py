"""Kubeconfig rendering: files that kubectl and the Python client accept."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml
from localkube.kubeconfig import render_kubeconfig, write_kubeconfig


def test_client_cert_kubeconfig_embeds_credentials() -> None:
    cfg = render_kubeconfig(
        "https://127.0.0.1:6443", b"CA", "alice", cert_pem=b"CERT", key_pem=b"KEY"
    )
    assert cfg["current-context"] == "alice@localkube"
    (cluster,) = cfg["clusters"]
    assert cluster["cluster"]["server"] == "https://127.0.0.1:6443"
    assert base64.b64decode(cluster["cluster"]["certificate-authority-data"]) == b"CA"
    (user,) = cfg["users"]
    assert user["name"] == "alice"
    assert base64.b64decode(user["user"]["client-certificate-data"]) == b"CERT"
    assert base64.b64decode(user["user"]["client-key-data"]) == b"KEY"
    (ctx,) = cfg["contexts"]
    assert ctx["context"] == {"cluster": "localkube", "user": "alice"}


def test_token_kubeconfig_with_namespace() -> None:
    cfg = render_kubeconfig("https://h:1", b"CA", "sa", token="tok", namespace="ns1")
    assert cfg["users"][0]["user"] == {"token": "tok"}
    assert cfg["contexts"][0]["context"]["namespace"] == "ns1"


@pytest.mark.parametrize(
    "kwargs",
    [
        {},
        {"cert_pem": b"c"},
        {"key_pem": b"k"},
        {"cert_pem": b"c", "key_pem": b"k", "token": "t"},
    ],
)
def test_exactly_one_credential(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        render_kubeconfig("https://h:1", b"CA", "u", **kwargs)  # type: ignore[arg-type]


def test_written_file_is_private_yaml(tmp_path: Path) -> None:
    cfg = render_kubeconfig("https://h:1", b"CA", "u", token="t")
    path = write_kubeconfig(tmp_path / "sub" / "kc", cfg)
    assert path.stat().st_mode & 0o777 == 0o600
    assert yaml.safe_load(path.read_text()) == cfg
