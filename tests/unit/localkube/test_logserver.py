"""The process node's log endpoint (localkube.node.logserver): what the apiserver's `pods/log`
asks a kubelet for, answered from the pod workers' log files, only to a client of the
cluster's CA."""

from __future__ import annotations

import http.client
import io
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from localkube import pki
from localkube.node import logserver
from localkube.node.logserver import LogQuery, LogServer, copy_log, parse_query, tail_offset


def test_a_log_request_is_read_with_its_parameters() -> None:
    q = parse_query("/containerLogs/ns/pod-0/trainer?follow=true&tailLines=5&limitBytes=100")
    assert q == LogQuery("ns", "pod-0", "trainer", True, False, 5, 100)
    assert parse_query("/containerLogs/ns/p/c?previous=true") == LogQuery(
        "ns", "p", "c", previous=True
    )
    assert parse_query("/containerLogs/ns/p/c") == LogQuery("ns", "p", "c")


@pytest.mark.parametrize("path", ["/exec/ns/p/c", "/containerLogs/ns/p", "/pods", "/"])
def test_any_other_path_is_not_a_log_request(path: str) -> None:
    assert parse_query(path) is None


@pytest.mark.parametrize("query", ["tailLines=-1", "tailLines=x", "limitBytes=-3"])
def test_a_bad_count_is_refused(query: str) -> None:
    with pytest.raises(ValueError):
        parse_query(f"/containerLogs/ns/p/c?{query}")


def tail(data: bytes, lines: int) -> bytes:
    f = io.BytesIO(data)
    f.seek(tail_offset(f, lines))
    return f.read()


@pytest.mark.parametrize(
    ("data", "lines", "want"),
    [
        (b"a\nb\nc\n", 1, b"c\n"),
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\n", 9, b"a\nb\nc\n"),
        (b"a\nb\nc", 1, b"c"),  # a last line without its newline is a line
        (b"a\nb\nc", 2, b"b\nc"),
        (b"a\nb\n", 0, b""),
        (b"", 3, b""),
        (b"\n\n\n", 2, b"\n\n"),
    ],
)
def test_tail_lines_as_the_kubelet_counts_them(data: bytes, lines: int, want: bytes) -> None:
    assert tail(data, lines) == want


def test_tail_reads_backwards_across_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(logserver, "CHUNK", 7)
    data = b"".join(f"line {i}\n".encode() for i in range(100))
    assert tail(data, 3) == b"line 97\nline 98\nline 99\n"
    assert tail(data, 100) == data


def test_limit_bytes_cuts_the_log() -> None:
    out = io.BytesIO()
    sent = copy_log(io.BytesIO(b"0123456789"), out, LogQuery("n", "p", "c", limit_bytes=4),
                    lambda: True, threading.Event())  # fmt: skip
    assert (sent, out.getvalue()) == (4, b"0123")


def test_follow_writes_what_is_appended_until_the_container_ends(tmp_path: Path) -> None:
    log = tmp_path / "c.log"
    log.write_bytes(b"first\n")
    running = threading.Event()
    running.set()
    out = io.BytesIO()

    def writer() -> None:
        time.sleep(0.3)
        with open(log, "ab") as f:
            f.write(b"second\n")
        time.sleep(0.3)
        with open(log, "ab") as f:
            f.write(b"last words\n")
        running.clear()  # its last line was written before it ended

    t = threading.Thread(target=writer)
    t.start()
    with open(log, "rb") as f:
        copy_log(f, out, LogQuery("n", "p", "c", follow=True), running.is_set, threading.Event())
    t.join()
    assert out.getvalue() == b"first\nsecond\nlast words\n"


def test_without_follow_the_log_is_read_once(tmp_path: Path) -> None:
    out = io.BytesIO()
    copy_log(io.BytesIO(b"x\n"), out, LogQuery("n", "p", "c"), lambda: True, threading.Event())
    assert out.getvalue() == b"x\n"


def test_previous_is_the_latest_earlier_run(tmp_path: Path) -> None:
    assert logserver.previous_log(tmp_path, "trainer") is None
    for name in ("trainer.log", "trainer.0.log", "trainer.1.log", "trainer.10.log", "other.11.log"):
        (tmp_path / name).write_text(name)
    assert logserver.previous_log(tmp_path, "trainer") == tmp_path / "trainer.10.log"


class Files:
    """A LogSource over a folder: <pod>/<container>.log."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def find_log(self, query: LogQuery) -> tuple[Path, Callable[[], bool]] | str:
        path = self.root / query.pod / f"{query.container}.log"
        if not path.exists():
            return f"no log of {query.pod}/{query.container}"
        return path, lambda: True  # its container runs on


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The cluster's CA, the node's serving pair, the apiserver's client pair and a client
    pair of another CA."""
    d = tmp_path_factory.mktemp("pki")
    ca, other = pki.make_ca(), pki.make_ca("not-the-cluster")
    (d / "ca.pem").write_bytes(ca.cert_pem)
    out = {"ca": d / "ca.pem"}
    pairs = {
        "serving": pki.make_serving_cert(ca, "localkube-node", [], ["127.0.0.1"]),
        "client": pki.make_client_cert(ca, "kube-apiserver"),
        "stranger": pki.make_client_cert(other, "pod"),
    }
    for name, kc in pairs.items():
        for ext, data in (("crt", kc.cert_pem), ("key", kc.key_pem)):
            out[f"{name}.{ext}"] = d / f"{name}.{ext}"
            out[f"{name}.{ext}"].write_bytes(data)
    return out


@pytest.fixture
def server(tmp_path: Path, certs: dict[str, Path]) -> Iterator[LogServer]:
    s = LogServer(
        "127.0.0.1",
        str(certs["serving.crt"]),
        str(certs["serving.key"]),
        str(certs["ca"]),
        Files(tmp_path),
    )
    s.serve()
    yield s
    s.close()


def write_log(root: Path, data: bytes) -> None:
    """The log of container c of pod p, as Files finds it."""
    (root / "p").mkdir()
    (root / "p" / "c.log").write_bytes(data)


def get(
    s: LogServer, certs: dict[str, Path], path: str, who: str | None = "client"
) -> tuple[int, bytes]:
    """GET over TLS, with the client pair `who` (None: no client certificate)."""
    ctx = ssl.create_default_context(cafile=str(certs["ca"]))
    ctx.check_hostname = False
    if who is not None:
        ctx.load_cert_chain(str(certs[f"{who}.crt"]), str(certs[f"{who}.key"]))
    conn = http.client.HTTPSConnection("127.0.0.1", s.port, context=ctx, timeout=10)
    conn.request("GET", path)
    resp = conn.getresponse()
    return resp.status, resp.read()


def test_the_apiservers_certificate_reads_a_log(
    server: LogServer, certs: dict[str, Path], tmp_path: Path
) -> None:
    write_log(tmp_path, b"one\ntwo\nthree\n")
    assert get(server, certs, "/containerLogs/ns/p/c") == (200, b"one\ntwo\nthree\n")
    assert get(server, certs, "/containerLogs/ns/p/c?tailLines=2") == (200, b"two\nthree\n")
    status, body = get(server, certs, "/containerLogs/ns/p/missing")
    assert status == 404 and b"no log of p/missing" in body
    assert get(server, certs, "/exec/ns/p/c")[0] == 404
    assert get(server, certs, "/containerLogs/ns/p/c?tailLines=-1")[0] == 400


@pytest.mark.parametrize("who", ["stranger", None], ids=["another-ca", "no-certificate"])
def test_a_client_without_the_clusters_certificate_reads_nothing(
    server: LogServer, certs: dict[str, Path], tmp_path: Path, who: str | None
) -> None:
    write_log(tmp_path, b"secret\n")
    with pytest.raises((ssl.SSLError, ConnectionError)):
        get(server, certs, "/containerLogs/ns/p/c", who=who)


def test_a_silent_client_does_not_hold_up_the_others(
    server: LogServer, certs: dict[str, Path], tmp_path: Path
) -> None:
    write_log(tmp_path, b"ok\n")
    with socket.create_connection(("127.0.0.1", server.port)):  # connects, never says a word
        assert get(server, certs, "/containerLogs/ns/p/c") == (200, b"ok\n")


def test_a_follower_ends_when_the_server_closes(
    server: LogServer, certs: dict[str, Path], tmp_path: Path
) -> None:
    write_log(tmp_path, b"going\n")
    got: list[tuple[int, bytes]] = []
    follow = "/containerLogs/ns/p/c?follow=1"
    t = threading.Thread(target=lambda: got.append(get(server, certs, follow)))
    t.start()
    time.sleep(0.5)
    assert t.is_alive()  # it follows a running container
    server.stopping.set()
    t.join(10)
    assert got == [(200, b"going\n")]
