"""kopf wiring: the shutdown order, and the liveness probe as kopf serves it."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import kopf
import pytest
from kopf._cogs.structs import ephemera
from kopf._core.engines import indexing, probing
from kopf._core.intents import registries
from torchrun_operator import handlers


class FakeController:
    def __init__(self, calls: list[str], dead: list[str] | None = None) -> None:
        self.calls = calls
        self.dead = dead or []

    def stop(self) -> None:
        self.calls.append("controller.stop")

    def dead_threads(self) -> list[str]:
        return self.dead


class FakeElector:
    def __init__(self, calls: list[str], dead: list[str] | None = None) -> None:
        self.calls = calls
        self.dead = dead or []

    def dead_threads(self) -> list[str]:
        return self.dead

    def stop(self) -> None:
        self.calls.append("elector.stop")  # releases the Lease


@pytest.fixture(autouse=True)
def state() -> Iterator[dict[str, Any]]:
    saved = dict(handlers._state)
    handlers._state.clear()
    yield handlers._state
    handlers._state.clear()
    handlers._state.update(saved)


def test_cleanup_stops_the_workers_before_it_releases_the_lease(state: dict[str, Any]) -> None:
    calls: list[str] = []
    state["controller"] = FakeController(calls)
    state["elector"] = FakeElector(calls)
    handlers.cleanup()  # type: ignore[call-arg]  # kopf types it as its callback protocol
    assert calls == ["controller.stop", "elector.stop"]


def test_the_probe_fails_permanently_on_a_dead_thread(state: dict[str, Any]) -> None:
    # kopf types a decorated handler as its callback protocol (with the arguments kopf
    # passes); the test calls the plain function underneath. Before startup: nothing to be dead.
    assert handlers.threads_alive() == "ok"  # type: ignore[call-arg]
    state["controller"] = FakeController([])
    assert handlers.threads_alive() == "ok"  # type: ignore[call-arg]
    state["controller"] = FakeController([], dead=["worker-3", "podwatch-all"])
    with pytest.raises(kopf.PermanentError, match="podwatch-all, worker-3"):
        handlers.threads_alive()  # type: ignore[call-arg]
    state["controller"] = FakeController([])
    state["elector"] = FakeElector([], dead=["leader-election"])
    with pytest.raises(kopf.PermanentError, match="leader-election"):
        handlers.threads_alive()  # type: ignore[call-arg]


def healthz(registry: registries.OperatorRegistry) -> tuple[int, bytes]:
    """One GET of kopf's liveness endpoint, served with `registry`'s probes."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/healthz"

    def get() -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(url, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    async def main() -> tuple[int, bytes]:
        ready = asyncio.Event()
        server = asyncio.create_task(
            probing.health_reporter(
                url,
                memo=ephemera.AnyMemo(ephemera.Memo()),
                indices=indexing.OperatorIndexers().indices,
                registry=registry,
                settings=kopf.OperatorSettings(),
                ready_flag=ready,
            )
        )
        await ready.wait()
        try:
            return await asyncio.to_thread(get)
        finally:
            server.cancel()

    return asyncio.run(main())


def test_kopf_answers_500_on_healthz_while_a_thread_is_dead(state: dict[str, Any]) -> None:
    registry = registries.OperatorRegistry()
    kopf.on.probe(id="threads", registry=registry)(handlers.threads_alive)
    state["controller"] = FakeController([])
    assert healthz(registry) == (200, b'{"threads": "ok"}')
    state["controller"] = FakeController([], dead=["worker-0"])
    code, _ = healthz(registry)
    assert code == 500
