"""The launcher reaches the rendezvous store where it is (launcher/rdzvstore.py)."""

from __future__ import annotations

import socket
import time
from typing import Any

import pytest
from torchrun_operator.launcher import rdzvstore


def test_wait_for_dns_times_out_and_succeeds() -> None:
    calls: list[str] = []

    def never(host: str) -> object:
        calls.append(host)
        raise OSError("Name or service not known")

    assert rdzvstore.wait_for_dns("job-0.job", 0.3, resolve=never, interval=0.05) is False
    assert calls and set(calls) == {"job-0.job"}

    attempts = iter([OSError("not yet"), OSError("not yet")])

    def later(host: str) -> object:
        err = next(attempts, None)
        if err:
            raise err
        return [(2, 1, 6, "", ("10.0.0.7", 0))]

    assert rdzvstore.wait_for_dns("job-0.job", 5, resolve=later, interval=0.01) is True


def test_wait_for_dns_bounds_a_hanging_resolver() -> None:
    def hang(host: str) -> object:
        time.sleep(10)
        return []

    start = time.monotonic()
    assert rdzvstore.wait_for_dns("job-0.job", 0.5, resolve=hang) is False
    assert time.monotonic() - start < 2


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("job-0.job:29400", ("job-0.job", 29400)),
        ("job-0.job", ("job-0.job", rdzvstore.DEFAULT_PORT)),
        ("[fd00::1]:1234", ("fd00::1", 1234)),
        ("fd00::1", ("fd00::1", rdzvstore.DEFAULT_PORT)),
        ("10.0.0.1:5", ("10.0.0.1", 5)),
    ],
)
def test_split_endpoint(endpoint: str, expected: tuple[str, int]) -> None:
    assert rdzvstore.split_endpoint(endpoint) == expected


def test_the_store_host_reaches_its_store_over_loopback() -> None:
    assert rdzvstore.hosts_store({"is_host": "1", "join_timeout": "30"})
    assert not rdzvstore.hosts_store({"is_host": "0"})
    assert not rdzvstore.hosts_store({})
    assert rdzvstore.loopback_endpoint("job-0.job:29411") == "localhost:29411"


@pytest.fixture
def listener() -> Any:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield s
    s.close()


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_stale_address_is_resolved_again_until_the_store_answers(listener: Any) -> None:
    """The name first resolves to an address where nothing listens (an earlier attempt's pod
    0), then to the live store: the wait ends once the live one accepts."""
    port = listener.getsockname()[1]
    answers = [[("127.0.0.1", closed_port())]] * 3 + [[("127.0.0.1", port)]]
    asked: list[tuple[str, int]] = []

    def resolve(host: str, p: int) -> list[Any]:
        asked.append((host, p))
        return answers[min(len(asked) - 1, len(answers) - 1)]

    # Real connects: the stale address refuses, the live one accepts.
    assert rdzvstore.wait_for_store(f"job-0.job:{port}", 10, resolve=resolve, interval=0.01)
    assert len(asked) == 4 and asked[0] == ("job-0.job", port)


def test_a_store_that_answers_at_once_costs_one_try(listener: Any) -> None:
    port = listener.getsockname()[1]
    calls = []

    def resolve(host: str, p: int) -> list[Any]:
        calls.append(host)
        return [("127.0.0.1", port)]

    started = time.monotonic()
    assert rdzvstore.wait_for_store(f"h:{port}", 10, resolve=resolve)
    assert calls == ["h"] and time.monotonic() - started < 1.0


def test_the_wait_is_bounded_and_then_gives_way_to_torch() -> None:
    """Nothing answers (and a resolver that fails, and one that hangs): False after the
    bound, never an exception, never much later."""
    dead = closed_port()
    failing: list[int] = []

    def flaky(host: str, p: int) -> list[Any]:
        failing.append(1)
        if len(failing) % 2:
            raise socket.gaierror("Name or service not known")
        return [("127.0.0.1", dead)]

    started = time.monotonic()
    assert not rdzvstore.wait_for_store(f"h:{dead}", 0.5, resolve=flaky, interval=0.05)
    assert time.monotonic() - started < 2.0 and len(failing) > 2

    def hang(host: str, p: int) -> list[Any]:
        time.sleep(60)
        return []

    started = time.monotonic()
    assert not rdzvstore.wait_for_store("h:1", 0.2, resolve=hang)
    assert time.monotonic() - started < rdzvstore.CONNECT_TIMEOUT * 2 + 1.0


def test_an_address_that_drops_packets_costs_one_connect_timeout() -> None:
    """A stale address no pod holds is dropped silently: each try gives up after
    CONNECT_TIMEOUT and the name is resolved again."""
    tries: list[float] = []

    def connect(address: Any, timeout: float) -> None:
        tries.append(timeout)
        raise TimeoutError("timed out")

    assert not rdzvstore.wait_for_store(
        "h:1", 0.3, resolve=lambda h, p: [("10.0.0.9", 1)], connect=connect, interval=0.05
    )
    assert tries and set(tries) == {rdzvstore.CONNECT_TIMEOUT}


@pytest.mark.parametrize(
    ("conf", "hosts"),
    [
        ("is_host=1,join_timeout=600", True),
        ("join_timeout=600, is_host = true", True),
        ("is_host=0,join_timeout=600", False),
        ("join_timeout=600", False),
        ("", False),
        (None, False),
        ("is_host", False),
    ],
)
def test_whether_an_unparsed_rdzv_conf_hosts_the_store(conf: str | None, hosts: bool) -> None:
    assert rdzvstore.conf_hosts_store(conf) is hosts
