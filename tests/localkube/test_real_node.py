"""Pods as real containers: a localkube cluster whose node is a real kubelet (built from the
control plane's Kubernetes module) with containerd, runc and CNI plugins from Debian, and the
images this checkout builds, loaded from the local Docker engine (localkube.realnode).

What only a kubelet shows is tested here: the operator image installed with the chart runs as
the image's non-root user under the chart's restricted security context and reconciles jobs;
a CPU DDP job runs in the runtime image, its launcher as a non-root user; a worker over the
container's memory limit is OOMKilled and the job's status and root cause say so; /dev/shm is
a tmpfs sized by the kubelet from what we render (a memory-backed emptyDir without a size: the
pod's memory limit); the launcher's summary reaches the job through the kubelet's
termination-message path; a deleted pod's launcher gets the kubelet's SIGTERM and its
grace period; two host-network jobs on one node rendezvous side by side on ports of their
own; and `kubectl dtj run` on a runtime follows the rank's log through the kubelet's log API.

The module has its own cluster (a real node and a process node, whose pods share one pod
network) so that nothing of the session's cluster changes; it needs root, dockerd
(hack/docker.sh installs and starts one), Debian's containerd, runc and
containernetworking-plugins (hack/realnode-deps.sh), and `cluster/build.sh kubelet`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from docker_fixtures import OPERATOR_IMAGE, REPO, ended, make, python_pod, start_pair
from dtj import apply, create_job, job_pods, load_docs, wait_for, wait_phase
from kubernetes import client, config, watch
from localkube.components import NodeSpec
from localkube.controlplane import Cluster, find_bin_dir
from localkube.realnode import NODE_KIND_LABEL, REAL, RealNodeSpec
from localkube.testing import create_namespace, started_cluster

pytestmark = pytest.mark.slow

TORCH_VERSION = next(
    line.split("==", 1)[1].strip()
    for line in (REPO / "requirements-test.txt").read_text().splitlines()
    if line.startswith("torch==")
)
RUNTIME_IMAGE = f"ghcr.io/torchrun-dev/torchrun-runtime:{TORCH_VERSION}"
IMAGE_USER = "65532"
CHART = REPO / "charts" / "torchrun-operator"
RELEASE = "rn-op"
ON_REAL_NODES = {NODE_KIND_LABEL: REAL}


@pytest.fixture(scope="module")
def images(docker_engine: None) -> list[str]:
    """The operator and runtime images as `make` builds them (Docker's layer cache makes a
    rebuild of unchanged sources instant), and the Debian packages real nodes need."""
    deps = subprocess.run(
        [str(REPO / "hack/realnode-deps.sh")], capture_output=True, text=True, check=False
    )
    assert deps.returncode == 0, f"hack/realnode-deps.sh failed:\n{deps.stderr[-3000:]}"
    make("image-operator", f"OPERATOR_IMAGE={OPERATOR_IMAGE}", timeout=900)
    make("image-runtime", f"RUNTIME_IMAGE={RUNTIME_IMAGE}", timeout=1800)
    return [OPERATOR_IMAGE, RUNTIME_IMAGE]


@pytest.fixture(scope="module")
def cluster(images: list[str]) -> Iterator[Cluster]:
    with started_cluster(
        "localkube-rn-",
        900,
        name=f"rn{os.getpid()}"[:12],
        # A process node beside the real one: both kinds of pods on one pod network.
        nodes=[NodeSpec("node-0")],
        real_nodes=[RealNodeSpec("real-0")],
        images=images,
    ) as c:
        yield c


@pytest.fixture(scope="module")
def kube(cluster: Cluster) -> Iterator[client.ApiClient]:
    api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
    yield api
    api.close()


def run(argv: list[str], timeout: float = 300) -> str:
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    assert out.returncode == 0, f"{' '.join(argv)} exited {out.returncode}:\n{out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def installed_operator(cluster: Cluster, kube: client.ApiClient) -> Iterator[Any]:
    """`helm install` of the chart with the built operator image (never pulled), for every
    namespace. Yields the operator pod."""
    helm = str(find_bin_dir() / "helm")
    repo, tag = OPERATOR_IMAGE.rsplit(":", 1)
    base = ["--kubeconfig", str(cluster.kubeconfig), "--namespace", "torchrun-system"]
    values = {
        "image": {"repository": repo, "tag": tag, "pullPolicy": "Never"},
        "nodeSelector": ON_REAL_NODES,
    }
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values, f)
        f.flush()
        run(
            [helm, "install", RELEASE, str(CHART), *base, "--create-namespace"]
            + ["--values", f.name, "--wait", "--timeout", "180s"]
        )
    core = client.CoreV1Api(kube)
    (pod,) = core.list_namespaced_pod(
        "torchrun-system", label_selector=f"app.kubernetes.io/instance={RELEASE}"
    ).items
    yield pod
    run([helm, "uninstall", RELEASE, *base, "--wait", "--timeout", "120s"])


@pytest.fixture
def namespace(kube: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    name = f"rn-{request.node.name.removeprefix('test_')[:40]}".replace("_", "-").rstrip("-")
    create_namespace(kube, name)
    yield name
    client.CoreV1Api(kube).delete_namespace(name)


def job(name: str, program: list[str], memory: str, **spec: Any) -> dict[str, Any]:
    """A one-pod job in the runtime image on the real node."""
    return {
        "apiVersion": "torchrun.dev/v1alpha1",
        "kind": "DistributedTrainingJob",
        "metadata": {"name": name},
        "spec": {
            "nodes": 1,
            "nprocPerNode": 1,
            "failurePolicy": {"maxRestarts": 0},
            # The pods stay for the test to read (the default deletes succeeded ones).
            "runPolicy": {"cleanPodPolicy": "KeepAll"},
            **spec,
            "template": {
                "spec": {
                    "nodeSelector": ON_REAL_NODES,
                    "containers": [
                        {
                            "name": "trainer",
                            "image": RUNTIME_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": program,
                            "resources": {
                                "requests": {"cpu": "100m", "memory": memory},
                                "limits": {"memory": memory},
                            },
                        }
                    ],
                }
            },
        },
    }


def pod_log(kube: client.ApiClient, namespace: str, pod: str) -> str:
    """The container's log through the apiserver and the kubelet (no files of ours)."""
    return str(client.CoreV1Api(kube).read_namespaced_pod_log(pod, namespace))


def trainer_status(pod: Any) -> Any:
    (status,) = [s for s in pod.status.container_statuses or [] if s.name == "trainer"]
    return status


def test_chart_runs_the_operator_image_as_its_user_under_the_restricted_context(
    cluster: Cluster, kube: client.ApiClient, installed_operator: Any
) -> None:
    pod = installed_operator
    assert pod.spec.node_name == "real-0"
    (status,) = pod.status.container_statuses
    assert status.ready and status.image == f"docker.io/{OPERATOR_IMAGE}", status
    # The process inside the container, asked through the kubelet (exec): the image's user,
    # no capabilities, no privilege escalation, a read-only root filesystem.
    probe = (
        "import os; s = dict(l.split(':\\t', 1) for l in open('/proc/self/status')); "
        "print(os.getuid(), os.getgid(), s['CapEff'].strip(), s['NoNewPrivs'].strip()); "
        "open('/opt/x', 'w')"
    )
    kubectl = ["kubectl", "--kubeconfig", str(cluster.kubeconfig), "-n", "torchrun-system"]
    out = subprocess.run(
        [*kubectl, "exec", pod.metadata.name, "--", "python", "-c", probe],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.stdout.split() == [IMAGE_USER, IMAGE_USER, "0000000000000000", "1"], out
    assert "Read-only file system" in out.stderr, out.stderr
    log = pod_log(kube, "torchrun-system", pod.metadata.name)
    assert "Traceback" not in log, log[-4000:]


def test_cpu_ddp_example_runs_in_the_runtime_image_as_a_non_root_user(
    kube: client.ApiClient, namespace: str, installed_operator: Any
) -> None:
    docs = load_docs(REPO / "examples" / "cpu-ddp.yaml")
    core = client.CoreV1Api(kube)
    for doc in docs:
        if doc["kind"] == "DistributedTrainingJob":
            pod_spec = doc["spec"]["template"]["spec"]
            pod_spec["nodeSelector"] = ON_REAL_NODES
            (trainer,) = pod_spec["containers"]
            trainer["image"], trainer["imagePullPolicy"] = RUNTIME_IMAGE, "Never"
            doc["spec"]["runPolicy"]["cleanPodPolicy"] = "KeepAll"
    name = apply(kube, namespace, docs)["metadata"]["name"]
    done = wait_phase(kube, namespace, name, {"Succeeded", "Failed"}, 420)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert done["status"]["worldSize"] == 4
    pods = job_pods(kube, namespace, name)
    assert {p.spec.node_name for p in pods} == {"real-0"}
    logs = "".join(pod_log(kube, namespace, p.metadata.name) for p in pods)
    assert "final checksum" in logs, logs[-4000:]
    # The launcher is PID 1 of the container, as the image's user (no securityContext asks
    # for it), and the kubelet took its summary from the termination-message path.
    for p in pods:
        status = trainer_status(core.read_namespaced_pod(p.metadata.name, namespace))
        summary = json.loads(status.state.terminated.message)
        assert summary["state"] == "Succeeded", summary
    uid = subprocess.run(
        ["docker", "image", "inspect", "-f", "{{.Config.User}}", RUNTIME_IMAGE],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert uid == f"{IMAGE_USER}:{IMAGE_USER}"


SHM_AND_USER = """
import json, os
st = os.statvfs("/dev/shm")
mounts = [l.split() for l in open("/proc/mounts")]
(shm,) = [m for m in mounts if m[1] == "/dev/shm"]
print("FACTS", json.dumps({"shm_bytes": st.f_blocks * st.f_frsize, "shm_fs": shm[2],
      "uid": os.getuid(), "launcher_uid": os.stat("/proc/1").st_uid}), flush=True)
"""


def test_dev_shm_is_a_tmpfs_of_the_pods_memory_limit_and_the_launcher_is_not_root(
    kube: client.ApiClient, namespace: str, installed_operator: Any
) -> None:
    create_job(kube, namespace, job("shm", ["python", "-c", SHM_AND_USER], "768Mi"))
    done = wait_phase(kube, namespace, "shm", {"Succeeded", "Failed"}, 240)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    (pod,) = job_pods(kube, namespace, "shm")
    line = next(
        ln
        for ln in pod_log(kube, namespace, pod.metadata.name).splitlines()
        if ln.startswith("FACTS")
    )
    facts = json.loads(line.split("FACTS", 1)[1])
    # We render /dev/shm as a memory-backed emptyDir without a size: the kubelet sizes the
    # tmpfs by the pod's memory limit (not the node's memory, not Docker's 64 MiB).
    assert facts["shm_fs"] == "tmpfs", facts
    assert facts["shm_bytes"] == 768 * 2**20, facts
    assert facts["uid"] == int(IMAGE_USER) and facts["launcher_uid"] == int(IMAGE_USER), facts


OOM = """
import time
chunks = []
for _ in range(64):
    chunks.append(bytearray(64 * 2**20))  # zero-filled: every page touched
    time.sleep(0.05)
print("survived", flush=True)
"""


def test_a_worker_over_its_memory_limit_is_oomkilled_and_the_job_says_so(
    kube: client.ApiClient, namespace: str, installed_operator: Any
) -> None:
    create_job(kube, namespace, job("oom", ["python", "-c", OOM], "1Gi"))
    done = wait_phase(kube, namespace, "oom", {"Succeeded", "Failed"}, 240)
    status = done["status"]
    assert status["phase"] == "Failed", status
    (pod,) = job_pods(kube, namespace, "oom")
    assert pod.spec.node_name == "real-0"
    # The kernel's OOM killer took the worker (the largest process in the container's
    # cgroup); the launcher, PID 1, reported it killed by SIGKILL and exited; the runtime
    # reports the container OOMKilled.
    terminated = trainer_status(pod).state.terminated
    assert terminated.reason == "OOMKilled", terminated
    report = json.loads(terminated.message)
    assert [f["exitCode"] for f in report["failures"]] == [-9], report
    # The job says so: the root cause, the rank, and the Failed condition.
    assert status["failure"]["reason"] == "OOMKilled", status["failure"]
    assert status["ranks"][0]["reason"] == "OOMKilled", status["ranks"]
    (failed,) = [c for c in status["conditions"] if c["type"] == "Failed"]
    assert "OOMKilled" in failed["message"], failed


SLOW = """
import time
print("working", flush=True)
time.sleep(600)
"""


def test_a_deleted_pods_launcher_gets_sigterm_and_its_grace_period(
    kube: client.ApiClient, namespace: str, installed_operator: Any
) -> None:
    core = client.CoreV1Api(kube)
    spec = job("term", ["python", "-c", SLOW], "1Gi")
    spec["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 20
    create_job(kube, namespace, spec)

    def running() -> Any:
        pods = [p for p in job_pods(kube, namespace, "term") if p.status.phase == "Running"]
        if pods and "working" in pod_log(kube, namespace, pods[0].metadata.name):
            return pods[0]
        return None

    pod = wait_for("worker running", running, timeout=240)
    name, rv = pod.metadata.name, pod.metadata.resource_version
    t0 = time.monotonic()
    core.delete_namespaced_pod(name, namespace)
    # The pod object goes once its containers stopped: its last statuses are watched, not
    # polled.
    ended = None
    for event in watch.Watch().stream(
        core.list_namespaced_pod,
        namespace,
        field_selector=f"metadata.name={name}",
        resource_version=rv,
        timeout_seconds=60,
    ):
        ended = trainer_status(event["object"]).state.terminated or ended
        if ended is not None:
            break
    took = time.monotonic() - t0
    assert ended is not None, "the trainer container never terminated"
    # The launcher stopped on SIGTERM well within the grace period (no SIGKILL at 20 s), and
    # its summary, read from the termination-message path, says why.
    assert took < 15, took
    summary = json.loads(ended.message)
    assert "SIGTERM" in json.dumps(summary), summary


def plain_pod(name: str, node: str, script: str) -> dict[str, Any]:
    return python_pod(name, node, script, image=RUNTIME_IMAGE, pull_policy="Never")


def test_a_real_nodes_container_talks_to_a_process_nodes_pod(
    kube: client.ApiClient, namespace: str
) -> None:
    """Both kinds of node put their pods on the cluster's bridge, each in its own /24."""
    core: Any = client.CoreV1Api(kube)
    ip = start_pair(core, namespace, plain_pod, on=("node-0", "real-0"))
    done = wait_for("client done", lambda: ended(core, namespace, "client"), timeout=90)
    assert done == "Succeeded"
    assert "REPLY pong" in pod_log(kube, namespace, "client")
    done = wait_for("server done", lambda: ended(core, namespace, "server"), timeout=30)
    assert done == "Succeeded"
    client_ip = core.read_namespaced_pod("client", namespace).status.pod_ip
    assert ip.split(".")[:3] != client_ip.split(".")[:3], (ip, client_ip)


# Each job's two workers meet in an all-reduce over gloo, then hold their ports a while, so
# that the two jobs' pods run side by side on the node's one network.
HOSTNET_DDP = """
import socket, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1) * (dist.get_rank() + 1)
dist.all_reduce(t)
if dist.get_rank() == 0:  # one writer: two ranks' lines can interleave in the one log
    print("HOSTNET", socket.gethostname(), int(t.item()), flush=True)
time.sleep(12)
dist.destroy_process_group()
"""


def _span(pod: Any) -> tuple[datetime, datetime]:
    ended = trainer_status(pod).state.terminated
    return ended.started_at, ended.finished_at


def test_two_host_network_jobs_on_one_node_rendezvous_on_ports_of_their_own(
    kube: client.ApiClient, namespace: str, installed_operator: Any
) -> None:
    """hostNetwork pods share their node's addresses: each job gets its own rendezvous and
    status ports (render/ports.py), so two jobs on the one real node both rendezvous, at the
    same time, in the node's network namespace (docs/runtimes.md, "Host network")."""
    names = ("hostnet-a", "hostnet-b")
    for name in names:
        spec = job(name, ["python", "-c", HOSTNET_DDP], "1Gi", nprocPerNode=2)
        spec["spec"]["template"]["spec"]["hostNetwork"] = True
        create_job(kube, namespace, spec)
    done = {n: wait_phase(kube, namespace, n, {"Succeeded", "Failed"}, 420) for n in names}
    for name, obj in done.items():
        assert obj["status"]["phase"] == "Succeeded", (name, obj["status"])
        assert obj["status"]["worldSize"] == 2
    pods = {n: job_pods(kube, namespace, n)[0] for n in names}
    ports = {}
    for name, pod in pods.items():
        assert pod.spec.node_name == "real-0" and pod.spec.host_network, pod.spec
        assert pod.spec.dns_policy == "ClusterFirstWithHostNet"
        # the node's address, not one of the pod network's
        assert pod.status.pod_ip == pod.status.host_ip, pod.status
        lines = [
            ln.split()
            for ln in pod_log(kube, namespace, pod.metadata.name).splitlines()
            if ln.startswith("HOSTNET")
        ]
        assert [ln[2] for ln in lines] == ["3"], lines  # 1 + 2: both ranks in the all-reduce
        (trainer,) = [c for c in pod.spec.containers if c.name == "trainer"]
        ports[name] = sorted(p.host_port for p in trainer.ports or [])
        assert len(ports[name]) == 2 and all(ports[name]), trainer.ports  # rendezvous, status
    assert not set(ports["hostnet-a"]) & set(ports["hostnet-b"]), ports
    (a0, a1), (b0, b1) = _span(pods["hostnet-a"]), _span(pods["hostnet-b"])
    assert a0 < b1 and b0 < a1, "the two jobs never ran side by side"


FOLLOWED = """\
import os, time
for step in range(1, 6):
    print(f"rank {os.environ['RANK']} step {step}", flush=True)
    time.sleep(1)
print(f"rank {os.environ['RANK']} done", flush=True)
"""


def test_kubectl_dtj_run_on_a_runtime_follows_the_ranks_log_from_the_kubelet(
    cluster: Cluster,
    kube: client.ApiClient,
    namespace: str,
    installed_operator: Any,
    tmp_path: Path,
) -> None:
    """As a person would: a platform team's runtime pins the runtime image and the real node;
    `kubectl dtj run --runtime` ships the script in a ConfigMap (mounted by the kubelet),
    streams rank 0's log as the kubelet serves it (follow=True, the SDK's Client.logs), and
    exits 0 with the job's table."""
    template = job("x", [], "768Mi")["spec"]["template"]
    del template["spec"]["containers"][0]["command"]  # the job's: `run` gives the script's
    runtime = {
        "apiVersion": "torchrun.dev/v1alpha1",
        "kind": "DistributedTrainingRuntime",
        "metadata": {"name": "real-cpu", "namespace": namespace},
        "spec": {"template": template},
    }
    client.CustomObjectsApi(kube).create_namespaced_custom_object(
        "torchrun.dev", "v1alpha1", namespace, "distributedtrainingruntimes", runtime
    )
    script = tmp_path / "steps.py"
    script.write_text(FOLLOWED)
    env = {
        **os.environ,
        "KUBECONFIG": str(cluster.kubeconfig),
        "PYTHONPATH": str(REPO / "operator"),
    }
    argv = [sys.executable, "-m", "torchrun_operator.cli.main", "run", "--namespace", namespace]
    argv += ["--runtime", "real-cpu", "--runtime-kind", "DistributedTrainingRuntime"]
    argv += ["--name", "followed", str(script)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=420, env=env, check=False)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    shown = out.stdout
    steps = [f"rank 0 step {i}" for i in range(1, 6)] + ["rank 0 done"]
    at = [shown.find(line) for line in steps]
    assert -1 not in at and at == sorted(at), shown[-3000:]
    assert "Succeeded" in shown, shown[-3000:]
