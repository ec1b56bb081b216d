"""A running controller never loads the kubernetes client's generated CoreV1Api or
NetworkingV1Api: the client loads its API classes on first use, and CoreV1Api with the models
it imports is 21 MiB of the operator's memory (bench/README.md, "Memory"). Its pods,
Services, ConfigMaps and NetworkPolicies go through kube/client.py's thin requests instead."""

import subprocess
import sys
import textwrap

# Started against an address where nothing listens: the watchers' lists fail and back off,
# the workers wait, and whatever any of them would load has been loaded by then.
PROGRAM = textwrap.dedent(
    """
    import sys, time
    from kubernetes import client
    from torchrun_operator.controller.loop import Controller
    from torchrun_operator.kube import client as kclient

    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"
    ctrl = Controller(kclient.ApiClient(cfg), namespaces=["ns"], workers=2, kueue=True)
    ctrl.start()
    ctrl.set_active(True)
    ctrl.enqueue(("ns", "job"))
    deadline = time.monotonic() + 10
    while not all(w.backoff.streak for w in ctrl._watchers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(w.backoff.streak for w in ctrl._watchers), "the watchers never listed"
    ctrl.stop()
    print(sorted(m for m in sys.modules if m.startswith("kubernetes.client.api.")))
    """
)


def test_a_running_controller_loads_neither_core_nor_networking_api() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    loaded = out.strip().splitlines()[-1]
    assert "custom_objects_api" in loaded  # the probe sees what the controller loads
    assert "core_v1_api" not in loaded
    assert "networking_v1_api" not in loaded
