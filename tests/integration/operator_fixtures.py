"""Fixtures that install our CRDs and run the operator against the test cluster."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dtj import REPO, OperatorProcess, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException

CRD_FILE = REPO / "crds" / "torchrun.dev_distributedtrainingjobs.yaml"


def install_crd(api: client.ApiClient) -> None:
    """Every CRD in crds/: the job's and the training runtimes'."""
    for path in sorted((REPO / "crds").glob("*.yaml")):
        _install(api, path)


def _install(api: client.ApiClient, path: Path) -> None:
    ext = client.ApiextensionsV1Api(api)
    crd = yaml.safe_load(path.read_text())
    name = crd["metadata"]["name"]
    try:
        current: Any = ext.read_custom_resource_definition(name)
        crd["metadata"]["resourceVersion"] = current.metadata.resource_version
        ext.replace_custom_resource_definition(name, crd)
    except ApiException as e:
        if e.status != 404:
            raise
        ext.create_custom_resource_definition(crd)

    def established() -> bool:
        served: Any = ext.read_custom_resource_definition(name)
        conds = served.status.conditions or []
        return any(c.type == "Established" and c.status == "True" for c in conds)

    wait_for(f"CRD {name} established", established, timeout=30)


@pytest.fixture(scope="session")
def crd(kube: client.ApiClient) -> None:
    install_crd(kube)


@pytest.fixture(scope="session")
def operator(
    crd: None, cluster: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(Path(cluster.kubeconfig), tmp_path_factory.mktemp("operator"))
    op.start()
    yield op
    op.kill()
    errors = [line for line in op.log().splitlines() if "Traceback" in line]
    assert not errors, f"the operator logged tracebacks:\n{op.log()[-4000:]}"
