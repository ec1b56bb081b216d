"""The rank-map reader: what it reads when (ReadSchedule, a fake clock), and the reader over a
fake `read` and over a real HTTP server."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from torchrun_operator.kube import rankmap, readschedule, statusread
from torchrun_operator.kube.rankmap import RankMapReader
from torchrun_operator.kube.readschedule import ReadSchedule, Target, targets_of
from torchrun_operator.reconcile import podinput
from torchrun_operator.reconcile.podinput import LiveAnswer, Rejected


def pod(name: str, index: int, attempt: int = 0, ready: bool = False, **status: Any) -> dict:
    return {
        "metadata": {
            "name": name,
            "uid": f"u-{name}",
            "labels": {"torchrun.dev/attempt": str(attempt), "torchrun.dev/index": str(index)},
        },
        "status": {
            "phase": "Running",
            "podIP": f"10.0.0.{index + 2}",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
            **status,
        },
    }


def test_targets_are_the_running_pods_of_the_attempt_that_have_an_ip() -> None:
    pods = [
        pod("j-0", 0, ready=True),
        pod("j-1", 1),
        pod("j-2-a1", 2, attempt=1),
        pod("j-3", 3, phase="Pending"),
        pod("j-4", 4, podIP=None),
    ]
    pods.append(pod("j-5", 5))
    pods[-1]["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert targets_of(pods, 0) == [
        Target("u-j-0", "j-0", "10.0.0.2", True),
        Target("u-j-1", "j-1", "10.0.0.3", False),
    ]


T = [Target(f"u{i}", f"p{i}", f"10.0.0.{i}", False) for i in range(3)]
DONE = LiveAnswer("r", 0, state="Training", group_rank=0)
WAITING = LiveAnswer("r", 0, state="Rendezvous")


def sweep(s: ReadSchedule, now: float) -> list[str]:
    due = s.due(now)
    return [t.uid for _, targets in due for t in targets]


def test_a_new_job_is_read_whole_then_one_waiting_pod_a_second() -> None:
    s = ReadSchedule(jitter=lambda: 0.5)
    s.update("j", T, now=0)
    assert sweep(s, 0) == ["u0", "u1", "u2"]
    assert sweep(s, 0) == []  # in flight
    s.done("j", {"u0": WAITING, "u1": None, "u2": None}, now=0.1)
    assert s.next_wakeup() == pytest.approx(1.1)
    assert sweep(s, 1.0) == []
    assert sweep(s, 1.1) == ["u0"]  # the sentinel
    s.done("j", {"u0": WAITING}, now=1.2)
    assert sweep(s, 2.2) == ["u1"]  # the waiting pods take turns


def test_one_pod_done_with_rendezvous_reads_the_whole_job_at_once() -> None:
    s = ReadSchedule(jitter=lambda: 0.5)
    s.update("j", T, now=0)
    sweep(s, 0)
    s.done("j", {t.uid: None for t in T}, now=0)
    assert sweep(s, 1) == ["u0"]
    assert s.done("j", {"u0": DONE}, now=1.05) is True
    assert s.next_wakeup() == 1.05
    assert sweep(s, 1.05) == ["u0", "u1", "u2"]
    s.done("j", {t.uid: DONE for t in T}, now=1.1)
    # Everyone rendezvoused: steady reads, 15 s (+-10 % jitter, here none) apart.
    assert s.next_wakeup() == pytest.approx(1.1 + 15)


def test_readiness_flips_and_new_pods_make_the_job_due_now() -> None:
    s = ReadSchedule(jitter=lambda: 0.5)
    s.update("j", T, now=0)
    sweep(s, 0)
    s.done("j", {t.uid: DONE for t in T}, now=0)
    s.update("j", T, now=3)
    assert sweep(s, 3) == []
    flipped = [T[0], Target("u1", "p1", "10.0.0.1", True), T[2]]
    s.update("j", flipped, now=4)
    assert sweep(s, 4) == ["u0", "u1", "u2"]


def test_the_steady_interval_grows_to_keep_reads_within_the_budget() -> None:
    s = ReadSchedule(steady=15, reads_per_second=40, sweeps_per_second=4, jitter=lambda: 0.5)
    for j in range(100):
        targets = [Target(f"u{j}-{i}", f"p{j}-{i}", "ip", True) for i in range(8)]
        s.update(j, targets, now=0)
    sweep(s, 0)
    s.done(0, {f"u0-{i}": DONE for i in range(8)}, now=0)
    # 800 pods at 40 reads/s: 20 s; 100 jobs at 4 sweeps/s: 25 s.
    assert s.jobs[0].next_due == pytest.approx(25)


def test_fast_reads_of_all_waiting_jobs_together_keep_within_the_read_budget() -> None:
    """A pod can answer "still in rendezvous" for ever (a hostile sidecar does): 200 such jobs
    must not be read 200 times a second, each at its own 1 s fast interval."""
    s = ReadSchedule(steady=15, reads_per_second=40, sweeps_per_second=4, jitter=lambda: 0.5)
    for j in range(200):
        s.update(j, [Target(f"u{j}", f"p{j}", "ip", True)], now=0)
    reads, now = 0, 0.0
    while now < 60:
        due = s.due(now)
        for key, targets in due:
            s.done(key, {t.uid: WAITING for t in targets}, now=now)
        reads += sum(len(targets) for _, targets in due)
        now += 0.1
    # The first read of each, then at most 40 a second (at 1 s each: 12,000).
    assert reads <= 200 + 40 * 60, reads
    # Alone, a waiting job is still read every second.
    lone = ReadSchedule(jitter=lambda: 0.5)
    lone.update("j", T[:1], now=0)
    sweep(lone, 0)
    lone.done("j", {"u0": WAITING}, now=0)
    assert lone.jobs["j"].next_due == pytest.approx(1)


def test_failing_pods_stop_holding_the_job_in_fast_reads_and_are_read_less() -> None:
    s = ReadSchedule(jitter=lambda: 0.5)
    s.update("j", T[:1], now=0)
    now = 0.0
    for _ in range(readschedule.MAX_FAST_FAILURES):
        assert sweep(s, now) == ["u0"]
        s.done("j", {"u0": None}, now=now)
        now = s.next_wakeup() or 0
    assert s.jobs["j"].next_due == pytest.approx(now)
    assert now - s.jobs["j"].next_due < 1e-9
    sweep(s, now)
    s.done("j", {"u0": None}, now=now)
    assert s.next_wakeup() == pytest.approx(now + 4 * 15)


def test_a_pod_unreachable_for_a_day_is_still_read_once_a_minute() -> None:
    # 2.0 ** failures overflows a float past 1023 failed reads in a row (17 hours at one a
    # minute): the sweep then died before it set the job's next read.
    s = ReadSchedule(jitter=lambda: 0.5)
    s.update("j", T[:1], now=0)
    now = 0.0
    for _ in range(1500):
        assert sweep(s, now) == ["u0"]
        s.done("j", {"u0": None}, now=now)
        now = s.next_wakeup() or 0
    assert s.jobs["j"].next_due == pytest.approx(now)
    assert sweep(s, now) == ["u0"]
    s.done("j", {"u0": None}, now=now)
    assert s.next_wakeup() == pytest.approx(now + 4 * 15)


def test_pods_that_go_away_are_forgotten_and_an_empty_job_is_dropped() -> None:
    s = ReadSchedule()
    s.update("j", T, now=0)
    s.update("j", [], now=1)
    assert "j" not in s.jobs and s.next_wakeup() is None


# ---- the reader ----------------------------------------------------------------------------


def test_reader_reads_keeps_answers_and_reports_changes() -> None:
    answers = {"10.0.0.2": {"v": 1, "rdzvId": "r", "index": 0, "groupRank": 1, "state": "Training"}}
    changed: list[Any] = []
    clock = [100.0]
    reader = RankMapReader(
        changed.append, clock=lambda: clock[0], read=lambda ip, port: answers.get(ip)
    )
    reader.start()
    try:
        reader.track(("ns", "j"), [pod("j-0", 0, ready=True), pod("j-1", 1)], attempt=0)
        deadline = time.monotonic() + 5
        while not changed and time.monotonic() < deadline:
            time.sleep(0.01)
        assert changed == [("ns", "j")]
        live = reader.live(("ns", "j"))
        kept = LiveAnswer("r", 0, state="Training", group_rank=1)
        assert live == {"u-j-0": {"at": 100.0, "data": kept}}
        reader.track(("ns", "j"), [], attempt=0)
        assert reader.live(("ns", "j")) == {}
    finally:
        reader.stop()


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:  # noqa: N802
        if self.path != "/status":
            self.send_error(404)
            return
        self.send_response(200)
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[http.server.HTTPServer]:
    srv = http.server.HTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield srv
    srv.shutdown()


def test_fetch_reads_a_json_object_and_nothing_else(server: http.server.HTTPServer) -> None:
    port = server.server_address[1]
    _Handler.body = json.dumps({"v": 1, "rdzvId": "r", "index": 0, "groupRank": 0}).encode()
    assert statusread.fetch("127.0.0.1", port) == LiveAnswer("r", 0, group_rank=0)
    _Handler.body = b"[1, 2]"
    assert statusread.fetch("127.0.0.1", port) == Rejected("not a JSON object")
    _Handler.body = b"{" + b" " * (statusread.MAX_ANSWER_BYTES + 10) + b"}"
    assert isinstance(statusread.fetch("127.0.0.1", port), Rejected)
    _Handler.body = b"not json"
    assert statusread.fetch("127.0.0.1", port) == Rejected("not JSON")
    server.shutdown()
    server.server_close()
    started = time.monotonic()
    assert statusread.fetch("127.0.0.1", port, timeout=0.5) is None
    assert time.monotonic() - started < 2


def test_a_pod_that_answers_a_byte_at_a_time_cannot_hold_a_reader() -> None:
    import socket

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    stop = threading.Event()

    def drip() -> None:
        conn, _ = srv.accept()
        conn.sendall(b"HTTP/1.0 200 OK\r\n")
        while not stop.is_set():
            try:
                conn.sendall(b"X")
            except OSError:
                return
            time.sleep(0.1)
        conn.close()

    threading.Thread(target=drip, daemon=True).start()
    started = time.monotonic()
    try:
        assert statusread.fetch("127.0.0.1", srv.getsockname()[1], timeout=0.5) is None
        assert time.monotonic() - started < 1.5
    finally:
        stop.set()
        srv.close()


# ---- hostile pods (issue 24 §2) ----------------------------------------------------------


def _bound(index: int = 0, **fields: Any) -> dict[str, Any]:
    return {"v": 1, "rdzvId": "r", "index": index, **fields}


def _wait(what: str, check: Any, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_a_read_that_raises_recursion_error_does_not_stop_the_jobs_reads() -> None:
    # RecursionError is a RuntimeError, which the sweep once took for "shut down": the job's
    # reads then stopped for the rest of the attempt.
    calls: dict[str, int] = {}

    def read(ip: str, port: int) -> object:
        calls[ip] = calls.get(ip, 0) + 1
        if ip == "10.0.0.2":
            raise RecursionError("maximum recursion depth exceeded")
        return _bound(1, state="Training", groupRank=0)

    changed: list[Any] = []
    reader = RankMapReader(changed.append, read=read, schedule=ReadSchedule(steady=0.01))
    reader.start()
    try:
        reader.track("j", [pod("j-0", 0, ready=True), pod("j-1", 1, ready=True)], attempt=0)
        _wait("the job read again", lambda: calls.get("10.0.0.3", 0) >= 3)
        assert set(reader.live("j")) == {"u-j-1"}
    finally:
        reader.stop()


def test_a_refused_answer_is_kept_as_its_reason_said_once_and_forgotten_with_the_pod() -> None:
    deep = b"[" * 5000 + b"]" * 5000
    changed: list[Any] = []
    reader = RankMapReader(
        changed.append,
        read=lambda ip, port: podinput.parse_answer(deep),
        schedule=ReadSchedule(steady=0.01),
    )
    reader.start()
    try:
        reader.track("j", [pod("j-0", 0, ready=True)], attempt=0)
        _wait("the refusal", lambda: "u-j-0" in reader.live("j"))
        read = reader.live("j")["u-j-0"]
        assert read["data"] is None and "nested deeper" in read["rejected"]
        _wait("more sweeps", lambda: reader._schedule.jobs["j"].failures.get("u-j-0", 0) >= 3)
        assert changed == ["j"]  # the same refusal again is no change
        reader.track("j", [], attempt=0)
        assert reader.live("j") == {}
    finally:
        reader.stop()


def test_all_kept_answers_stay_within_the_memory_bound() -> None:
    # 150 pods each answering 64 KiB of {}: what is kept is small, and never past the bound.
    filler = b",".join([b"{}"] * 20000)
    pods = [pod(f"j-{i}", i, ready=True) for i in range(150)]
    for i, p in enumerate(pods):
        p["status"]["podIP"] = f"10.1.0.{i}"
    index = {p["status"]["podIP"]: i for i, p in enumerate(pods)}
    reads: list[str] = []

    def read(ip: str, port: int) -> object:
        head = json.dumps(_bound(index[ip], state="Training", groupRank=index[ip]))[:-1]
        answer = podinput.parse_answer(head.encode() + b',"x":[' + filler + b"]}")
        reads.append(ip)
        return answer

    bound = 100 * LiveAnswer("r", 0, state="Training", group_rank=0).cost()
    reader = RankMapReader(lambda _: None, read=read, max_bytes=bound, sweep_seconds=60)
    reader.start()
    try:
        reader.track("j", pods, attempt=0)
        _wait("every pod read", lambda: len(reads) >= len(pods), timeout=60)
        _wait("the sweep's end", lambda: not reader._schedule.jobs["j"].in_flight)
        kept = reader.live("j")
        assert 0 < len(kept) <= 100 and reader.kept_bytes() <= bound
        assert all(isinstance(r["data"], LiveAnswer) for r in kept.values())
    finally:
        reader.stop()


def test_a_job_of_unreachable_pods_does_not_starve_another_job() -> None:
    # Job "big": 200 pods that never answer (SYNs dropped) until the test ends. Job "small":
    # one pod. Before, big's 200 reads filled the shared FIFO pool and small waited minutes.
    release = threading.Event()
    in_flight: list[int] = [0, 0]  # now, most
    lock = threading.Lock()

    def read(ip: str, port: int) -> object:
        if ip.startswith("10.9."):
            with lock:
                in_flight[0] += 1
                in_flight[1] = max(in_flight)
            release.wait(30)
            with lock:
                in_flight[0] -= 1
            return None
        return _bound(0, state="Training", groupRank=0)

    big = [pod(f"b-{i}", i, ready=True) for i in range(200)]
    for i, p in enumerate(big):
        p["status"]["podIP"] = f"10.9.{i // 200}.{i % 200}"
        p["metadata"]["uid"] = f"u-b-{i}"
    reader = RankMapReader(lambda _: None, read=read, sweep_seconds=0.5)
    reader.start()
    try:
        reader.track("big", big, attempt=0)
        _wait("big's reads to start", lambda: in_flight[0] > 0)
        reader.track("small", [pod("s-0", 0, ready=True)], attempt=0)
        _wait("small's answer", lambda: "u-s-0" in reader.live("small"))
        assert in_flight[1] <= rankmap.PER_JOB_READS
    finally:
        release.set()
        reader.stop()


def test_a_sweep_that_runs_out_of_time_starts_where_it_stopped_next_time() -> None:
    order: list[str] = []

    def read(ip: str, port: int) -> object:
        order.append(ip)
        return _bound(0, state="Training", groupRank=0)

    reader = RankMapReader(
        lambda _: None,
        read=read,
        per_job=1,
        sweep_seconds=0.0,
        schedule=ReadSchedule(steady=60),
    )
    pods = [pod(f"j-{i}", i, ready=True) for i in range(3)]
    reader.start()
    try:
        reader.track("j", pods, attempt=0)
        _wait("three sweeps", lambda: len(order) >= 3)
        # Each sweep read one pod (its deadline passed), each a different one, and the next
        # sweep came at once (not after the steady interval of a minute).
        assert sorted(order[:3]) == ["10.0.0.2", "10.0.0.3", "10.0.0.4"]
    finally:
        reader.stop()


def test_the_benchmark_address_gets_every_read_with_the_pods_ip_as_host(
    server: http.server.HTTPServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """TORCHRUN_OPERATOR_STATUS_ADDRESS (benchmarks only) sends every pod's read to one stub;
    the pod's IP in the Host header is how the stub knows which pod's binding to answer."""
    hosts: list[str] = []

    class Echo(_Handler):
        def do_GET(self) -> None:  # noqa: N802
            hosts.append(self.headers.get("Host", ""))
            super().do_GET()

    server.RequestHandlerClass = Echo
    _Handler.body = json.dumps({"v": 1, "rdzvId": "r", "index": 0}).encode()
    monkeypatch.setenv(statusread.ENV_ADDRESS_OVERRIDE, f"127.0.0.1:{server.server_address[1]}")
    read = statusread.default_read()
    assert read("10.1.2.3", 29401) == LiveAnswer("r", 0)
    assert read("10.1.2.4", 29401) == LiveAnswer("r", 0)
    assert hosts == ["10.1.2.3", "10.1.2.4"]
