"""The local cluster beside a running Docker engine.

Docker sets the iptables FORWARD policy to DROP and loads br_netfilter, so frames between two
ports of the cluster's bridge pass FORWARD and would be dropped; the rules localkube adds for
its bridge (localkube.network.forward_rules) carry them. One test proves the rule set with a
negative control in private network namespaces (without the rules pod to pod fails, with them
it works); another runs two pods of the session's cluster beside the running dockerd and reads
the rules' packet counters.

No engine is no skip: hack/docker.sh installs (apt) and starts dockerd when none answers,
which needs root, as CI has; when it cannot, the tests fail with its output.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from docker_fixtures import REPO, ended, python_pod, sh, start_pair
from kubernetes import client
from localkube import network
from localkube.testing import wait_for

pytestmark = pytest.mark.slow


def rule_packets(bridge: str) -> int:
    """Packets the ACCEPT rules for `bridge` have let through, FORWARD and DOCKER-USER."""
    total = 0
    for chain in network.FORWARD_CHAINS:
        out = sh("iptables", "-w", "5", "-v", "-S", chain, check=False)
        for line in out.stdout.splitlines():
            m = re.search(r"-c (\d+) \d+", line)
            if f'"localkube {bridge}"' in line and line.endswith("-j ACCEPT") and m:
                total += int(m.group(1))
    return total


def pod(name: str, node: str, script: str) -> dict[str, Any]:
    return python_pod(name, node, script, image="python:3.11", grace_s=1)


ECHO_SERVER = """
import socket
s = socket.create_server(("0.0.0.0", 7000))
while True:
    c, _ = s.accept()
    c.sendall(c.recv(100))
    c.close()
"""


def can_connect(ns: str, ip: str) -> bool:
    probe = (
        "import socket, sys\n"
        "try:\n"
        f"    c = socket.create_connection(('{ip}', 7000), timeout=2)\n"
        "    c.sendall(b'x'); sys.exit(0 if c.recv(1) == b'x' else 1)\n"
        "except OSError:\n"
        "    sys.exit(1)\n"
    )
    return sh("ip", "netns", "exec", ns, sys.executable, "-c", probe, check=False).returncode == 0


def test_forward_rules_beat_dockers_drop_policy_in_a_private_netns(docker_engine: None) -> None:
    """The rule set alone, with a negative control, away from the host's firewall: a
    namespace plays the host (localkube's bridge, FORWARD policy DROP as Docker sets it,
    br_netfilter on), two more play pods. Pod to pod fails without the rules, works with
    them, and fails again once they are removed."""
    tag = f"lkfw{os.getpid() % 100000}"
    host, pod_a, pod_b = f"{tag}-h", f"{tag}-a", f"{tag}-b"
    # Outside the bases test clusters pick (200-254): no cluster's cleanup takes these for its
    # own leftovers.
    net = network.PodNetwork(tag, 197)
    in_host = ["ip", "netns", "exec", host]
    rules_py = (
        "import sys; from localkube import network as n\n"
        f"net = n.PodNetwork({tag!r}, {net.base})\n"
        "print(n.allow_forwarding(net) if sys.argv[1] == 'allow' else n.remove_forwarding(net))"
    )

    def rules(action: str) -> str:
        env = {**os.environ, "PYTHONPATH": str(REPO / "cluster")}
        cmd = [*in_host, sys.executable, "-c", rules_py, action]
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        assert out.returncode == 0, out.stderr
        return out.stdout

    server = None
    try:
        for ns in (host, pod_a, pod_b):
            sh("ip", "netns", "add", ns)
        for cmd in network.bridge_up_commands(net):
            sh(*in_host, *cmd)
        sh(*in_host, "iptables", "-P", "FORWARD", "DROP")
        nf_call = "/proc/sys/net/bridge/bridge-nf-call-iptables"
        sh(*in_host, "sh", "-c", f"echo 1 > {nf_call}")
        for i, ns in enumerate((pod_a, pod_b)):
            port = f"{tag}v{i}"
            sh("ip", "-n", host, "link", "add", port, "type", "veth", "peer", "eth0", "netns", ns)
            sh("ip", "-n", host, "link", "set", port, "master", net.bridge, "up")
            sh("ip", "-n", ns, "addr", "add", f"10.{net.base}.{i + 1}.2/16", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
        peer = f"10.{net.base}.2.2"
        server = subprocess.Popen(["ip", "netns", "exec", pod_b, sys.executable, "-c", ECHO_SERVER])
        # The host reaches pod b (no forwarding involved): the server is up.
        wait_for("echo server", lambda: can_connect(host, peer), timeout=30)

        assert not can_connect(pod_a, peer), "DROP policy did not stop bridged traffic"
        assert "FORWARD" in rules("allow")
        assert can_connect(pod_a, peer), sh(*in_host, "iptables", "-v", "-S").stdout
        assert "lk-" in rules("remove")
        assert not can_connect(pod_a, peer)
    finally:
        if server is not None:
            server.kill()
            server.wait()
        for ns in (pod_a, pod_b, host):
            sh("ip", "netns", "delete", ns, check=False)


def test_pods_talk_across_the_bridge_while_dockerd_runs(
    docker_engine: None, cluster: Any, kube: client.ApiClient, namespace: str
) -> None:
    # The typed client wants model objects; plain dicts work (as in test_process_node).
    core: Any = client.CoreV1Api(kube)
    bridge = cluster.net.bridge
    rules = network.forward_rules(cluster.net)
    # The cluster may have come up before dockerd: FORWARD holds the rules in any case.
    assert sh("iptables", "-w", "5", "-C", "FORWARD", *rules[0], check=False).returncode == 0, sh(
        "iptables", "-w", "5", "-S", check=False
    ).stdout
    policy = sh("iptables", "-w", "5", "-S", "FORWARD").stdout.splitlines()[0]
    nf_call = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")
    assert nf_call.exists() and nf_call.read_text().strip() == "1", (
        "br_netfilter is not filtering bridged frames: dockerd (default flags) loads it"
    )
    before = rule_packets(bridge)

    nodes = [n.name for n in cluster.nodes]
    start_pair(core, namespace, pod, on=(nodes[0], nodes[-1]))
    phases = [
        wait_for(f"{n} done", lambda n=n: ended(core, namespace, n), timeout=90)
        for n in ("client", "server")
    ]
    logs = {
        n: (Path(cluster.layout.node_state) / "logs" / namespace / n / "main.log").read_text()
        for n in ("client", "server")
    }
    assert phases == ["Succeeded", "Succeeded"], (policy, logs)
    assert "REPLY pong" in logs["client"] and "GOT ping" in logs["server"], logs
    # The exchange crossed FORWARD (br_netfilter) and our ACCEPT took it, before the policy
    # (Docker's DROP) or any of Docker's rules could.
    assert rule_packets(bridge) > before, (policy, sh("iptables", "-v", "-S").stdout)
