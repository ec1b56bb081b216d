"""The process node's pod status and final delete, sent through an apiserver that is down
(restarted): a failed publish is reported, not raised, so the pod's worker lives on and
publishes the pod's final status once the apiserver is back, and its final delete is sent
again until it lands (a real kubelet retries the same way). Before, the worker crashed and
the pod stayed Running, or Terminating, in the API for ever."""

from __future__ import annotations

import functools
import http.server
import threading
import time
from pathlib import Path

import pytest
from kubernetes import client
from localkube import procs
from localkube.node import kapi, pods
from localkube.node.hostpaths import CreatedPaths
from localkube.node.nodes import NodeConfig
from localkube.node.pods import Ipam, NodeContext, PodWorker


def node_context(tmp_path: Path, port: int) -> NodeContext:
    """A process node's context whose apiserver is http://127.0.0.1:`port`, without the
    client's own retries."""
    cfg = client.Configuration()
    cfg.host = f"http://127.0.0.1:{port}"
    cfg.retries = 0
    return NodeContext(
        api=client.ApiClient(cfg), state_dir=tmp_path, bridge="br-test", base=250,
        dns_ip="10.250.0.10", api_host="127.0.0.1", api_port=1, backoff_base=1,
        backoff_cap=1, created=CreatedPaths(tmp_path / "created.json"),
        stop=threading.Event(), ipam=Ipam(250),
    )  # fmt: skip


def test_a_status_the_apiserver_cannot_take_is_kept_to_publish_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One attempt: no back-off waits.
    monkeypatch.setattr(kapi, "retry", functools.partial(kapi.retry, attempts=1))
    ctx = node_context(tmp_path, procs.free_port())  # nothing listens there
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {"containers": [{"name": "c", "image": "i"}], "restartPolicy": "Never"},
    }
    worker = PodWorker(ctx, NodeConfig("n", 0), pod, on_done=lambda uid: None)
    assert worker._publish() is False
    assert worker.published is None  # so the next publish sends it again


def test_the_final_delete_is_sent_again_until_the_apiserver_is_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Before, the worker crashed on the connection error once kapi.retry gave up, and the
    # pod stayed Terminating in the API for ever (a fault campaign's apiserver restart).
    monkeypatch.setattr(kapi, "retry", functools.partial(kapi.retry, attempts=1))
    monkeypatch.setattr(pods, "FINAL_DELETE_RETRY_SECONDS", 0.1)
    port = procs.free_port()
    deletes: list[str] = []

    class Apiserver(http.server.BaseHTTPRequestHandler):
        def do_DELETE(self) -> None:  # noqa: N802 - http.server's name
            deletes.append(self.path)
            body = b'{"kind": "Status", "status": "Success"}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    def back_later() -> None:
        time.sleep(0.5)  # down first: the deletes sent meanwhile find nothing listening
        server = http.server.HTTPServer(("127.0.0.1", port), Apiserver)
        server.handle_request()
        server.server_close()

    ctx = node_context(tmp_path, port)
    apiserver = threading.Thread(target=back_later)
    apiserver.start()
    pods.delete_pod(ctx, "ns", "p", "u1")
    apiserver.join(5)
    assert deletes == ["/api/v1/namespaces/ns/pods/p"]


def test_volume_set_up_waits_for_an_apiserver_that_is_away(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Reading a ConfigMap volume's data through an apiserver that is down: the pod waits in
    # ContainerCreating and is set up again at the next step; the worker used to crash and
    # leave the pod Pending for ever.
    monkeypatch.setattr(kapi, "retry", functools.partial(kapi.retry, attempts=1))
    ctx = node_context(tmp_path, procs.free_port())  # nothing listens there
    pod = {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
        "spec": {
            "containers": [{"name": "c", "image": "i"}],
            "restartPolicy": "Never",
            "volumes": [{"name": "v", "configMap": {"name": "launcher"}}],
        },
    }
    worker = PodWorker(ctx, NodeConfig("n", 0), pod, on_done=lambda uid: None)
    worker.pod_dir.mkdir(parents=True)
    worker._step()
    assert worker.vols is None  # set up again at the next step
    assert [(c.reason, c.state) for c in worker.containers] == [("ContainerCreating", "waiting")]
