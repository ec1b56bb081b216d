"""Fault injection at the ApiClient seam, against a fake transport."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import urllib3
from fake_transport import FakeTransport, api
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube.testing import wait_for
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube import faults

OPERATOR = Path(__file__).resolve().parents[3] / "operator"


def core(transport: FakeTransport, *rules: dict[str, Any], log: Path | None = None) -> Any:
    config: dict[str, Any] = {"rules": list(rules)}
    if log is not None:
        config["log"] = str(log)
    return client.CoreV1Api(api(transport, faults.Injector.from_config(config)))


@pytest.mark.parametrize("code", [500, 409, 404, 503])
def test_status_answers_that_code_without_sending(code: int) -> None:
    t = FakeTransport()
    c = core(t, {"method": "GET", "path": "/pods/p$", "action": "status", "status": code})
    with pytest.raises(ApiException) as e:
        c.read_namespaced_pod("p", "ns")
    assert e.value.status == code
    assert e.value.body is not None
    assert json.loads(e.value.body)["code"] == code  # a Status body, as the apiserver sends
    assert t.sent == []


def test_429_carries_retry_after() -> None:
    t = FakeTransport()
    c = core(t, {"action": "status", "status": 429, "retry_after": 3})
    with pytest.raises(ApiException) as e:
        c.list_namespaced_pod("ns", _preload_content=False)  # the raw path, as the watch uses
    assert e.value.status == 429
    assert e.value.headers is not None and e.value.headers["Retry-After"] == "3"


def test_timeout_raises_urllib3s_timeout_without_sending() -> None:
    t = FakeTransport()
    c = core(t, {"action": "timeout"})
    with pytest.raises(urllib3.exceptions.TimeoutError):
        c.read_namespaced_pod("p", "ns")
    assert t.sent == []


def test_lose_response_sends_then_times_out() -> None:
    t = FakeTransport()
    c = core(t, {"method": "writes", "action": "lose_response"})
    c.read_namespaced_pod("p", "ns")  # a read: not a write, passes
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        c.delete_namespaced_pod("p", "ns")
    assert [s.method for s in t.sent] == ["GET", "DELETE"]  # the delete did happen


def test_late_gives_up_at_once_and_sends_the_request_afterwards(tmp_path: Path) -> None:
    t = FakeTransport()
    log = tmp_path / "faults.log"
    c = core(t, {"method": "POST", "action": "late", "delay": 0.2}, log=log)
    with pytest.raises(urllib3.exceptions.ReadTimeoutError):
        c.create_namespaced_pod("ns", {"metadata": {"name": "p"}})
    assert t.sent == []  # the client gave up before the request went out ...
    assert [json.loads(x)["action"] for x in log.read_text().splitlines()] == ["late"]
    wait_for("the late create", lambda: t.sent, 10, interval=0.05)  # ... which then did
    assert [s.method for s in t.sent] == ["POST"]


class Killed(Exception):
    pass


@pytest.mark.parametrize(("action", "sent"), [("kill_before", 0), ("kill_after", 1)])
def test_kill_actions_signal_this_process(
    action: str, sent: int, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    kills: list[tuple[int, int]] = []

    def fake_kill(pid: int, sig: int) -> None:
        kills.append((pid, sig))
        raise Killed

    monkeypatch.setattr(os, "kill", fake_kill)
    t = FakeTransport()
    log = tmp_path / "faults.log"
    c = core(t, {"method": "POST", "action": action}, log=log)
    with pytest.raises(Killed):
        c.create_namespaced_pod("ns", {"metadata": {"name": "p"}})
    assert kills == [(os.getpid(), signal.SIGKILL)]
    assert len(t.sent) == sent
    assert json.loads(log.read_text())["action"] == action  # logged before the kill


def test_a_real_sigkill_leaves_the_log_line(tmp_path: Path) -> None:
    log = tmp_path / "faults.log"
    script = textwrap.dedent(
        f"""
        from torchrun_operator.kube import faults
        inj = faults.Injector.from_config(
            {{"log": {str(log)!r}, "rules": [{{"action": "kill_after"}}]}}
        )
        url = "https://x/apis/coordination.k8s.io/v1/leases/l"
        inj.call("PUT", url, lambda: print("sent", flush=True))
        print("survived")
        """
    )
    p = subprocess.run(
        [sys.executable, "-c", script],
        env={"PYTHONPATH": str(OPERATOR)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == -signal.SIGKILL
    assert p.stdout.split() == ["sent"]
    line = json.loads(log.read_text())
    assert line["action"] == "kill_after" and line["method"] == "PUT"
    assert line["path"] == "/apis/coordination.k8s.io/v1/leases/l"


def test_nth_and_times_count_matches_per_rule(tmp_path: Path) -> None:
    t = FakeTransport()
    log = tmp_path / "faults.log"
    c = core(
        t,
        {"method": "GET", "path": "/pods/a$", "nth": 2, "times": 2, "action": "status"},
        {"method": "GET", "path": "/pods/", "nth": 5, "action": "timeout"},
        log=log,
    )
    results = []
    for name in ["a", "b", "a", "a", "a", "b"]:
        try:
            c.read_namespaced_pod(name, "ns")
            results.append("ok")
        except ApiException as e:
            results.append(str(e.status))
        except urllib3.exceptions.TimeoutError:
            results.append("timeout")
    # rule 0 counts only pod a: its 2nd and 3rd reads fail; rule 1 counts every pod read
    # and fires on the 5th, which rule 0 (done by then) lets through.
    assert results == ["ok", "ok", "500", "500", "timeout", "ok"]
    lines = [json.loads(x) for x in log.read_text().splitlines()]
    assert [(x["rule"], x["n"]) for x in lines] == [(0, 2), (0, 3), (1, 5)]


def test_times_all_fails_every_match_from_nth_on() -> None:
    t = FakeTransport()
    rule = {"method": "PUT", "path": "/leases/", "nth": 2, "times": "all", "action": "timeout"}
    coord = client.CoordinationV1Api(core(t, rule).api_client)
    lease: Any = {"metadata": {"name": "l"}}  # the client sends a dict body as it is
    coord.replace_namespaced_lease("l", "ns", lease)
    for _ in range(3):
        with pytest.raises(urllib3.exceptions.TimeoutError):
            coord.replace_namespaced_lease("l", "ns", lease)


def test_off_unless_the_env_names_a_file(tmp_path: Path) -> None:
    assert faults.from_env({}) is None
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"rules": [{"action": "timeout"}]}))
    injector = faults.from_env({faults.ENV: str(path)})
    assert injector is not None and len(injector.rules) == 1
    assert kclient.ApiClient(client.Configuration(host="https://x")).injector is None


@pytest.mark.parametrize(
    "rule",
    [
        {"action": "explode"},
        {"action": "timeout", "nht": 2},
        {"action": "timeout", "times": 0},
        {"action": "timeout", "nth": 0},
    ],
)
def test_a_bad_rule_is_an_error_not_a_silent_no_op(rule: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        faults.Injector.from_config({"rules": [rule]})
