"""Rendering spec.scheduling: each gang scheduler's objects per attempt and what it reads on a
pod, and placement as affinity terms."""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from torchrun_operator.api import names
from torchrun_operator.render import render_pod
from torchrun_operator.render.gang import gang_name, render_gang
from torchrun_operator.render.placement import LABEL_JOB_UID

UID = "0b7c6a4e-1111-2222-3333-444455556666"


def make_job(name: str = "train", nodes: int = 4, **spec: Any) -> dict[str, Any]:
    return jobs.job(
        name,
        nodes=nodes,
        nproc=1,
        image="i",
        command=["python"],
        metadata={"namespace": "ns", "uid": UID},
        **spec,
    )


def owned_by_job(obj: dict[str, Any]) -> None:
    ref = obj["metadata"]["ownerReferences"][0]
    assert ref["uid"] == UID and ref["controller"] is True and ref["kind"] == names.KIND


def test_native_renders_a_workload_and_its_podgroup_per_attempt() -> None:
    job = make_job(scheduling={"gang": "Native"})
    workload, group = render_gang(job, 2)
    assert (workload["apiVersion"], workload["kind"]) == ("scheduling.k8s.io/v1beta1", "Workload")
    assert (group["apiVersion"], group["kind"]) == ("scheduling.k8s.io/v1beta1", "PodGroup")
    for obj in (workload, group):
        owned_by_job(obj)
        assert obj["metadata"]["name"] == "train-a2"
        assert obj["metadata"]["labels"][names.LABEL_ATTEMPT] == "2"
        assert obj["metadata"]["labels"][names.LABEL_JOB_NAME] == "train"
    assert workload["spec"]["podGroupTemplates"] == [
        {"name": "workers", "schedulingPolicy": {"gang": {"minCount": 4}}}
    ]
    assert workload["spec"]["controllerRef"] == {
        "apiGroup": "torchrun.dev",
        "kind": "DistributedTrainingJob",
        "name": "train",
    }
    assert group["spec"] == {
        "workloadRef": {"workloadName": "train-a2", "templateName": "workers"},
        "schedulingPolicy": {"gang": {"minCount": 4}},
    }
    pod = render_pod(job, 1, 2)
    assert pod["spec"]["schedulingGroup"] == {"podGroupName": "train-a2"}
    assert "schedulerName" not in pod["spec"]  # the default scheduler


def test_elastic_gang_places_min_nodes_together() -> None:
    job = make_job(nodes=4, elastic={"minNodes": 2, "maxNodes": 6}, scheduling={"gang": "Volcano"})
    (group,) = render_gang(job, 0)
    assert group["spec"]["minMember"] == 2


def test_coscheduling_podgroup_label_and_scheduler() -> None:
    job = make_job(scheduling={"gang": "Coscheduling", "scheduleTimeoutSeconds": 120})
    (group,) = render_gang(job, 0)
    assert group["apiVersion"] == "scheduling.x-k8s.io/v1alpha1"
    assert group["spec"] == {"minMember": 4, "scheduleTimeoutSeconds": 120}
    owned_by_job(group)
    pod = render_pod(job, 0, 0)
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == "train-a0"
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert "schedulingGroup" not in pod["spec"]


def test_volcano_podgroup_annotation_queue_and_priority() -> None:
    job = make_job(scheduling={"gang": "Volcano", "queue": "research"})
    job["spec"]["template"]["spec"]["priorityClassName"] = "high"
    (group,) = render_gang(job, 1)
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {"minMember": 4, "queue": "research", "priorityClassName": "high"}
    pod = render_pod(job, 3, 1)
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "train-a1"
    assert pod["spec"]["schedulerName"] == "volcano"


@pytest.mark.parametrize(
    ("scheduling", "template", "expected"),
    [
        ({"gang": "Volcano", "schedulerName": "vc2"}, "mine", "vc2"),
        ({"gang": "Volcano"}, "mine", "mine"),
        ({"gang": "None"}, "mine", "mine"),
        ({"gang": "None"}, None, None),
    ],
)
def test_scheduler_name_precedence(
    scheduling: dict[str, Any], template: str | None, expected: str | None
) -> None:
    job = make_job(scheduling=scheduling)
    if template:
        job["spec"]["template"]["spec"]["schedulerName"] = template
    assert render_pod(job, 0, 0)["spec"].get("schedulerName") == expected


def test_no_gang_renders_nothing_and_leaves_pods_alone() -> None:
    job = make_job()
    assert render_gang(job, 0) == []
    pod = render_pod(job, 0, 0)
    assert "schedulingGroup" not in pod["spec"] and "affinity" not in pod["spec"]
    assert LABEL_JOB_UID not in pod["metadata"]["labels"]


def test_gang_names_fit_a_label_value_and_keep_jobs_apart() -> None:
    a, b = "x" * 60 + "a", "x" * 60 + "b"
    assert len(gang_name(a, 123)) <= 63 and gang_name(a, 123).endswith("-a123")
    assert gang_name(a, 1) != gang_name(b, 1)
    assert gang_name("short", 0) == "short-a0"


def test_one_domain_and_exclusive_placement() -> None:
    job = make_job(scheduling={"placement": {"topologyKey": "example.com/rack", "exclusive": True}})
    pod = render_pod(job, 0, 3)
    assert pod["metadata"]["labels"][LABEL_JOB_UID] == UID
    (together,) = pod["spec"]["affinity"]["podAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert together["topologyKey"] == "example.com/rack"
    assert together["labelSelector"]["matchExpressions"] == [
        {"key": LABEL_JOB_UID, "operator": "In", "values": [UID]},
        {"key": names.LABEL_ATTEMPT, "operator": "In", "values": ["3"]},
    ]
    (alone,) = pod["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert alone["topologyKey"] == "example.com/rack"
    assert alone["namespaceSelector"] == {}  # every namespace's jobs
    assert alone["labelSelector"]["matchExpressions"] == [
        {"key": names.LABEL_JOB_NAME, "operator": "Exists"},
        {"key": LABEL_JOB_UID, "operator": "NotIn", "values": [UID]},
    ]


def test_one_pod_per_node_keeps_the_templates_own_affinity() -> None:
    job = make_job(scheduling={"placement": {"onePodPerNode": True}})
    mine = {"labelSelector": {"matchLabels": {"a": "b"}}, "topologyKey": "zone"}
    job["spec"]["template"]["spec"]["affinity"] = {
        "podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [mine]}
    }
    pod = render_pod(job, 0, 0)
    terms = pod["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms[0] == mine
    assert terms[1]["topologyKey"] == "kubernetes.io/hostname"
    assert terms[1]["labelSelector"] == {
        "matchExpressions": [{"key": names.LABEL_JOB_NAME, "operator": "Exists"}]
    }
    assert "podAffinity" not in pod["spec"]["affinity"]
    # The template itself is not changed.
    assert (
        len(
            job["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]
        )
        == 1
    )
