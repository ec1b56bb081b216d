"""The process node's pod status, published through an apiserver that is down (restarted):
a failed publish is reported, not raised, so the pod's worker lives on and publishes the
pod's final status once the apiserver is back (a real kubelet's status manager retries the
same way). Before, the worker crashed and the pod stayed Running in the API for ever."""

from __future__ import annotations

import functools
import threading
from pathlib import Path

import pytest
from kubernetes import client
from localkube import procs
from localkube.node import kapi
from localkube.node.hostpaths import CreatedPaths
from localkube.node.nodes import NodeConfig
from localkube.node.pods import Ipam, NodeContext, PodWorker


def test_a_status_the_apiserver_cannot_take_is_kept_to_publish_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One attempt: no back-off waits.
    monkeypatch.setattr(kapi, "retry", functools.partial(kapi.retry, attempts=1))
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{procs.free_port()}"  # nothing listens there
    cfg.retries = 0
    ctx = NodeContext(
        api=client.ApiClient(cfg), state_dir=tmp_path, bridge="br-test", base=250,
        dns_ip="10.250.0.10", api_host="127.0.0.1", api_port=1, backoff_base=1,
        backoff_cap=1, created=CreatedPaths(tmp_path / "created.json"),
        stop=threading.Event(), ipam=Ipam(250),
    )  # fmt: skip
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"},
    }
    worker = PodWorker(ctx, NodeConfig("n", 0), pod, on_done=lambda uid: None)
    assert worker._publish() is False
    assert worker.published is None  # so the next publish sends it again
