"""The local cluster's NetworkPolicy enforcer (localkube.netpol), killed: on a second,
short-lived local cluster beside the session's."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest
from localkube import netpol, procs
from localkube.components import default_nodes
from localkube.controlplane import Cluster
from localkube.testing import pick_base, wait_for


def test_a_killed_enforcer_leaves_the_cluster_stale_and_its_rule_goes_with_the_cluster(
    cluster: Any,
) -> None:
    """A second, short-lived enforcing cluster: its enforcer, killed, unbinds the queue (which
    then lets packets pass: --queue-bypass) and makes the cluster stale; down() removes the
    queue rule all the same, and the session's cluster keeps its own."""
    if not getattr(cluster, "network_policies", False):
        pytest.fail("the session's cluster enforces no NetworkPolicy: run cluster/build.sh netpol")
    tmp = Path(tempfile.mkdtemp(prefix="localkube-netpol-"))
    other = Cluster(
        tmp,
        name=f"np{random.randrange(10**6)}",
        base=pick_base(),
        nodes=default_nodes(1, cpu="2", memory="4Gi"),
        network_policies=True,
        die_with_parent=True,
    )
    other.up(timeout=120)
    queue = netpol.queue_id(other.net)
    try:
        assert netpol.queue_bound(queue) and netpol.has_queue_rule(other.net)
        assert other.healthy()
        pid = json.loads((tmp / "pids.json").read_text())[netpol.COMPONENT]
        os.kill(pid, signal.SIGKILL)
        wait_for("the enforcer to die", lambda: not procs.pid_alive(pid), 10)
        # The kernel unbinds a dead listener's queue when its netlink socket is released,
        # which can trail the process's exit.
        wait_for("its queue to be unbound", lambda: not netpol.queue_bound(queue), 10)
        assert not other.healthy()
    finally:
        other.down()
    assert not netpol.has_queue_rule(other.net)
    assert netpol.remove_queue_rules(other.net) == []
    assert netpol.has_queue_rule(cluster.net) and netpol.queue_bound(netpol.queue_id(cluster.net))
    assert cluster.healthy()
    if os.environ.get("LOCALKUBE_KEEP_LOGS") != "1":
        shutil.rmtree(tmp, ignore_errors=True)
