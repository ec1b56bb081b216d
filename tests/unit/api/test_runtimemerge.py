"""The merge of a job's spec onto its runtime's (api/runtimemerge.py, docs/runtimes.md):
its rules as properties over generated specs, and where an invalid field came from."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from torchrun_operator.api.models import JobSpec
from torchrun_operator.api.runtimemerge import explain, merge, origin
from torchrun_operator.cli.convert.onruntime import only_what_differs

Obj = dict[str, Any]

_names = st.sampled_from(["trainer", "side", "log", "init"])
_keys = st.sampled_from(["A", "B", "C", "NCCL_IB_HCA"])
_paths = st.sampled_from(["/data", "/dev/shm", "/ckpt", "/x"])
_scalars = st.one_of(st.integers(-3, 3), st.text("ab", max_size=2), st.booleans())
# Keys are unique within a list, as Kubernetes requires of containers, volumes and mounts.
_env = st.lists(
    st.fixed_dictionaries({"name": _keys, "value": st.text("xyz", max_size=2)}),
    unique_by=lambda e: e["name"],
)
_mounts = st.lists(
    st.fixed_dictionaries({"name": st.sampled_from(["v1", "v2"]), "mountPath": _paths}),
    unique_by=lambda m: m["mountPath"],
)
_resources = st.fixed_dictionaries(
    {},
    optional={
        "limits": st.dictionaries(st.sampled_from(["cpu", "memory", "rdma/ib"]), _scalars),
        "requests": st.dictionaries(st.sampled_from(["cpu", "memory"]), _scalars),
    },
)
_container = st.fixed_dictionaries(
    {"name": _names},
    optional={
        "image": st.sampled_from(["i1", "i2"]),
        "command": st.lists(st.text("pt", max_size=2), min_size=1, max_size=2),
        "env": _env,
        "volumeMounts": _mounts,
        "resources": _resources,
        "workingDir": st.text("/w", max_size=2),
    },
)
_volume = st.fixed_dictionaries(
    {"name": st.sampled_from(["v1", "v2", "v3"])},
    optional={"emptyDir": st.fixed_dictionaries({}, optional={"medium": st.just("Memory")})},
)
_toleration = st.fixed_dictionaries(
    {"key": st.sampled_from(["gpu", "ib"]), "operator": st.just("Exists")}
)
_pod = st.fixed_dictionaries(
    {},
    optional={
        "containers": st.lists(_container, max_size=3, unique_by=lambda c: str(c["name"])),
        "initContainers": st.lists(_container, max_size=2, unique_by=lambda c: str(c["name"])),
        "volumes": st.lists(_volume, max_size=3, unique_by=lambda v: str(v["name"])),
        "tolerations": st.lists(_toleration, max_size=2),
        "nodeSelector": st.dictionaries(st.sampled_from(["a", "b"]), st.text("xy", max_size=1)),
        "hostNetwork": st.booleans(),
    },
)
_spec = st.fixed_dictionaries(
    {},
    optional={
        "template": st.fixed_dictionaries({}, optional={"spec": _pod}),
        "nprocPerNode": st.integers(1, 8),
        "rendezvous": st.fixed_dictionaries(
            {}, optional={"port": st.integers(1, 9), "joinTimeoutSeconds": st.integers(1, 9)}
        ),
        "failurePolicy": st.fixed_dictionaries(
            {},
            optional={
                "maxRestarts": st.integers(0, 9),
                "retryableExitCodes": st.lists(st.integers(0, 9)),
            },
        ),
    },
)


def _pod_of(spec: Obj) -> Obj:
    return (spec.get("template") or {}).get("spec") or {}


def _by(items: list[Obj] | None, key: str) -> dict[Any, Obj]:
    """The last entry per key: what a list with a repeated key means to the merge."""
    return {i[key]: i for i in items or []}


@settings(max_examples=300, deadline=None)
@given(_spec, _spec)
def test_nothing_of_the_runtime_is_lost_that_the_job_does_not_name(runtime: Obj, job: Obj) -> None:
    """A job removes nothing it cannot see: every container, env var, volume and mount of the
    runtime is in the result, by its key, unless the job gives one of the same key."""
    out_pod, r_pod, j_pod = _pod_of(merge(runtime, job)), _pod_of(runtime), _pod_of(job)
    for field in ("containers", "initContainers"):
        out = _by(out_pod.get(field), "name")
        j = _by(j_pod.get(field), "name")
        for name, rc in _by(r_pod.get(field), "name").items():
            assert name in out
            for list_field, key in (("env", "name"), ("volumeMounts", "mountPath")):
                mine = _by(out[name].get(list_field), key)
                theirs = _by((j.get(name) or {}).get(list_field), key)
                for k, entry in _by(rc.get(list_field), key).items():
                    assert mine[k] == theirs.get(k, entry)
    out_volumes = _by(out_pod.get("volumes"), "name")
    job_volumes = _by(j_pod.get("volumes"), "name")
    for name, v in _by(r_pod.get("volumes"), "name").items():
        assert out_volumes[name] == job_volumes.get(name, v)
    for t in r_pod.get("tolerations") or []:
        assert t in out_pod["tolerations"]
    for k, v in (r_pod.get("nodeSelector") or {}).items():
        assert out_pod["nodeSelector"][k] == (j_pod.get("nodeSelector") or {}).get(k, v)


@settings(max_examples=300, deadline=None)
@given(_spec, _spec)
def test_what_the_job_sets_wins(runtime: Obj, job: Obj) -> None:
    """Scalars, resources (per resource name), env by name, volumes by name, mounts by path
    and whole lists of scalars come from the job where it gives them."""
    out = merge(runtime, job)
    for key in ("nprocPerNode",):
        if key in job:
            assert out[key] == job[key]
    for section in ("rendezvous", "failurePolicy"):
        for k, v in (job.get(section) or {}).items():
            assert out[section][k] == v  # retryableExitCodes: the job's list, whole
    out_pod, j_pod = _pod_of(out), _pod_of(job)
    if "hostNetwork" in j_pod:
        assert out_pod["hostNetwork"] == j_pod["hostNetwork"]
    out_c = _by(out_pod.get("containers"), "name")
    for name, jc in _by(j_pod.get("containers"), "name").items():
        mine = out_c[name]
        for k in ("image", "command", "workingDir"):
            if k in jc:
                assert mine[k] == jc[k]
        for table, quantities in (jc.get("resources") or {}).items():
            for res, q in quantities.items():
                assert mine["resources"][table][res] == q
        for list_field, key in (("env", "name"), ("volumeMounts", "mountPath")):
            for k, entry in _by(jc.get(list_field), key).items():
                assert _by(mine[list_field], key)[k] == entry
    for name, v in _by(j_pod.get("volumes"), "name").items():
        assert _by(out_pod["volumes"], "name")[name] == v


@settings(max_examples=200, deadline=None)
@given(_spec, _spec)
def test_runtime_order_first_then_the_jobs_new_containers(runtime: Obj, job: Obj) -> None:
    """The runtime's first container (the trainer) stays first; the job's new ones follow."""
    r_names = list(_by(_pod_of(runtime).get("containers"), "name"))
    out_names = [c["name"] for c in _pod_of(merge(runtime, job)).get("containers") or []]
    seen_r = [n for n in out_names if n in r_names]
    assert out_names[: len(seen_r)] == seen_r
    first = [c["name"] for c in _pod_of(runtime).get("containers") or []][:1]
    assert out_names[:1] == first or not first


@settings(max_examples=200, deadline=None)
@given(_spec, _spec)
def test_merge_is_idempotent_and_changes_neither_input(runtime: Obj, job: Obj) -> None:
    r0, j0 = copy.deepcopy(runtime), copy.deepcopy(job)
    once = merge(runtime, job)
    assert runtime == r0 and job == j0
    assert merge(once, job) == once


@settings(max_examples=200, deadline=None)
@given(_spec)
def test_an_empty_side_changes_nothing(spec: Obj) -> None:
    assert merge(spec, {}) == merge({}, spec)
    assert merge(merge(spec, {}), {}) == merge(spec, {})


def test_a_null_in_the_job_removes_nothing() -> None:
    runtime = {"template": {"spec": {"nodeSelector": {"a": "1"}, "containers": [{"name": "t"}]}}}
    job = {"template": {"spec": {"nodeSelector": None, "containers": None}}}
    assert merge(runtime, job) == runtime


def _runtime() -> Obj:
    return {
        "nprocPerNode": 2,
        "template": {
            "spec": {
                "containers": [
                    {
                        "name": "trainer",
                        "image": "rt-image",
                        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
                        "volumeMounts": [{"name": "bad", "mountPath": "/opt/torchrun-operator"}],
                    }
                ],
                "volumes": [{"name": "bad", "emptyDir": {}}],
            }
        },
    }


def test_an_invalid_merge_names_the_field_and_the_runtime_it_came_from() -> None:
    job = {
        "nodes": 2,
        "template": {"spec": {"containers": [{"name": "trainer", "command": ["python", "t.py"]}]}},
    }
    merged = merge(_runtime(), job)
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(merged)
    message = explain(err.value, merged, job, "ClusterDistributedTrainingRuntime gpu")
    assert "spec.template.spec" in message
    assert "(from the job merged onto the runtime ClusterDistributedTrainingRuntime gpu)" in message
    # The trainer's command, given by neither: the runtime's container is named as its origin.
    no_command = {"nodes": 2}
    merged = merge(_runtime(), no_command)
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(merged)
    message = explain(err.value, merged, no_command, "ClusterDistributedTrainingRuntime gpu")
    assert message == (
        "spec.template.spec.containers[0].command (from the runtime "
        "ClusterDistributedTrainingRuntime gpu): Field required"
    )


def test_a_bad_value_the_job_gave_is_the_jobs() -> None:
    job = {
        "nodes": 0,
        "template": {"spec": {"containers": [{"name": "trainer", "command": ["python"]}]}},
    }
    runtime = {"template": {"spec": {"containers": [{"name": "trainer", "image": "i"}]}}}
    merged = merge(runtime, job)
    with pytest.raises(ValidationError) as err:
        JobSpec.model_validate(merged)
    assert explain(err.value, merged, job, "X y").startswith("spec.nodes (from the job): ")


def test_origin_follows_containers_by_name_not_position() -> None:
    runtime = {
        "template": {
            "spec": {
                "containers": [
                    {"name": "trainer", "image": "a"},
                    {"name": "side", "image": "s", "workingDir": "/w"},
                ]
            }
        }
    }
    job = {"template": {"spec": {"containers": [{"name": "side", "image": "mine"}]}}}
    merged = merge(runtime, job)
    loc = ("template", "spec", "containers", 1, "image")
    assert origin(loc, merged, job) == "job"
    assert origin(("template", "spec", "containers", 0, "image"), merged, job) == "runtime"
    assert origin(("template", "spec", "containers", 1), merged, job) == "job and runtime"


# ---- the inverse: kubectl dtj convert --runtime (cli/convert/onruntime.py) -------------------


@settings(max_examples=300, deadline=None)
@given(_spec, _spec)
def test_keeping_only_what_differs_merges_to_the_same_spec(runtime: Obj, job: Obj) -> None:
    """What convert --runtime drops from a job, the runtime gives back: merging the reduced
    job onto the runtime gives what merging the whole job gives."""
    reduced = only_what_differs(runtime, job)
    assert merge(runtime, reduced) == merge(runtime, job)
    assert only_what_differs(runtime, reduced) == reduced  # nothing more to drop


def test_a_job_equal_to_its_runtime_keeps_nothing() -> None:
    spec = {"nprocPerNode": 2, "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}}}
    assert only_what_differs(spec, copy.deepcopy(spec)) == {}
