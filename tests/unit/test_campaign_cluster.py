"""The fault campaign's own client (tests/integration/campaign_cluster.py) against a loopback
server that answers as an apiserver coming back from a restart does: what it refuses before
anything is written is tried again, and nothing else is."""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT / "tests" / "integration"), str(ROOT / "cluster")]

import pytest  # noqa: E402
from campaign_cluster import resilient_client  # noqa: E402
from kubernetes import client  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from localkube.kubeconfig import render_kubeconfig, write_kubeconfig  # noqa: E402

EMPTY = {"kind": "NamespaceList", "apiVersion": "v1", "metadata": {}, "items": []}


class Refusing(ThreadingHTTPServer):
    """Answers each GET with the next status of `answers`, then 200 and an empty list."""

    def __init__(self, answers: list[int]) -> None:
        self.answers = answers
        self.seen: list[int] = []
        super().__init__(("127.0.0.1", 0), _Handler)


class _Handler(BaseHTTPRequestHandler):
    server: Refusing

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        status = self.server.answers.pop(0) if self.server.answers else 200
        self.server.seen.append(status)
        body = json.dumps(EMPTY if status == 200 else {"kind": "Status", "code": status})
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", "0")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *_: object) -> None:
        pass


Serve = Callable[[list[int], Path], tuple[Refusing, client.CoreV1Api]]


@pytest.fixture
def serve() -> Iterator[Serve]:
    servers: list[Refusing] = []

    def start(answers: list[int], tmp: Path) -> tuple[Refusing, client.CoreV1Api]:
        srv = Refusing(answers)
        servers.append(srv)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        # Plain HTTP: no CA is read.
        server = f"http://127.0.0.1:{srv.server_port}"
        kubeconfig = write_kubeconfig(
            tmp / "kubeconfig", render_kubeconfig(server, b"", "u", token="t")
        )
        return srv, client.CoreV1Api(resilient_client(kubeconfig))

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("refusal", [403, 429, 503])
def test_a_read_refused_while_the_apiserver_comes_back_is_tried_again(
    serve: Serve, tmp_path: Path, refusal: int
) -> None:
    srv, core = serve([refusal, refusal], tmp_path)
    assert core.list_namespace().items == []
    assert srv.seen == [refusal, refusal, 200]


def test_any_other_refusal_is_the_callers(serve: Serve, tmp_path: Path) -> None:
    srv, core = serve([400], tmp_path)
    with pytest.raises(ApiException) as e:
        core.list_namespace()
    assert e.value.status == 400
    assert srv.seen == [400]
