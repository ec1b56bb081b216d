"""Kubernetes client set-up: in-cluster config when in a pod, else the kubeconfig."""

from __future__ import annotations

from kubernetes import client, config


def load() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    cfg = client.Configuration.get_default_copy()
    # One operator talks to the apiserver from many threads (workers, creates in parallel).
    cfg.connection_pool_maxsize = 32
    return client.ApiClient(cfg)
