"""Pure env/downward-API resolution of the process node."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from localkube.node.env import (
    ConfigError,
    PodFacts,
    container_argv,
    container_env,
    expand,
    field_value,
)
from localkube.node.volumes import volume_files

POD: dict[str, Any] = {
    "metadata": {
        "name": "p",
        "namespace": "ns",
        "uid": "u-1",
        "labels": {"app": "x"},
        "annotations": {"a/b": "c"},
    },
    "spec": {
        "nodeName": "node-0",
        "serviceAccountName": "sa",
        "containers": [
            {
                "name": "main",
                "resources": {
                    "limits": {"cpu": "1500m", "memory": "1Gi"},
                    "requests": {"cpu": "250m"},
                },
            }
        ],
    },
}
FACTS = PodFacts(
    pod_ip="10.246.1.2", host_ip="10.246.0.1", node_allocatable={"cpu": "8", "memory": "32Gi"}
)
OBJECTS = {
    ("ConfigMap", "ns", "cm"): {"data": {"k": "v", "other": "o"}},
    ("Secret", "ns", "sec"): {"data": {"pw": base64.b64encode(b"s3cret").decode()}},
}


def lookup(kind: str, ns: str, name: str) -> dict[str, Any] | None:
    return OBJECTS.get((kind, ns, name))


@pytest.mark.parametrize(
    ("text", "env", "want"),
    [
        ("$(A)-$(B)", {"A": "1", "B": "2"}, "1-2"),
        ("$(MISSING)", {}, "$(MISSING)"),
        ("$$(A)", {"A": "1"}, "$(A)"),
        ("$(A", {"A": "1"}, "$(A"),
        ("plain $HOME", {"HOME": "/x"}, "plain $HOME"),
    ],
)
def test_expand(text: str, env: dict[str, str], want: str) -> None:
    assert expand(text, env) == want


@pytest.mark.parametrize(
    ("path", "want"),
    [
        ("metadata.name", "p"),
        ("metadata.namespace", "ns"),
        ("metadata.uid", "u-1"),
        ("metadata.labels['app']", "x"),
        ("metadata.annotations['a/b']", "c"),
        ("metadata.labels['nope']", ""),
        ("status.podIP", "10.246.1.2"),
        ("status.hostIP", "10.246.0.1"),
        ("spec.nodeName", "node-0"),
        ("spec.serviceAccountName", "sa"),
        ("metadata.labels", 'app="x"'),
    ],
)
def test_field_refs(path: str, want: str) -> None:
    assert field_value(POD, path, FACTS) == want


def test_unknown_field_ref_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        field_value(POD, "spec.bogus", FACTS)


def env_of(*env: dict[str, Any], env_from: list[dict[str, Any]] | None = None) -> dict[str, str]:
    c = {"name": "main", "env": list(env), "envFrom": env_from or []}
    return container_env(POD, c, FACTS, lookup, base={"BASE": "b"})


@pytest.mark.parametrize(
    ("ref", "want"),
    [
        ({"resource": "limits.cpu"}, "2"),  # 1.5 rounded up to whole cores
        ({"resource": "limits.cpu", "divisor": "1m"}, "1500"),
        ({"resource": "requests.cpu", "divisor": "1m"}, "250"),
        ({"resource": "limits.memory", "divisor": "1Mi"}, "1024"),
        ({"resource": "requests.memory", "divisor": "1Mi"}, "1024"),  # falls back to the limit
        ({"resource": "limits.ephemeral-storage"}, "0"),  # not allocatable here
    ],
)
def test_resource_field_refs(ref: dict[str, str], want: str) -> None:
    assert env_of({"name": "X", "valueFrom": {"resourceFieldRef": ref}})["X"] == want


def test_env_order_sources_and_expansion() -> None:
    env = env_of(
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "ADDR", "value": "$(IP):29400 $(LATER)"},
        {"name": "LATER", "value": "l"},
        {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
        {"name": "PW", "valueFrom": {"secretKeyRef": {"name": "sec", "key": "pw"}}},
        {
            "name": "OPT",
            "valueFrom": {"secretKeyRef": {"name": "gone", "key": "x", "optional": True}},
        },
        {"name": "CM_k", "value": "overridden"},
        env_from=[
            {"prefix": "CM_", "configMapRef": {"name": "cm"}},
            {"secretRef": {"name": "sec"}},
        ],
    )
    assert env["ADDR"] == "10.246.1.2:29400 $(LATER)"  # only earlier variables expand
    assert (env["K"], env["PW"], env["pw"], env["CM_other"]) == ("v", "s3cret", "s3cret", "o")
    assert env["CM_k"] == "overridden" and env["BASE"] == "b" and "OPT" not in env


@pytest.mark.parametrize(
    "var",
    [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "missing", "key": "k"}}},
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "missing"}}},
        {
            "name": "X",
            "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "containerName": "nope"}},
        },
    ],
)
def test_missing_references_are_config_errors(var: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        env_of(var)


def test_argv_expands_command_and_args() -> None:
    c = {"command": ["python", "$(SCRIPT)"], "args": ["--addr", "$(IP)", "$$(IP)"]}
    assert container_argv(c, {"SCRIPT": "a.py", "IP": "1.2.3.4"}) == [
        "python",
        "a.py",
        "--addr",
        "1.2.3.4",
        "$(IP)",
    ]
    with pytest.raises(ConfigError):
        container_argv({}, {})


def token(sa: str, audience: str | None, expiration: int) -> str:
    return f"token-for-{sa}-{audience}-{expiration}"


def test_projected_service_account_volume() -> None:
    OBJECTS[("ConfigMap", "ns", "kube-root-ca.crt")] = {"data": {"ca.crt": "CA"}}
    vol = {
        "name": "kube-api-access",
        "projected": {
            "defaultMode": 0o644,
            "sources": [
                {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}},
                {
                    "configMap": {
                        "name": "kube-root-ca.crt",
                        "items": [{"key": "ca.crt", "path": "ca.crt"}],
                    }
                },
                {
                    "downwardAPI": {
                        "items": [
                            {"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}
                        ]
                    }
                },
            ],
        },
    }
    files = volume_files(vol, POD, FACTS, lookup, token)
    assert files == {
        "token": (b"token-for-sa-None-3607", 0o644),
        "ca.crt": (b"CA", 0o644),
        "namespace": (b"ns", 0o644),
    }


def test_configmap_secret_items_and_modes() -> None:
    cm = {
        "name": "c",
        "configMap": {"name": "cm", "items": [{"key": "k", "path": "d/k.txt", "mode": 0o600}]},
    }
    assert volume_files(cm, POD, FACTS, lookup, token) == {"d/k.txt": (b"v", 0o600)}
    sec = {"name": "s", "secret": {"secretName": "sec", "defaultMode": 0o400}}
    assert volume_files(sec, POD, FACTS, lookup, token) == {"pw": (b"s3cret", 0o400)}
    with pytest.raises(ConfigError):
        volume_files({"name": "m", "configMap": {"name": "missing"}}, POD, FACTS, lookup, token)
    assert (
        volume_files(
            {"name": "m", "configMap": {"name": "missing", "optional": True}},
            POD,
            FACTS,
            lookup,
            token,
        )
        == {}
    )
    assert volume_files({"name": "e", "emptyDir": {}}, POD, FACTS, lookup, token) is None
    with pytest.raises(ConfigError):
        volume_files({"name": "n", "nfs": {}}, POD, FACTS, lookup, token)


def test_binary_configmap_and_secret_data_reach_the_volume_as_bytes() -> None:
    # A gzip file (kubectl dtj run ships a directory so): not UTF-8, kept byte for byte.
    blob = b"\x1f\x8b\x08\x00binary\xff"
    encoded = base64.b64encode(blob).decode()
    OBJECTS[("ConfigMap", "ns", "bin")] = {
        "data": {"a.txt": "text"},
        "binaryData": {"b.gz": encoded},
    }
    OBJECTS[("Secret", "ns", "binsec")] = {"data": {"key.p12": encoded}}
    cm = volume_files({"name": "c", "configMap": {"name": "bin"}}, POD, FACTS, lookup, token)
    assert cm == {"a.txt": (b"text", 0o644), "b.gz": (blob, 0o644)}
    sec = volume_files({"name": "s", "secret": {"secretName": "binsec"}}, POD, FACTS, lookup, token)
    assert sec == {"key.p12": (blob, 0o644)}
