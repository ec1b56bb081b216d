"""A seeded fault-injection campaign in every CI run (the full one: docs/reliability.md).

On the local cluster it starts a local cluster of its own: the campaign runs its own
operators (with faults, killed and restarted), which must not share jobs with the suite's
operator. On a kind cluster of this host it runs on the session's cluster
(`faultrun.py --kubeconfig`), its apiserver stopped and restarted inside the control-plane
node (campaign_cluster.KindApiserver), with the suite's operator stopped meanwhile. Two quick
scenarios (a success and a gang restart), two runs at once, and a seed whose first two runs
schedule, among the 12 faults of a few reliable kinds, a split brain and a real apiserver
restart: at least 8 faults fired, one of the two new kinds among them. 3 min 27 s on the
2-core development machine (load 2 to 3, another campaign beside it), cluster start
included. That the campaign can fail at all is proven by test_campaign_plants.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from campaign_cluster import KindApiserver, kind_control_plane
from campaign_run import NAMESPACE_PREFIX, release_held
from kubernetes import client
from localkube.testing import use_external_cluster

HERE = Path(__file__).resolve().parent
# The campaign starts no run after this; the timeouts below are only backstops.
CAMPAIGN_MINUTES = 10

# The nodes' processes must be here: on kind the campaign stops the apiserver's.
pytestmark = pytest.mark.host_nodes


@pytest.fixture
def campaign_cluster(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """faultrun.py's arguments for its cluster: none (a cluster of its own), or the session's
    kind cluster, with the session's operator stopped while the campaign's own run."""
    if not use_external_cluster():
        yield []
        return
    cluster: Any = request.getfixturevalue("cluster")
    kube: Any = request.getfixturevalue("kube")
    operator: Any = request.getfixturevalue("operator")
    # Asked now, while the API serves: after the campaign it may not yet.
    container = kind_control_plane(Path(cluster.kubeconfig))
    operator.kill()
    try:
        yield ["--kubeconfig", str(cluster.kubeconfig)]
    finally:
        # A campaign killed mid-fault can leave the apiserver stopped or still starting.
        if container:
            KindApiserver(Path(cluster.kubeconfig), container).recover()
        # A campaign that was killed leaves its runs' namespaces (faults-<n>-<hex>), with jobs
        # the suite's operator would otherwise go on running beside the later tests.
        core = client.CoreV1Api(kube)
        names = [ns.metadata.name for ns in core.list_namespace().items if ns.metadata]
        for name in names:
            if name and name.startswith(NAMESPACE_PREFIX):
                release_held(kube, name)
                core.delete_namespace(name)
        operator.start()


KINDS = [
    "split brain", "apiserver restarted", "500", "kill before", "kill after",
    "connect timeout", "410 Gone storm",
]  # fmt: skip


@pytest.mark.timeout(900)
def test_seeded_fault_campaign_keeps_every_invariant(
    tmp_path: Path, campaign_cluster: list[str]
) -> None:
    out = tmp_path / "tally.json"
    proc = subprocess.run(
        [sys.executable, str(HERE / "faultrun.py"), "--faults", "8", "--runs", "2",
         "--parallel", "2", "--per-run", "6", "--seed", "21",
         "--scenarios", "success,gang-restart", "--kinds", ",".join(KINDS),
         "--minutes", str(CAMPAIGN_MINUTES), "--json", str(out), *campaign_cluster],
        env=dict(os.environ), capture_output=True, text=True, timeout=840,
    )  # fmt: skip
    tail = f"{proc.stdout[-6000:]}\n{proc.stderr[-3000:]}"
    assert out.exists(), tail
    tally = json.loads(out.read_text())["tally"]
    assert [v for t in tally.values() for v in t["violations"]] == [], tail
    assert proc.returncode == 0, tail
    # Counted from the fault seam's own log and the driver's: faults that fired, not the
    # schedule.
    fired = {k: sum(t["fired"].get(k, 0) for t in tally.values()) for k in KINDS}
    assert sum(fired.values()) >= 8, tail
    assert fired["split brain"] + fired["apiserver restarted"] >= 1, fired
    assert all(t["runs"] >= 1 for t in tally.values()), tally
