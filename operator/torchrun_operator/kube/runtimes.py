"""Reads the training runtime a job names (spec.runtimeRef): get by name, nothing else.

The operator never writes runtimes, and reads one only while a job that names it has not
recorded it yet (reconcile/runtimeref.py): once recorded, the job never looks at the runtime
again. So no watch: a job whose runtime is missing asks again after RUNTIME_RETRY_SECONDS.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from torchrun_operator.api import names
from torchrun_operator.kube.client import get_or_none

Obj = dict[str, Any]


class RuntimeReader:
    def __init__(self, api: client.ApiClient) -> None:
        self.custom = client.CustomObjectsApi(api)

    def get(self, kind: str, name: str, namespace: str) -> Obj | None:
        """The runtime `kind`/`name` (a DistributedTrainingRuntime in `namespace`, the job's),
        None if there is none. Other refusals (RBAC, the CRD not installed) raise: the job is
        retried with back-off and the log says why."""
        cluster = kind == names.CLUSTER_RUNTIME_KIND
        plural = names.runtime_plural(kind)

        def call() -> Obj:
            if cluster:
                return self.custom.get_cluster_custom_object(  # type: ignore[return-value]
                    names.GROUP, names.VERSION, plural, name
                )
            return self.custom.get_namespaced_custom_object(  # type: ignore[return-value]
                names.GROUP, names.VERSION, namespace, plural, name
            )

        return get_or_none(kind, call)
