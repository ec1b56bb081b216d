"""`kubectl logs` through the API, on any cluster: the apiserver asks the pod's node for the
container's log (a kubelet, or the local cluster's process node: localkube.node.logserver).
The tests read logs this way rather than from the process node's files, so that they hold on
kind too.

One pod, restarted once by its kubelet: its first run prints three lines and fails, its second
prints a line every quarter second. The log of each run, its tail, a byte limit and a follow
that sees lines written after it began."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from dtj import IMAGE, SMALL, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube.testing import create_namespace, namespace_name

SCRIPT = """\
import os, sys, time
marker = "/scratch/ran-once"
if not os.path.exists(marker):
    open(marker, "w").close()
    for i in range(3):
        print(f"first run line {i}", flush=True)
    sys.exit(3)
for i in range(2400):
    print(f"second run line {i}", flush=True)
    time.sleep(0.25)
"""


def numbers(text: str) -> list[int]:
    return [int(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line]


@pytest.fixture(scope="module")
def restarted(kube: client.ApiClient) -> Iterator[tuple[Any, str]]:
    """The pod, once its second run has printed a few lines."""
    core: Any = client.CoreV1Api(kube)
    ns = namespace_name("pod-logs")
    create_namespace(kube, ns)
    pod: dict[str, Any] = {
        "metadata": {"name": "talker"},
        "spec": {
            "restartPolicy": "OnFailure",
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {
                    "name": "main",
                    "image": IMAGE,
                    "command": ["python", "-c", SCRIPT],
                    "resources": SMALL,
                    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
                }
            ],
            "volumes": [{"name": "scratch", "emptyDir": {}}],
        },
    }
    core.create_namespaced_pod(ns, pod)

    def second_run_printing() -> bool:
        p = core.read_namespaced_pod("talker", ns)
        cs = (p.status.container_statuses or [None])[0]
        if cs is None or not cs.restart_count or cs.state.running is None:
            return False
        text = core.read_namespaced_pod_log("talker", ns, container="main")
        return "second run line 3\n" in text

    # The kubelet's first restart waits its back-off (10 s), after the image is there.
    wait_for("the pod's second run to print", second_run_printing, 120, interval=0.5)
    yield core, ns
    core.delete_namespace(ns)


def test_the_previous_run_and_the_current_one(restarted: tuple[Any, str]) -> None:
    core, ns = restarted
    earlier = core.read_namespaced_pod_log("talker", ns, container="main", previous=True)
    assert earlier == "first run line 0\nfirst run line 1\nfirst run line 2\n"
    now = core.read_namespaced_pod_log("talker", ns, container="main")
    assert now.startswith("second run line 0\nsecond run line 1\n"), now[:200]
    assert numbers(now) == list(range(len(numbers(now))))


def test_tail_lines_and_limit_bytes(restarted: tuple[Any, str]) -> None:
    core, ns = restarted
    last = core.read_namespaced_pod_log("talker", ns, container="main", tail_lines=2)
    assert len(last.splitlines()) == 2 and last.startswith("second run line "), last
    a, b = numbers(last)
    assert b == a + 1 and a >= 2
    assert core.read_namespaced_pod_log("talker", ns, container="main", limit_bytes=6) == "second"


def test_follow_sees_lines_written_after_it_began(restarted: tuple[Any, str]) -> None:
    core, ns = restarted
    before = numbers(core.read_namespaced_pod_log("talker", ns, container="main"))[-1]
    resp = core.read_namespaced_pod_log(
        "talker", ns, container="main", follow=True, tail_lines=1, _preload_content=False
    )
    seen: list[int] = []
    rest = b""
    try:
        for chunk in resp.stream(64):
            *lines, rest = (rest + chunk).split(b"\n")
            seen += numbers(b"\n".join(lines).decode())
            if seen and seen[-1] >= before + 4:
                break
    finally:
        resp.release_conn()
    # At least four lines printed after the follow began (a quarter second apart), read while
    # the container ran on.
    assert seen and seen[-1] >= before + 4, (before, seen)


def test_a_container_the_pod_does_not_have_is_refused(
    restarted: tuple[Any, str],
) -> None:
    core, ns = restarted
    with pytest.raises(ApiException) as e:
        core.read_namespaced_pod_log("talker", ns, container="nope")
    assert e.value.status == 400 and "nope" in str(e.value.body)
