"""How the SDK and kubectl-dtj reach the cluster: a kubeconfig ($KUBECONFIG, then
~/.kube/config), else the pod's service account (in-cluster); each gives a namespace."""

from __future__ import annotations

import os

from kubernetes import client, config

SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def connect(
    kubeconfig: str | None = None, context: str | None = None
) -> tuple[client.ApiClient, str]:
    """An ApiClient of its own (the kubernetes package's global configuration is left alone)
    and the namespace of the context (or of the pod), "default" when none is set."""
    cfg = client.Configuration()
    # $KUBECONFIG as it is now (the kubernetes package reads it once, when imported).
    path = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        # path None: ~/.kube/config.
        config.load_kube_config(config_file=path, context=context, client_configuration=cfg)
        contexts, active = config.list_kube_config_contexts(config_file=path)
        if context:
            active = next(c for c in contexts if c["name"] == context)
        namespace = (active.get("context") or {}).get("namespace") or "default"
    except config.ConfigException as kubeconfig_error:
        if kubeconfig:
            raise
        try:
            config.load_incluster_config(client_configuration=cfg)
        except config.ConfigException:
            # Not in a pod either: the kubeconfig's problem is the one to report.
            raise kubeconfig_error from None
        namespace = "default"
        try:
            with open(SERVICE_ACCOUNT_NAMESPACE) as f:
                namespace = f.read().strip() or "default"
        except OSError:
            pass
    return client.ApiClient(cfg), namespace
