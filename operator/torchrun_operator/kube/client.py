"""Kubernetes client set-up: in-cluster config when in a pod, else the kubeconfig."""

from __future__ import annotations

from collections.abc import Mapping

from kubernetes import client, config


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """The apiserver's URL inside a pod, from KUBERNETES_SERVICE_HOST/PORT as client-go and
    the kubernetes client find it; None outside a pod. (kopf's own service-account login
    assumes https://kubernetes.default.svc, which needs cluster DNS and a service proxy.)"""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    if ":" in host:  # IPv6
        host = f"[{host}]"
    return f"https://{host}:{port}"


def load() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    cfg = client.Configuration.get_default_copy()
    # One operator talks to the apiserver from many threads (workers, creates in parallel).
    cfg.connection_pool_maxsize = 32
    return client.ApiClient(cfg)
