"""spec.scheduling on a real control plane (docs/scheduling.md): kube-scheduler's own gang
scheduling against the partial placement that deadlocks two jobs without it, the PodGroups
of coscheduling and Volcano (their CRDs written from the documented APIs; their schedulers
are not here), and topology placement on labelled nodes.

On the local cluster the module runs a cluster of its own, sized for the scenario: four nodes
with one GPU each, two per rack (label example.com/rack). On another cluster (kind, with the
Workload API's feature gate: hack/kind.sh) it uses the session's cluster and operator, and
gives each schedulable node (an even number of them) one GPU, as a device plugin would
advertise it, and a rack label, half of the nodes per rack; both are taken back afterwards.
Every scenario is sized from the nodes it has.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from dtj import (
    OperatorProcess,
    create_job,
    dtj_status,
    get_job,
    job_pods,
    quick_job,
    schedulable_nodes,
    wait_for,
)
from jobs import condition
from kubernetes import client
from kubernetes.client.exceptions import ApiException
from localkube.components import NodeSpec
from localkube.testing import (
    create_namespace,
    namespace_name,
    started_cluster,
    use_external_cluster,
)
from operator_fixtures import install_crd

RACK = "example.com/rack"
GPU = "nvidia.com/gpu"
NODES = [
    NodeSpec(f"gpu-{i}", cpu="4", memory="16Gi", gpus=1, labels={RACK: f"r{i // 2}"})
    for i in range(4)
]
GATE = "test.torchrun.dev/hold"
CRDS = Path(__file__).parent / "gangcrds"
GROUPS = {
    "Native": ("scheduling.k8s.io", "v1beta1"),
    "Coscheduling": ("scheduling.x-k8s.io", "v1alpha1"),
    "Volcano": ("scheduling.volcano.sh", "v1beta1"),
}


@pytest.fixture(scope="module")
def gang_cluster(request: pytest.FixtureRequest) -> Iterator[Any]:
    if use_external_cluster():
        yield request.getfixturevalue("cluster")
        return
    with started_cluster("localkube-gang-", 180, name=f"g{os.getpid()}"[:12], nodes=NODES) as c:
        yield c


@pytest.fixture(scope="module")
def gapi(gang_cluster: Any) -> Iterator[client.ApiClient]:
    api = gang_cluster.api_client()
    install_crd(api)
    ext = client.ApiextensionsV1Api(api)
    for path in sorted(CRDS.glob("*.yaml")):
        try:
            ext.create_custom_resource_definition(yaml.safe_load(path.read_text()))
        except ApiException as e:
            if e.status != 409:  # there from an earlier run on this cluster: the same file
                raise
    for path in sorted(CRDS.glob("*.yaml")):
        name = yaml.safe_load(path.read_text())["metadata"]["name"]

        def established(name: str = name) -> bool:
            crd: Any = ext.read_custom_resource_definition(name)
            return any(
                c.type == "Established" and c.status == "True" for c in crd.status.conditions or []
            )

        wait_for(
            f"CRD {name} established",
            established,
            timeout=30,
        )
    yield api
    api.close()


def _escaped(key: str) -> str:
    return key.replace("~", "~0").replace("/", "~1")


@pytest.fixture(scope="module")
def racks(gapi: client.ApiClient) -> Iterator[dict[str, str]]:
    """Node -> rack of the nodes with one GPU each: half of them per rack."""
    if not use_external_cluster():
        yield {n.name: n.labels[RACK] for n in NODES}
        return
    core = client.CoreV1Api(gapi)
    names = sorted(n.metadata.name for n in schedulable_nodes(gapi))
    names = names[: len(names) // 2 * 2]
    assert names, "the gang tests need at least two schedulable nodes"
    placed = {n: f"r{i // (len(names) // 2)}" for i, n in enumerate(names)}
    for node, rack in placed.items():
        core.patch_node(node, {"metadata": {"labels": {RACK: rack}}})
        gpus = {"capacity": {GPU: "1"}, "allocatable": {GPU: "1"}}
        core.patch_node_status(node, {"status": gpus})

    def advertised() -> bool:
        listed: Any = core.list_node()
        nodes = {n.metadata.name: n for n in listed.items}
        return all((nodes[n].status.allocatable or {}).get(GPU) == "1" for n in placed)

    wait_for("one GPU on each node", advertised, timeout=30)
    yield placed
    for node in placed:
        core.patch_node(node, {"metadata": {"labels": {RACK: None}}})
        removed = [
            {"op": "remove", "path": f"/status/{field}/{_escaped(GPU)}"}
            for field in ("capacity", "allocatable")
        ]
        try:
            core.patch_node_status(node, removed)
        except ApiException as e:
            if e.status != 422:  # the kubelet wrote its own status meanwhile: nothing to take
                raise


@pytest.fixture(scope="module")
def gang_operator(
    request: pytest.FixtureRequest,
    gapi: client.ApiClient,
    gang_cluster: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[OperatorProcess]:
    if use_external_cluster():  # one operator per cluster: the session's
        yield request.getfixturevalue("operator")
        return
    op = OperatorProcess(Path(gang_cluster.kubeconfig), tmp_path_factory.mktemp("gang-op"))
    op.start()
    yield op
    op.kill()
    errors = [line for line in op.log().splitlines() if "Traceback" in line]
    assert not errors, f"the operator logged tracebacks:\n{op.log()[-4000:]}"


@pytest.fixture
def ns(gapi: client.ApiClient, request: pytest.FixtureRequest) -> Iterator[str]:
    name = namespace_name(request.node.name)
    create_namespace(gapi, name)
    yield name
    try:
        client.CoreV1Api(gapi).delete_namespace(name)
    except ApiException as e:
        if e.status != 404:
            raise


def trainer(job: dict[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = job["spec"]["template"]["spec"]["containers"][0]
    return container


def sleeper(name: str, nodes: int, seconds: int, **spec: Any) -> dict[str, Any]:
    job = quick_job(name, nodes=nodes, rendezvous={"joinTimeoutSeconds": 900}, **spec)
    trainer(job)["command"] = ["python", "-c", f"import time; time.sleep({seconds})"]
    job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = 1
    return job


def bound(api: client.ApiClient, ns: str, name: str) -> list[Any]:
    return [p for p in job_pods(api, ns, name) if p.spec.node_name]


def told_or_bound(core: client.CoreV1Api, ns: str, name: str) -> bool:
    pod: Any = core.read_namespaced_pod(name, ns)
    if pod.spec.node_name:
        return True
    conds = pod.status.conditions or []
    return any(c.type == "PodScheduled" and c.reason == "Unschedulable" for c in conds)


@pytest.mark.parametrize("gang", ["Native", "None"])
def test_two_four_node_jobs_with_room_for_one(
    gang: str,
    gang_cluster: Any,
    gapi: client.ApiClient,
    racks: dict[str, str],
    gang_operator: Any,
    ns: str,
) -> None:
    """Two jobs of one 1-GPU pod per node (four on the local cluster) are submitted
    together, their pods held by a scheduling gate that the test lifts in the order that hurts
    most: a0, b0, a1, b1, ... With Native gang scheduling one job gets every GPU and the other
    none until the first ends; without it each job gets half and both wait forever for the
    rest (the deadlock)."""
    core = client.CoreV1Api(gapi)
    size = len(racks)
    half = size // 2
    jobs = {}
    for name in ("a", "b"):
        job = sleeper(name, size, 20, scheduling={"gang": gang})
        trainer(job)["resources"] = {
            "limits": {"nvidia.com/gpu": 1},
            "requests": {"cpu": "100m", "memory": "256Mi"},
        }
        job["spec"]["template"]["spec"]["schedulingGates"] = [{"name": GATE}]
        jobs[name] = create_job(gapi, ns, job)
    wait_for(
        f"{2 * size} pods",
        lambda: len(job_pods(gapi, ns, "a") + job_pods(gapi, ns, "b")) == 2 * size,
        120,
    )
    if gang == "Native":
        custom = client.CustomObjectsApi(gapi)
        for name in ("a", "b"):
            group: Any = custom.get_namespaced_custom_object(
                "scheduling.k8s.io", "v1beta1", ns, "podgroups", f"{name}-a0"
            )
            assert group["spec"]["schedulingPolicy"] == {"gang": {"minCount": size}}
            assert group["metadata"]["ownerReferences"][0]["uid"] == jobs[name]["metadata"]["uid"]
            custom.get_namespaced_custom_object(
                "scheduling.k8s.io", "v1beta1", ns, "workloads", f"{name}-a0"
            )
    for i in range(size):
        for name in ("a", "b"):
            pod = f"{name}-{i}"
            core.patch_namespaced_pod(pod, ns, [{"op": "remove", "path": "/spec/schedulingGates"}])
            try:
                wait_for(
                    f"{pod} bound or unschedulable",
                    functools.partial(told_or_bound, core, ns, pod),
                    8,
                )
            except TimeoutError:
                assert gang == "Native", f"{pod}: the default scheduler always answers"

    def counts() -> list[int]:
        return [len(bound(gapi, ns, "a")), len(bound(gapi, ns, "b"))]

    if gang == "None":
        wait_for(f"{size} pods bound", lambda: sum(counts()) == size, 60)
        time.sleep(10)  # nothing moves: each job waits for pods that cannot be placed
        assert counts() == [half, half], "partial placement: half of each job holds the GPUs"
        for name in ("a", "b"):
            job = get_job(gapi, ns, name)
            assert job["status"]["phase"] == "Waiting", job["status"]
            cond = condition(job, "Scheduled")
            assert cond is not None and cond["status"] == "False", job["status"]
            assert f"{size - half} of {size} pods not scheduled" in cond["message"]
            assert "nvidia.com/gpu" in cond["message"]
        return

    first = wait_for("one whole gang bound", lambda: size in counts() and counts(), 120)
    assert sorted(first) == [0, size], first
    winner, loser = ("a", "b") if first[0] == size else ("b", "a")

    # The loser waits, says why, and has no pod bound until the winner has finished. It was
    # already Waiting while its pods were gated (reason SchedulingGated): wait for the
    # scheduler's verdict on the ungated pods to reach its status, not for the phase alone.
    def unschedulable() -> dict[str, Any] | None:
        status: dict[str, Any] = get_job(gapi, ns, loser)["status"]
        cond = condition({"status": status}, "Scheduled") or {}
        waiting = status.get("phase") == "Waiting" and cond.get("reason") == "Unschedulable"
        return status if waiting else None

    status = wait_for(f"{loser} Waiting, Unschedulable", unschedulable, 60)
    cond = condition({"status": status}, "Scheduled")
    assert cond is not None and cond["status"] == "False", status
    assert f"Native gang scheduling places {size} pods together or none" in cond["message"]
    assert f"(PodGroup {loser}-a0)" in cond["message"]
    text = dtj_status(gang_cluster, ns, loser)
    assert "Waiting" in text and f"Gang:       Native, PodGroup {loser}-a0" in text
    assert "Scheduled=False (Unschedulable)" in text
    while get_job(gapi, ns, winner)["status"].get("phase") != "Succeeded":
        assert not bound(gapi, ns, loser), "a pod of the waiting gang was bound"
        time.sleep(0.5)
    wait_for(
        f"{loser} Succeeded",
        lambda: get_job(gapi, ns, loser)["status"]["phase"] == "Succeeded",
        240,
    )
    done = get_job(gapi, ns, loser)
    cond = condition(done, "Scheduled")
    assert cond is not None and cond["status"] == "True", done["status"]


@pytest.mark.parametrize("gang", ["Coscheduling", "Volcano", "Native"])
def test_podgroup_per_attempt_created_replaced_and_collected(
    gang: str, gapi: client.ApiClient, gang_operator: Any, ns: str
) -> None:
    """The apiserver accepts each gang's objects; a new attempt (here a resume) gets a new
    PodGroup and the old one is deleted; deleting the job collects the last one."""
    group, version = GROUPS[gang]
    custom = client.CustomObjectsApi(gapi)
    job = create_job(gapi, ns, sleeper("pg", 2, 600, scheduling={"gang": gang}))
    uid = job["metadata"]["uid"]

    def podgroups() -> dict[str, dict[str, Any]]:
        listed: Any = custom.list_namespaced_custom_object(group, version, ns, "podgroups")
        items = listed["items"]
        return {
            i["metadata"]["name"]: i for i in items if not i["metadata"].get("deletionTimestamp")
        }

    pg = wait_for("PodGroup pg-a0", lambda: podgroups().get("pg-a0"), 60)
    ref = pg["metadata"]["ownerReferences"][0]
    assert ref["uid"] == uid and ref["controller"] is True
    wait_for("2 pods", lambda: len(job_pods(gapi, ns, "pg")) == 2, 60)
    for pod in job_pods(gapi, ns, "pg"):
        if gang == "Coscheduling":
            assert pg["spec"] == {"minMember": 2}
            assert pod.metadata.labels["scheduling.x-k8s.io/pod-group"] == "pg-a0"
            assert pod.spec.scheduler_name == "scheduler-plugins-scheduler"
        elif gang == "Volcano":
            assert pg["spec"] == {"minMember": 2}
            assert pod.metadata.annotations["scheduling.k8s.io/group-name"] == "pg-a0"
            assert pod.spec.scheduler_name == "volcano"
        else:
            assert pg["spec"]["schedulingPolicy"] == {"gang": {"minCount": 2}}
            assert pod.spec.scheduling_group.pod_group_name == "pg-a0"
    patch = {"spec": {"runPolicy": {"suspend": True}}}
    custom.patch_namespaced_custom_object(
        "torchrun.dev", "v1alpha1", ns, "distributedtrainingjobs", "pg", patch
    )
    wait_for("Suspended", lambda: get_job(gapi, ns, "pg")["status"]["phase"] == "Suspended", 60)
    patch = {"spec": {"runPolicy": {"suspend": False}}}
    custom.patch_namespaced_custom_object(
        "torchrun.dev", "v1alpha1", ns, "distributedtrainingjobs", "pg", patch
    )
    wait_for("PodGroup pg-a1 alone", lambda: set(podgroups()) == {"pg-a1"}, 90)
    status = get_job(gapi, ns, "pg")["status"]
    assert status["scheduling"] == {"gang": gang, "attempt": 1, "podGroup": "pg-a1"}
    if gang == "Native":
        found: Any = custom.list_namespaced_custom_object(group, version, ns, "workloads")
        workloads = found["items"]
        live = {
            w["metadata"]["name"] for w in workloads if not w["metadata"].get("deletionTimestamp")
        }
        assert live == {"pg-a1"}
    custom.delete_namespaced_custom_object(
        "torchrun.dev", "v1alpha1", ns, "distributedtrainingjobs", "pg"
    )
    wait_for("PodGroups collected with the job", lambda: not podgroups(), 90)


def test_placement_one_rack_exclusive_one_pod_per_node(
    gapi: client.ApiClient, racks: dict[str, str], gang_operator: Any, ns: str
) -> None:
    """Two exclusive jobs of one pod per node of a rack (two on the local cluster) take a
    rack each; a third job finds no domain free, waits and says so, and starts once a rack is
    free."""
    placement = {"topologyKey": RACK, "exclusive": True, "onePodPerNode": True}
    per_rack = len(racks) // 2
    for name in ("p", "q"):
        create_job(gapi, ns, sleeper(name, per_rack, 600, scheduling={"placement": placement}))
    where = {}
    for name in ("p", "q"):

        def all_bound(n: str = name) -> list[Any] | None:
            b = bound(gapi, ns, n)
            return b if len(b) == per_rack else None

        pods = wait_for(f"{name} bound", all_bound, 120)
        nodes = {p.spec.node_name for p in pods}
        assert len(nodes) == per_rack, f"{name}: one pod per node"
        assert len({racks[n] for n in nodes}) == 1, f"{name}: one rack"
        where[name] = racks[next(iter(nodes))]
    assert where["p"] != where["q"], "exclusive: a rack each"
    create_job(gapi, ns, sleeper("r", 1, 5))
    status = wait_for(
        "r Waiting",
        lambda: (s := get_job(gapi, ns, "r").get("status") or {}).get("phase") == "Waiting" and s,
        60,
    )
    cond = condition({"status": status}, "Scheduled")
    assert cond is not None and "anti-affinity" in cond["message"], status
    # The job goes, and the garbage collector takes its pods: rack where["p"] is free again.
    client.CustomObjectsApi(gapi).delete_namespaced_custom_object(
        "torchrun.dev", "v1alpha1", ns, "distributedtrainingjobs", "p"
    )
    pods = wait_for("r bound", lambda: bound(gapi, ns, "r"), 120)
    assert racks[pods[0].spec.node_name] == where["p"], "r runs in the rack p left"
    wait_for("r Succeeded", lambda: get_job(gapi, ns, "r")["status"]["phase"] == "Succeeded", 180)
    cond = condition(get_job(gapi, ns, "r"), "Scheduled")
    assert cond is not None and cond["status"] == "True"
