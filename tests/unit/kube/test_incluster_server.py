"""The apiserver URL an operator pod uses (kopf login and our own client must agree)."""

from __future__ import annotations

from torchrun_operator.kube.client import in_cluster_server


def test_from_the_service_environment_variables() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_server(env) == "https://10.0.0.1:6443"


def test_ipv6_host_is_bracketed() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_server(env) == "https://[fd00::1]:443"


def test_outside_a_pod_there_is_none() -> None:
    assert in_cluster_server({}) is None
    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None
