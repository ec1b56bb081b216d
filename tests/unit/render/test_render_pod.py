import base64
import copy
import re
from typing import Any

import jobs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torchrun_operator.api import names
from torchrun_operator.render import (
    children,
    nproc_per_node,
    render_pod,
    render_service,
    world_size,
)
from torchrun_operator.render.configmap import launcher_digest, packaged_launcher
from torchrun_operator.render.pod import LAUNCHER_BOOTSTRAP, LAUNCHER_PATH

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def make_job(name: str = "train", **spec: Any) -> dict[str, Any]:
    trainer = {"args": ["--epochs", "3"], **spec.pop("container", {})}
    return jobs.job(
        name,
        image="pytorch/pytorch:2.5",
        command=["python", "train.py"],
        trainer=trainer,
        metadata={"namespace": "ml", "uid": "u-1", "generation": 1},
        **spec,
    )


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in trainer(pod)["env"]}


def trainer(pod: dict[str, Any]) -> dict[str, Any]:
    return pod["spec"]["containers"][0]


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_pod_runs_launcher_with_torchrun_flags_then_user_program() -> None:
    pod = render_pod(make_job(nprocPerNode=4), 1, 2)
    c = trainer(pod)
    digest = launcher_digest(packaged_launcher())
    assert c["command"] == ["python", "-c", LAUNCHER_BOOTSTRAP, LAUNCHER_PATH, digest]
    args = c["args"]
    assert args[args.index("--") + 1 :] == ["python", "train.py", "--epochs", "3"]
    assert flag(args, "--nnodes") == "2"
    assert flag(args, "--nproc-per-node") == "4"
    assert flag(args, "--rdzv-backend") == "c10d"
    assert flag(args, "--rdzv-endpoint") == "train-0-a2.train:29400"  # attempt 2's pod 0
    assert flag(args, "--rdzv-id") == "u-1-2"
    assert flag(args, "--rdzv-conf") == "is_host=0,join_timeout=600"
    assert flag(args, "--max-restarts") == "0"
    assert "--node-rank" not in args


def test_only_pod_zero_hosts_the_store() -> None:
    job = make_job(nodes=3)
    confs = [flag(trainer(render_pod(job, i, 0))["args"], "--rdzv-conf") for i in range(3)]
    assert [c.split(",")[0] for c in confs] == ["is_host=1", "is_host=0", "is_host=0"]


def test_pod_identity_dns_and_labels() -> None:
    pod = render_pod(make_job(), 1, 0)
    assert pod["metadata"]["name"] == "train-1"
    assert pod["metadata"]["namespace"] == "ml"
    assert pod["spec"]["hostname"] == "train-1"
    assert pod["spec"]["subdomain"] == "train"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["metadata"]["labels"] == {
        names.LABEL_JOB_NAME: "train",
        names.LABEL_INDEX: "1",
        names.LABEL_NODE_RANK: "1",  # the deprecated name of the index
        names.LABEL_ATTEMPT: "0",
    }
    (owner,) = pod["metadata"]["ownerReferences"]
    assert owner["uid"] == "u-1" and owner["controller"] and owner["blockOwnerDeletion"]
    assert owner["kind"] == "DistributedTrainingJob"


def test_each_attempt_has_its_own_hostnames_and_a_replacement_keeps_its_attempts() -> None:
    # A lagging cluster DNS answered a reused <job>-0.<job> with the address attempt 0's pod 0
    # had, which a pod of attempt 1 then held: a new attempt must never reuse a name.
    job = make_job()
    a0, a1, r = render_pod(job, 1, 0), render_pod(job, 1, 1), render_pod(job, 1, 1, 2)
    assert a0["spec"]["hostname"] == "train-1"
    assert a1["spec"]["hostname"] == r["spec"]["hostname"] == "train-1-a1"
    assert len({a0["metadata"]["name"], a1["metadata"]["name"], r["metadata"]["name"]}) == 3
    endpoints = {flag(trainer(render_pod(job, i, 2))["args"], "--rdzv-endpoint") for i in (0, 1)}
    assert endpoints == {"train-0-a2.train:29400"}
    assert render_pod(job, 0, 2)["spec"]["hostname"] == "train-0-a2"


def test_every_trainer_is_told_its_attempt_and_a_replacement_its_attempts() -> None:
    # A script names what it writes to the shared checkpoint storage with it, so that pods of
    # an earlier attempt still running on a partitioned node never write the same files.
    user = [{"name": "TORCHRUN_OPERATOR_ATTEMPT", "value": "7"}]
    job = make_job(container={"env": user})
    for pod, attempt in ((render_pod(job, 0, 0), "0"), (render_pod(job, 1, 3), "3")):
        told = [e for e in trainer(pod)["env"] if e["name"] == "TORCHRUN_OPERATOR_ATTEMPT"]
        assert told == [{"name": "TORCHRUN_OPERATOR_ATTEMPT", "value": attempt}]
    assert env_of(render_pod(job, 1, 3, replacement=2))["TORCHRUN_OPERATOR_ATTEMPT"] == "3"


def test_a_long_job_names_hostnames_stay_dns_labels_in_every_attempt() -> None:
    job = make_job(name="j" * 61)
    hosts = {render_pod(job, 7, a)["spec"]["hostname"] for a in (0, 1, 12345)}
    assert len(hosts) == 3 and all(DNS1123_LABEL.match(h) for h in hosts)


def test_env_volumes_probe_and_termination_message() -> None:
    pod = render_pod(make_job(), 0, 0)
    env = env_of(pod)
    assert env["PET_LOCAL_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["TORCHRUN_OPERATOR_STATE_DIR"] == "/var/run/torchrun"
    assert env["TORCHRUN_OPERATOR_DNS_TIMEOUT"] == "300"
    assert env["TORCHRUN_OPERATOR_NODE_RANK"] == "0"
    # default failurePolicy.maxRestarts is 3: restarts are possible
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"
    c = trainer(pod)
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert vols[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory"}
    digest = launcher_digest(packaged_launcher())[: names.LAUNCHER_DIGEST_CHARS]
    assert vols[mounts["/opt/torchrun-operator"]]["configMap"]["name"] == f"train-launcher-{digest}"
    assert "emptyDir" in vols[mounts["/var/run/torchrun"]]
    assert c["readinessProbe"]["exec"]["command"] == ["cat", "/var/run/torchrun/ready"]
    assert c["terminationMessagePolicy"] == "File"


@pytest.mark.parametrize(
    ("spec", "disabled"),
    [
        ({"failurePolicy": {"maxRestarts": 0}}, False),
        ({"failurePolicy": {"maxRestarts": 1}}, True),
        ({"failurePolicy": {"maxRestarts": 0}, "torchrun": {"maxRestarts": 2}}, True),
        ({"failurePolicy": {"maxRestarts": 0}, "nodes": 3, "elastic": {"minNodes": 3}}, False),
        ({"failurePolicy": {"maxRestarts": 0}, "nodes": 3, "elastic": {"minNodes": 2}}, True),
        (
            {
                "failurePolicy": {"maxRestarts": 0},
                "nodes": 3,
                "elastic": {"minNodes": 2, "maxNodes": 4},
            },
            True,
        ),
    ],
)
def test_store_sharing_disabled_when_restarts_possible(
    spec: dict[str, Any], disabled: bool
) -> None:
    env = env_of(render_pod(make_job(**spec), 0, 0))
    assert ("TORCH_DISABLE_SHARE_RDZV_TCP_STORE" in env) is disabled


def test_elastic_nnodes_is_min_max() -> None:
    job = make_job(nodes=3, elastic={"minNodes": 2, "maxNodes": 5})
    assert flag(trainer(render_pod(job, 0, 0))["args"], "--nnodes") == "2:5"


def test_user_env_kept_and_owned_names_replaced() -> None:
    env = [{"name": "FOO", "value": "1"}, {"name": "PET_LOCAL_ADDR", "value": "bogus"}]
    pod = render_pod(make_job(container={"env": env}), 0, 0)
    names_ = [e["name"] for e in trainer(pod)["env"]]
    assert names_.count("PET_LOCAL_ADDR") == 1 and "FOO" in names_
    assert env_of(pod)["PET_LOCAL_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}


def test_template_untouched_and_passthrough_fields_kept() -> None:
    job = make_job()
    tpl = job["spec"]["template"]
    tpl["metadata"] = {"labels": {"team": "a"}, "annotations": {"x": "y"}}
    tpl["spec"]["terminationGracePeriodSeconds"] = 120
    tpl["spec"]["nodeSelector"] = {"gpu": "h100"}
    tpl["spec"]["containers"].append({"name": "sidecar", "image": "busybox", "command": ["sh"]})
    before = copy.deepcopy(job)
    pod = render_pod(job, 0, 0)
    assert job == before
    assert pod["spec"]["terminationGracePeriodSeconds"] == 120
    assert pod["spec"]["nodeSelector"] == {"gpu": "h100"}
    assert pod["spec"]["containers"][1] == tpl["spec"]["containers"][1]
    assert pod["metadata"]["labels"]["team"] == "a"
    assert pod["metadata"]["annotations"] == {"x": "y"}


def test_the_avoided_nodes_are_named_on_the_pod_and_only_the_operator_names_them() -> None:
    """The pod says which nodes its rendered affinity keeps it off (the reconciler finds a
    waiting pod kept off a node no longer avoided by it); a template's own value of that
    annotation is dropped, or a pod would be taken for one kept off nodes for ever."""
    job = make_job()
    key = names.ANNOTATION_AVOIDED_NODES
    job["spec"]["template"]["metadata"] = {"annotations": {key: "n9", "x": "y"}}
    assert render_pod(job, 0, 0)["metadata"]["annotations"] == {"x": "y"}
    pod = render_pod(job, 0, 0, avoid_nodes=["n3", "n1", "n3"])
    assert pod["metadata"]["annotations"] == {"x": "y", key: "n1,n3"}
    [term] = pod["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # One value a matchFields requirement: the apiserver refuses a NotIn of two (422).
    assert term["matchFields"] == [
        {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]},
        {"key": "metadata.name", "operator": "NotIn", "values": ["n3"]},
    ]
    job["spec"]["template"]["metadata"] = {"annotations": {key: "n9"}}
    assert "annotations" not in render_pod(job, 0, 0)["metadata"]


def test_user_shm_mount_wins() -> None:
    job = make_job(container={"volumeMounts": [{"name": "big", "mountPath": "/dev/shm"}]})
    job["spec"]["template"]["spec"]["volumes"] = [
        {"name": "big", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}
    ]
    pod = render_pod(job, 0, 0)
    assert [m["name"] for m in trainer(pod)["volumeMounts"] if m["mountPath"] == "/dev/shm"] == [
        "big"
    ]


@pytest.mark.parametrize(
    ("spec", "nproc"),
    [
        ({}, 1),
        ({"container": {"resources": {"limits": {"nvidia.com/gpu": 8}}}}, 8),
        (
            {
                "nprocPerNode": "gpu",
                "container": {"resources": {"limits": {"nvidia.com/gpu": "2"}}},
            },
            2,
        ),
        ({"nprocPerNode": 3, "container": {"resources": {"limits": {"nvidia.com/gpu": 8}}}}, 3),
    ],
)
def test_nproc_per_node(spec: dict[str, Any], nproc: int) -> None:
    job = make_job(nodes=4, **spec)
    assert nproc_per_node(job) == nproc
    assert world_size(job) == 4 * nproc
    assert flag(trainer(render_pod(job, 0, 0))["args"], "--nproc-per-node") == str(nproc)


def test_service_is_headless_and_publishes_not_ready() -> None:
    svc = render_service(make_job(rendezvous={"port": 1234}))
    assert svc["metadata"]["name"] == "train"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {names.LABEL_JOB_NAME: "train"}
    assert svc["spec"]["ports"] == [
        {"name": "c10d", "port": 1234, "targetPort": 1234, "protocol": "TCP"}
    ]


def test_children_service_and_launcher_configmap() -> None:
    launcher = b"PK\x05\x06" + bytes(18)  # any bytes: an empty zip here
    svc, cm = children(make_job(), launcher, network_policy_default=False)
    assert svc["kind"] == "Service"
    digest = launcher_digest(launcher)[: names.LAUNCHER_DIGEST_CHARS]
    assert cm["kind"] == "ConfigMap" and cm["metadata"]["name"] == f"train-launcher-{digest}"
    assert cm["binaryData"] == {"launcher.pyz": base64.b64encode(launcher).decode()}
    assert "data" not in cm
    assert cm["immutable"] is True
    assert cm["metadata"]["ownerReferences"][0]["uid"] == "u-1"


job_names = st.from_regex(r"\A[a-z]([-a-z0-9]{0,40}[a-z0-9])?\Z")


@settings(max_examples=80, deadline=None)
@given(
    name=job_names,
    nodes=st.integers(1, 64),
    nproc=st.integers(1, 8),
    attempts=st.lists(st.integers(0, 10_000), min_size=1, max_size=3, unique=True),
    replacement=st.integers(0, 50),
)
def test_rendered_pods_valid_unique_short(
    name: str, nodes: int, nproc: int, attempts: list[int], replacement: int
) -> None:
    job = make_job(name, nodes=nodes, nprocPerNode=nproc)
    seen: set[str] = set()
    for attempt in attempts:
        for i in range(nodes):
            for r in {0, replacement}:
                pod = render_pod(job, i, attempt, r)
                pod_name = pod["metadata"]["name"]
                assert DNS1123_LABEL.match(pod_name) and len(pod_name) <= 63
                assert DNS1123_LABEL.match(pod["spec"]["hostname"])
                assert pod_name not in seen
                seen.add(pod_name)
    assert world_size(job) == nodes * nproc


def test_integer_quantities_are_rendered_as_strings() -> None:
    # The official client refuses `nvidia.com/gpu: 8` (an int) in a pod it creates.
    job = make_job()
    trainer = job["spec"]["template"]["spec"]["containers"][0]
    trainer["resources"] = {"limits": {"nvidia.com/gpu": 8, "cpu": "2500m"}, "requests": {"cpu": 1}}
    pod = render_pod(job, 0, 0)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources == {
        "limits": {"nvidia.com/gpu": "8", "cpu": "2500m"},
        "requests": {"cpu": "1"},
    }
