"""Helpers for tests against a cluster: waiting, naming, picking a free pod subnet, and a
stand-in for `Cluster` when the tests run against any KUBECONFIG (kind, a real cluster)."""

from __future__ import annotations

import fcntl
import os
import random
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from localkube import network, procs

if TYPE_CHECKING:
    from localkube.controlplane import Cluster


def use_external_cluster() -> bool:
    """LOCALKUBE_USE_KUBECONFIG=1, or KUBECONFIG set and LOCALKUBE=0."""
    if os.environ.get("LOCALKUBE_USE_KUBECONFIG") == "1":
        return True
    return bool(os.environ.get("KUBECONFIG")) and os.environ.get("LOCALKUBE") == "0"


@dataclass
class ExternalCluster:
    """Any cluster reachable through a kubeconfig: the parts of `Cluster` that work anywhere."""

    kubeconfig: Path

    @property
    def bin_dir(self) -> Path:
        """The binaries the tests run on this host (Kueue's manager, helm, kubectl)."""
        from localkube.controlplane import find_bin_dir

        return find_bin_dir()

    def api_client(self) -> Any:
        from kubernetes import config

        return config.new_client_from_config(config_file=str(self.kubeconfig))

    def mint_service_account_kubeconfig(self, namespace: str, sa: str) -> Path:
        from kubernetes import client

        api = self.api_client()
        try:
            resp = client.CoreV1Api(api).create_namespaced_service_account_token(
                sa,
                namespace,
                client.AuthenticationV1TokenRequest(
                    spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
                ),
            )
        finally:
            api.close()
        assert resp.status is not None and resp.status.token, "TokenRequest returned no token"
        token = resp.status.token
        cfg = yaml.safe_load(self.kubeconfig.read_text())
        ctx = next(c for c in cfg["contexts"] if c["name"] == cfg["current-context"])["context"]
        cl = next(c for c in cfg["clusters"] if c["name"] == ctx["cluster"])
        out = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [cl],
            "users": [{"name": "sa", "user": {"token": token}}],
            "contexts": [{"name": "sa", "context": {"cluster": cl["name"], "user": "sa"}}],
            "current-context": "sa",
        }
        path = Path(tempfile.mkdtemp(prefix="sa-kubeconfig-")) / "config"
        path.write_text(yaml.safe_dump(out))
        return path


def unique_cluster_name(prefix: str = "it") -> str:
    """Per test process, so parallel sessions on one host get distinct bridges; a second
    cluster of the same process (the fault campaign's) takes another prefix."""
    return f"{prefix}{os.getpid()}"[:12]


# Where a picked subnet is claimed until its bridge exists: one folder for the host (not under
# TMPDIR, which parallel sessions set apart), one file per base holding its owner's pid.
CLAIMS = Path(os.environ.get("LOCALKUBE_CLAIMS", "/run/localkube/bases"))
# Longer than any cluster takes to put its bridge up (which then marks the base as used), so
# a claim never needs removing by its owner; a long-lived process (the fault campaign starts
# hundreds of clusters) cannot use up the candidates.
CLAIM_SECONDS = 600.0


def _claim_alive(path: Path, now: float) -> bool:
    try:
        pid = int(path.read_text() or "0")
        age = now - path.stat().st_mtime
    except (OSError, ValueError):
        return False
    return age <= CLAIM_SECONDS and pid > 0 and procs.pid_alive(pid)


def pick_base(candidates: range = range(200, 255), claims: Path | None = None) -> int:
    """A free 10.<base>.0.0/16 for a local cluster, claimed for this process: parallel
    sessions on one host (pytest-xdist's workers, the fault campaign's runs) start clusters
    at the same moment, and looking at the host's interfaces alone leaves a window between
    looking and creating the bridge. The look and the claim happen under one host-wide lock."""
    folder = claims or CLAIMS
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        used = network.used_bases()
        now = time.time()
        free = [b for b in candidates if b not in used and not _claim_alive(folder / str(b), now)]
        if free:
            base = random.choice(free)
            (folder / str(base)).write_text(str(os.getpid()))
            return base
    raise RuntimeError("no free 10.x.0.0/16 for a local cluster")


@contextmanager
def started_cluster(prefix: str, timeout: float, **kwargs: Any) -> Iterator[Cluster]:
    """A local cluster for a test session or module, in a fresh directory, on a free subnet;
    its components die with the test process. A failure to start raises with the failing
    component's log tail. Stopped and removed afterwards (LOCALKUBE_KEEP_LOGS=1 keeps the
    directory, logs under DIR/logs). `kwargs`: Cluster's (name, nodes, real_nodes, ...)."""
    from localkube.controlplane import Cluster

    tmp = Path(tempfile.mkdtemp(prefix=prefix))
    kwargs.setdefault("base", pick_base())
    c = Cluster(tmp, die_with_parent=True, **kwargs)
    c.up(timeout=timeout)
    try:
        yield c
    finally:
        c.down()
        if os.environ.get("LOCALKUBE_KEEP_LOGS") != "1":
            shutil.rmtree(tmp, ignore_errors=True)


def namespace_name(test_name: str) -> str:
    """A DNS-1123 label (at most 63 characters) from a test's name, with a random suffix."""
    base = re.sub(r"[^a-z0-9-]+", "-", test_name.lower()).strip("-")[:50].strip("-") or "t"
    return f"{base}-{random.randrange(16**6):06x}"


def wait_for(what: str, check: Any, timeout: float = 30.0, interval: float = 0.2) -> Any:
    """Polls `check` until it returns something truthy, and returns that; TimeoutError naming
    `what` and the last result after `timeout` seconds. The one wait of the tests, the fault
    campaign and the benchmark."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"timed out after {timeout:.0f}s waiting for {what}; last: {result!r}"
            )
        time.sleep(interval)


def namespace_gone(api: Any, name: str) -> bool:
    """Whether the namespace is gone (404), not only terminating."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    try:
        client.CoreV1Api(api).read_namespace(name)
        return False
    except ApiException as e:
        if e.status == 404:
            return True
        raise


def create_namespace(api: Any, name: str, timeout: float = 60.0) -> None:
    """Creates the namespace (an existing one is fine) and waits for its default
    ServiceAccount: pods are refused until ServiceAccount admission finds it."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    except ApiException as e:
        if e.status != 409:
            raise

    def default_sa() -> bool:
        try:
            core.read_namespaced_service_account("default", name)
            return True
        except ApiException as e:
            if e.status != 404:
                raise
            return False

    wait_for(f"default ServiceAccount in {name}", default_sa, timeout)
