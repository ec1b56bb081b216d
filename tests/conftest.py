"""Shared by every suite, and the fixtures of the suites against a real control plane.

pytest puts this folder on sys.path, so modules here (jobs: the job builder; reports: the
launcher's report; kubeflow_examples) can be imported by tests of any suite; the cluster
suites' helpers (dtj, nodes, the fixtures' modules) live in tests/integration, on sys.path
too (pyproject.toml's pythonpath). The cluster suites: tests/integration (the operator's
features, on any cluster), tests/localkube (the local cluster itself: its nodes, control
plane, enforcer, and its life beside Docker) and tests/bench (the benchmarks' smoke runs,
each on clusters of its own).

By default a localkube cluster (etcd, kube-apiserver, controllers, scheduler, CoreDNS and two
process nodes) starts once per session in a temporary directory. With
LOCALKUBE_USE_KUBECONFIG=1 (or KUBECONFIG set and LOCALKUBE=0) the tests use whatever cluster
KUBECONFIG points at instead, e.g. kind; tests marked `localkube` need its insides and are
skipped there, with that reason, and tests marked `host_nodes` (nodes on this host) run there
only when it is a kind cluster of this host.

A cluster that fails to come up is an error in every test that needs it, never a skip.
LOCALKUBE_KEEP_LOGS=1 keeps the cluster directory (logs under DIR/logs) after the session.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker_fixtures import docker_engine  # noqa: F401  (fixture for the Docker tests)
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from loadednode import loaded_node  # noqa: F401  (fixture: a CPU-starved node)
from localkube import netpol
from localkube.components import default_nodes
from localkube.controlplane import Cluster, find_bin_dir, node_package_available
from localkube.testing import (
    ExternalCluster,
    create_namespace,
    namespace_name,
    started_cluster,
    unique_cluster_name,
    use_external_cluster,
)
from nodes import node_containers
from operator_fixtures import crd, operator  # noqa: F401  (fixtures for the operator's tests)

TESTS_DIR = Path(__file__).parent
INTEGRATION_DIR = TESTS_DIR / "integration"
# The suites that need a cluster; tests/localkube and tests/bench start or break local
# clusters, so every test there is marked localkube.
CLUSTER_DIRS = (INTEGRATION_DIR, TESTS_DIR / "localkube", TESTS_DIR / "bench")
LOCAL_ONLY_DIRS = CLUSTER_DIRS[1:]
DOCKER_TESTS = ("test_images_docker.py", "test_real_node.py", "test_docker_bridge.py")
# The longest modules, longest first (summed test times in `make test` of 2026-11-28). Under
# pytest-xdist (`--dist loadscope --no-loadscope-reorder`, Makefile) the workers take modules
# in collection order as they free up: a long module handed out last is the whole run's tail,
# so these go first, the other integration modules next, the unit tests (many short modules,
# filling the gaps) last.
LONGEST_FIRST = (
    "test_campaign_plants.py",
    "test_restarts.py",
    "test_launcher_torchrun.py",
    "test_bench_scale_smoke.py",
    "test_slow_control_plane.py",  # about 6 min alone (not yet timed in make test)
    "test_fault_injection.py",
    "test_bench_gpu_smoke.py",
    "test_operator_jobs.py",
    "test_leader.py",
    "test_helm_install.py",
    "test_gang_scheduling.py",
    "test_kueue.py",
    "test_progress_live.py",
    "test_node_avoidance.py",
    "test_migrating.py",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "integration: needs a real control plane")
    config.addinivalue_line("markers", "localkube: needs localkube internals, not any cluster")
    config.addinivalue_line(
        "markers",
        "host_nodes: needs the cluster's nodes on this host (localkube's or kind's): finds "
        "pods' processes in /proc, stops a node",
    )
    config.addinivalue_line(
        "markers", "docker: runs a Docker engine; alone, never beside process-node pods"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        parents = Path(str(item.fspath)).parents
        if not any(d in parents for d in CLUSTER_DIRS):
            continue
        item.add_marker(pytest.mark.integration)
        if any(d in parents for d in LOCAL_ONLY_DIRS):
            item.add_marker(pytest.mark.localkube)
        if item.get_closest_marker("localkube") and use_external_cluster():
            item.add_marker(pytest.mark.skip(reason="needs localkube; running against KUBECONFIG"))
        elif item.get_closest_marker("host_nodes") and not nodes_here():
            reason = (
                "needs the cluster's nodes on this host (localkube or kind); KUBECONFIG's are not"
            )
            item.add_marker(pytest.mark.skip(reason=reason))
    # The Docker tests start dockerd beside the session's cluster (and stop it afterwards).
    # They run last, and `make test` runs them in a pytest run of their own after the
    # parallel one (`-m docker`): with dockerd started under a running process node, workers
    # of a pod with an init container have been seen unable to open the launcher
    # (docs/install.md), and parallel workers would run other sessions' pods beside it.
    docker = [i for i in items if Path(str(i.fspath)).name in DOCKER_TESTS]
    for item in docker:
        item.add_marker(pytest.mark.docker)
    items.sort(key=run_order)  # stable: a module's tests keep their order


_NODES_HERE: list[bool] = []


def nodes_here() -> bool:
    """Whether the test cluster's nodes run on this host: localkube's always; another
    cluster's when every node is a kind node whose container Docker here runs (asked once)."""
    if not use_external_cluster():
        return True
    if not _NODES_HERE:
        from kubernetes import config as kubeconfig

        try:
            api = kubeconfig.new_client_from_config()
            try:
                _NODES_HERE.append(bool(node_containers(api)))
            finally:
                api.close()
        except Exception:  # noqa: BLE001 - unreachable: every test that needs it says so
            _NODES_HERE.append(False)
    return _NODES_HERE[0]


def run_order(item: pytest.Item) -> tuple[int, int]:
    """The Docker tests last; before them the longest modules, then the other integration
    tests, then the unit tests (see LONGEST_FIRST)."""
    path = Path(str(item.fspath))
    if path.name in DOCKER_TESTS:
        return (3, 0)
    if path.name in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(path.name))
    return (1, 0) if any(d in path.parents for d in CLUSTER_DIRS) else (2, 0)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster | ExternalCluster]:
    if use_external_cluster():
        yield ExternalCluster(Path(os.environ["KUBECONFIG"]))
        return
    # Without the process node (not yet written, or broken on import) there are no nodes:
    # tests that need pods fail on their own, the control plane's tests still run.
    nodes = default_nodes(2, cpu="8", memory="32Gi", gpus=0) if node_package_available() else []
    # A failure raises with the failing component's log tail: every test using the cluster
    # errors with it (pytest caches a session fixture's error), none is skipped.
    # NetworkPolicies enforced (localkube.netpol) wherever its enforcer is built (`make test`
    # builds it: cluster/build.sh all): every job's policy filters its pods' traffic, as on a
    # real cluster, and test_network_policy_enforced.py proves it (and fails where it is not).
    enforce = nodes != [] and netpol.binary(find_bin_dir()).exists()
    with started_cluster(
        "localkube-", 180, name=unique_cluster_name(), nodes=nodes, network_policies=enforce
    ) as c:
        yield c


@pytest.fixture(scope="session")
def kube(cluster: Cluster | ExternalCluster) -> Iterator[client.ApiClient]:
    api = cluster.api_client()
    yield api
    api.close()


@pytest.fixture
def namespace(kube: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    core = client.CoreV1Api(kube)
    name = namespace_name(request.node.name)
    create_namespace(kube, name)
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise
