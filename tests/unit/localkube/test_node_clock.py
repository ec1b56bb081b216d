"""A process node's own clock (clockSkewSeconds): the times it writes are the host's plus
the skew, and the skew travels from NodeSpec through --nodes-json to the node's config."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from localkube.components import NodeSpec
from localkube.node.nodes import NodeConfig, node_status, now_micro, now_rfc3339


def parsed(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def seconds_from_host(text: str) -> float:
    return (parsed(text) - dt.datetime.now(dt.UTC)).total_seconds()


@pytest.mark.parametrize("skew", [3600.0, -6 * 3600.0, 0.0])
def test_node_times_are_the_hosts_plus_the_skew(skew: float) -> None:
    # Within a few seconds of the skew: the host's clock moves on between the two reads.
    assert abs(seconds_from_host(now_rfc3339(skew)) - skew) < 5
    assert abs(seconds_from_host(now_micro(skew)) - skew) < 5


def test_without_a_skew_a_node_writes_the_hosts_time() -> None:
    assert abs(seconds_from_host(now_rfc3339())) < 5
    assert now_micro().endswith("Z") and "." in now_micro()


def test_the_skew_goes_through_nodes_json_to_the_node() -> None:
    specs = [NodeSpec("ahead", clock_skew_seconds=3600), NodeSpec("plain")]
    entries = json.loads(json.dumps([s.to_json() for s in specs]))
    # A node without a skew is written as before (no new key).
    assert entries[1] == NodeSpec("plain").to_json() and "clockSkewSeconds" not in entries[1]
    configs = [NodeConfig.from_json(i, d) for i, d in enumerate(entries)]
    assert [c.clock_skew_seconds for c in configs] == [3600.0, 0.0]


def test_a_skewed_nodes_heartbeat_carries_its_own_time() -> None:
    cfg = NodeConfig("ahead", 0, clock_skew_seconds=3600)
    now = now_rfc3339(cfg.clock_skew_seconds)
    status = node_status(cfg, "10.0.0.2", now, now)
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert abs(seconds_from_host(ready["lastHeartbeatTime"]) - 3600) < 5
