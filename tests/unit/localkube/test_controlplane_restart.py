"""Cluster.restart_component: a component killed and started again with its own argv."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest
from localkube import procs
from localkube.components import Ports
from localkube.controlplane import Cluster, ready_url

PORTS = Ports(2001, 2002, 6443, 10257, 10259, 8080, 8181)


def test_each_restartable_component_is_probed_where_start_waits_for_it() -> None:
    server = "https://127.0.0.1:6443"
    assert ready_url("kube-apiserver", server, PORTS) == f"{server}/readyz"
    assert ready_url("etcd", server, PORTS) == "http://127.0.0.1:2001/health"
    assert ready_url("kube-scheduler", server, PORTS) == "https://127.0.0.1:10259/healthz"
    with pytest.raises(ValueError, match="cannot restart 'coredns'"):
        ready_url("coredns", server, PORTS)


def _cluster(tmp_path: Path, port: int) -> Cluster:
    c = Cluster(tmp_path / "c", nodes=[])
    c.layout.logs.mkdir(parents=True)
    ports = dataclasses.replace(PORTS, etcd_client=port)
    c.layout.state.write_text(json.dumps({"ports": dataclasses.asdict(ports)}))
    return c


def test_a_component_is_killed_and_started_again_with_the_argv_it_had(tmp_path: Path) -> None:
    port = procs.free_port()
    c = _cluster(tmp_path, port)
    (c.dir / "health").write_text("ok")  # what the stand-in for etcd serves at /health
    argv = [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1",
            "--directory", str(c.dir)]  # fmt: skip
    first = c._launch("etcd", argv)
    try:
        new = c.restart_component("etcd", timeout=30)
        assert new != first.pid
        assert not procs.pid_alive(first.pid)
        assert procs.is_ours(new, str(c.dir))
        assert procs.cmdline(new) == argv
        assert c.status()["components"]["etcd"] == {"pid": new, "running": True}
    finally:
        for pid in c._read_pids().values():
            procs.stop(pid, grace=1)


def test_a_component_that_is_not_running_is_not_started(tmp_path: Path) -> None:
    c = _cluster(tmp_path, procs.free_port())
    with pytest.raises(RuntimeError, match="etcd .* is not running"):
        c.restart_component("etcd")
