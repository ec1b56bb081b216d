"""The per-job NetworkPolicy, enforced with real packets: on the local cluster's process nodes
(kube-network-policies, fed by localkube's iptables NFQUEUE rule: localkube.netpol) and on
kind as hack/kind.sh builds it (the same enforcer as a DaemonSet on every node:
images/kind-node/netpol.sh); docs/security.md.

One job is probed while it runs: its pods have trained (gloo all-reduce) and then hold their
ports open, until the test says "release" on a notice board (an unprotected pod that keeps
what is PUT to it and serves it back: the test and the pods reach it on any cluster, and no
volume is shared between nodes). While they wait:

- a pod of another job (a real DistributedTrainingJob) and a pod of another namespace that
  carries the job's own label try the rendezvous port of pod 0 and the status ports of both
  pods: every connection times out (the SYN is dropped), while the same probers reach the
  unprotected board, so the network itself works for them; they post what they saw there;
- the operator, which reads the status port from the host, keeps the job's live progress
  current: steps the launchers reported after enforcement began reach the job's status;
- the job's own pods, released, open new connections to pod 0's rendezvous and status ports
  and a new gloo group (new connections on ephemeral ports), and the job succeeds.

On the local cluster, probes start only once the enforcer is bound to its queue and judges
the victim's pods: the queue lets packets pass while nobody reads it (fail open), and the
enforcer learns a pod's address from the API. A connection from a host process that is not
root, which no policy admits, is dropped once both hold; the queue is still bound after the
probes. The first test fails, not skips, where the cluster enforces nothing.
(localkube's own enforcer, killed: tests/localkube/test_netpol_enforcer.py.)
"""

from __future__ import annotations

import json
import os
import socket
import urllib.request
from collections.abc import Iterator
from typing import Any

import jobs
import pytest
from dtj import IMAGE, SMALL, apply, get_job, job_pods, wait_for, wait_phase
from kubernetes import client
from localkube import netpol
from localkube.controlplane import Cluster
from localkube.testing import create_namespace, namespace_name

pytestmark = pytest.mark.usefixtures("operator")

RDZV_PORT = 29400
STATUS_PORT = 29401
BOARD_PORT = 8080
# How long a prober waits for a connection. A dropped SYN is retried by the kernel and never
# answered, so a refused port shows as "timeout"; an open one answers within milliseconds.
CONNECT_TIMEOUT = 8.0

# The victim: trains a few steps, then counts steps (the progress file the launcher serves on
# its status port) until the test posts "release" on the board; then, with enforcement on, opens new
# connections to pod 0's ports and a new gloo group, and finishes.
VICTIM = """\
import os, socket, time, urllib.request
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 4), torch.randn(32, 1)
losses = []
for step in range(10):
    opt.zero_grad()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= world
    opt.step()
    losses.append(loss.item())
assert losses[-1] < losses[0], losses
print(f"rank {rank}: loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)

def released():
    try:
        with urllib.request.urlopen(os.environ["BOARD"] + "/release", timeout=2):
            return True
    except OSError:  # 404 until the test says so (HTTPError is an OSError)
        return False

progress = os.environ["TORCHRUN_OPERATOR_PROGRESS_FILE"]
step = 0
while not released():
    step += 1
    if os.environ["LOCAL_RANK"] == "0":
        with open(progress + ".tmp", "w") as f:
            f.write(f"{step}\\n")
        os.replace(progress + ".tmp", progress)
    time.sleep(0.5)

def address(host, patience=60.0):
    # Pod 0 by name, with patience: a CI run saw one lookup fail (EAI_AGAIN) from the cluster
    # DNS, which no policy judges (ingress only), and the connections below are what is tested.
    deadline = time.monotonic() + patience
    while True:
        try:
            return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
        except socket.gaierror as e:
            if time.monotonic() > deadline:
                raise
            print(f"rank {rank}: {host} did not resolve ({e}); again", flush=True)
            time.sleep(1)

# Enforced now: new connections from this job's pods to pod 0's ports pass.
pod0 = os.environ["POD0"]
ip0 = address(pod0)
for port in (int(os.environ["RDZV_PORT"]), int(os.environ["STATUS_PORT"])):
    socket.create_connection((ip0, port), timeout=30).close()
group = dist.new_group(backend="gloo")  # new gloo connections, on ephemeral ports
t = torch.ones(1)
dist.all_reduce(t, group=group)
assert t.item() == world, t
print(f"rank {rank}: reached {pod0} {os.environ['RDZV_PORT']},{os.environ['STATUS_PORT']}"
      f" and all-reduced on a new group", flush=True)
dist.destroy_process_group()
"""

# The notice board: keeps what is PUT at a path and serves it back (404 until then).
BOARD = """\
import http.server, sys
store = {}
class Board(http.server.BaseHTTPRequestHandler):
    def do_PUT(self):
        store[self.path] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(204)
        self.end_headers()
    def do_GET(self):
        body = store.get(self.path)
        self.send_response(404 if body is None else 200)
        self.end_headers()
        self.wfile.write(body or b"")
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", int(sys.argv[1])), Board).serve_forever()
"""

# A prober: tries each target, PUTs {target: "open"|"refused"|"timeout"} at <board>/<name>.
PROBE = """\
import json, socket, sys, threading, urllib.request
name, timeout, board, targets = sys.argv[1], float(sys.argv[2]), sys.argv[3], sys.argv[4:]
result = {}

def probe(target):
    host, port = target.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
        result[target] = "open"
    except socket.timeout:
        result[target] = "timeout"
    except ConnectionRefusedError:
        result[target] = "refused"
    except OSError as e:
        result[target] = f"error: {e}"

threads = [threading.Thread(target=probe, args=(t,)) for t in targets]
for t in threads:
    t.start()
for t in threads:
    t.join()
put = urllib.request.Request(f"{board}/{name}", json.dumps(result).encode(), method="PUT")
urllib.request.urlopen(put, timeout=30).close()
"""


def victim_job(name: str, board: str) -> list[dict[str, Any]]:
    env = {
        "POD0": f"{name}-0.{name}",
        "RDZV_PORT": str(RDZV_PORT),
        "STATUS_PORT": str(STATUS_PORT),
        "BOARD": board,
    }
    return jobs.scripted(
        name,
        {"train.py": VICTIM},
        ["python", "/workspace/train.py"],
        nodes=2,
        nproc=1,
        image=IMAGE,
        trainer={"env": [{"name": k, "value": v} for k, v in env.items()], "resources": SMALL},
        pod={"terminationGracePeriodSeconds": 3},
        rendezvous={"port": RDZV_PORT, "joinTimeoutSeconds": 120},
        failurePolicy={"maxRestarts": 0},
        runPolicy={"cleanPodPolicy": "KeepAll"},
    )


def probe_args(name: str, board: str, targets: list[str]) -> list[str]:
    return ["python", "-c", PROBE, name, str(CONNECT_TIMEOUT), board, *targets]


def prober_job(name: str, board: str, targets: list[str]) -> list[dict[str, Any]]:
    """A pod of another job: a one-pod DistributedTrainingJob whose worker probes."""
    return [
        jobs.job(
            name,
            nodes=1,
            nproc=1,
            image=IMAGE,
            command=probe_args(name, board, targets),
            trainer={"resources": SMALL},
            pod={"terminationGracePeriodSeconds": 2},
            failurePolicy={"maxRestarts": 0},
        )
    ]


def plain_pod(name: str, command: list[str], labels: dict[str, str] | None = None) -> Any:
    """A Pod manifest (Any: the client's create takes dicts, though its stubs say V1Pod)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": False,
            "containers": [{"name": "main", "image": "python:3.11", "command": command}],
        },
    }


def board_get(board: str, path: str) -> bytes | None:
    """What the board holds at `path`, or None (not posted yet, or the board not answering)."""
    try:
        with urllib.request.urlopen(f"{board}/{path}", timeout=5) as resp:
            body: bytes = resp.read()
            return body
    except (OSError, ValueError):
        return None


def board_put(board: str, path: str, body: bytes) -> None:
    urllib.request.urlopen(
        urllib.request.Request(f"{board}/{path}", body, method="PUT"), timeout=10
    ).close()


def running_ip(core: client.CoreV1Api, namespace: str, name: str) -> str | None:
    pod: Any = core.read_namespaced_pod(name, namespace)
    return pod.status.pod_ip if pod.status.phase == "Running" else None


def connect_as(uid: int, ip: str, port: int) -> str:
    """A connection from the host by a process of this uid: "open" or "timeout"/"refused"."""
    pid = os.fork()
    if pid == 0:  # the child: no threads, no Python cleanup; its exit code is the answer
        code = 1
        try:
            os.setgid(uid)
            os.setuid(uid)
            socket.create_connection((ip, port), timeout=CONNECT_TIMEOUT).close()
            code = 0
        except TimeoutError:
            code = 2
        except ConnectionRefusedError:
            code = 3
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return {0: "open", 2: "timeout", 3: "refused"}.get(os.waitstatus_to_exitcode(status), "error")


@pytest.fixture
def other_namespace(kube: client.ApiClient) -> Iterator[str]:
    name = namespace_name("netpol-other")
    create_namespace(kube, name)
    yield name
    client.CoreV1Api(kube).delete_namespace(name)


def test_only_the_jobs_pods_and_the_operator_reach_its_ports_and_the_job_trains(
    kube: client.ApiClient, namespace: str, other_namespace: str, cluster: Any
) -> None:
    local = isinstance(cluster, Cluster)
    if local and not cluster.network_policies:
        pytest.fail("the session's cluster enforces no NetworkPolicy: run cluster/build.sh netpol")
    core = client.CoreV1Api(kube)
    name = "victim"

    # The board: no policy selects it, so every prober and the test must reach it.
    core.create_namespaced_pod(
        namespace, plain_pod("board", ["python", "-c", BOARD, str(BOARD_PORT)])
    )
    board_ip = wait_for("the board pod", lambda: running_ip(core, namespace, "board"), 120)
    board = f"http://{board_ip}:{BOARD_PORT}"
    wait_for("the board to answer", lambda: reachable(board_ip, BOARD_PORT), 60)
    apply(kube, namespace, victim_job(name, board))

    def victims_waiting() -> list[Any] | None:
        job = get_job(kube, namespace, name)
        assert (job.get("status") or {}).get("phase") not in ("Failed", "Succeeded"), job
        pods = [p for p in job_pods(kube, namespace, name) if p.status.phase == "Running"]
        steps = {r["index"]: r.get("step") for r in (job.get("status") or {}).get("ranks") or []}
        # Trained and counting: the operator has read both pods' progress once.
        return pods if len(pods) == 2 and all(steps.get(i) for i in (0, 1)) else None

    pods = wait_for("the victim's pods to train and wait", victims_waiting, timeout=240)
    ips = {int(p.metadata.labels["torchrun.dev/index"]): p.status.pod_ip for p in pods}

    if local:
        queue = netpol.queue_id(cluster.net)
        assert netpol.queue_bound(queue), f"no enforcer reads queue {queue}"

        def filtered() -> bool:
            return all(connect_as(65534, ip, STATUS_PORT) == "timeout" for ip in ips.values())

        # A process of another user on the host is refused: no policy admits the node's
        # address. From here on every new connection to the victim's pods is judged.
        wait_for("the enforcer to judge the victim's pods", filtered, timeout=60)
        # The host's root (the operator's path: it runs on the node) reaches the status port:
        # what admits it here is the exemption of the host root's sockets (localkube.netpol).
        assert connect_as(0, ips[0], STATUS_PORT) == "open"

    targets = [
        f"{ips[0]}:{RDZV_PORT}",
        f"{ips[0]}:{STATUS_PORT}",
        f"{ips[1]}:{STATUS_PORT}",
        f"{board_ip}:{BOARD_PORT}",
    ]
    apply(kube, namespace, prober_job("other-job", board, targets))
    # Another namespace, with the victim's own job label: a podSelector alone matches pods of
    # the policy's namespace only.
    impostor = plain_pod(
        "impostor", probe_args("impostor", board, targets), {"torchrun.dev/job-name": name}
    )
    core.create_namespaced_pod(other_namespace, impostor)

    def results() -> dict[str, dict[str, str]] | None:
        found = {p: board_get(board, p) for p in ("other-job", "impostor")}
        if not all(found.values()):
            return None
        return {p: json.loads(body or b"") for p, body in found.items()}

    probed = wait_for("the probes", results, timeout=180)
    if local:
        assert netpol.queue_bound(queue), "the enforcer stopped during the probes"
    for prober, result in probed.items():
        assert result == {
            targets[0]: "timeout",
            targets[1]: "timeout",
            targets[2]: "timeout",
            targets[3]: "open",
        }, (prober, result, "a port open to the prober: does the cluster enforce NetworkPolicy?")

    # The operator still reads the status port: a step the launchers count now, read by the
    # test from pod 0's launcher after the probes, reaches the job's status later.
    def launcher_step() -> int | None:
        return read_status_step(ips[0])

    seen = wait_for("pod 0's launcher to answer with a step", launcher_step, timeout=30)

    def status_passed(step: int) -> bool:
        ranks = (get_job(kube, namespace, name).get("status") or {}).get("ranks") or []
        return any(r["index"] == 0 and (r.get("step") or 0) > step for r in ranks)

    wait_for(f"the job's status to pass step {seen} of pod 0", lambda: status_passed(seen), 60)

    board_put(board, "release", b"go")
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, timeout=180)
    assert done["status"]["phase"] == "Succeeded", done["status"]


def reachable(ip: str, port: int) -> bool:
    try:
        socket.create_connection((ip, port), timeout=2).close()
        return True
    except OSError:
        return False


def read_status_step(ip: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://{ip}:{STATUS_PORT}/status", timeout=2) as resp:
            data = json.loads(resp.read())
    except (OSError, ValueError):
        return None
    progress = data.get("progress") if isinstance(data, dict) else None
    step = progress.get("step") if isinstance(progress, dict) else None
    return step if isinstance(step, int) and step > 0 else None
