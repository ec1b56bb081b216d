"""spec.checkpoint in the pods: the same storage at the same path in every pod, its path in
TORCHRUN_OPERATOR_CHECKPOINT_DIR, and the latest reported checkpoint (status.lastCheckpoint)
in TORCHRUN_OPERATOR_RESUME_FROM of every pod created after it was reported."""

from __future__ import annotations

from typing import Any

import jobs
from torchrun_operator.reconcile.attempts import spec_hash
from torchrun_operator.render import render_pod
from torchrun_operator.render.sizing import job_spec


def doc(checkpoint: dict[str, Any] | None, status: dict[str, Any] | None = None) -> Any:
    d = jobs.job("j", metadata={"namespace": "ns", "uid": "u"}, status=status)
    if checkpoint is not None:
        d["spec"]["checkpoint"] = checkpoint
    return d


def env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def ckpt_volume(pod: dict[str, Any]) -> dict[str, Any]:
    return next(v for v in pod["spec"]["volumes"] if v["name"] == "torchrun-checkpoint")


def test_a_claim_is_mounted_at_the_mount_path_of_every_pod() -> None:
    pods = [render_pod(doc({"claimName": "ckpt", "mountPath": "/ckpt"}), i, 0) for i in (0, 1)]
    for pod in pods:
        assert ckpt_volume(pod) == {
            "name": "torchrun-checkpoint",
            "persistentVolumeClaim": {"claimName": "ckpt"},
        }
        mounts = pod["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "torchrun-checkpoint", "mountPath": "/ckpt"} in mounts
        assert env(pod)["TORCHRUN_OPERATOR_CHECKPOINT_DIR"] == "/ckpt"
        assert "TORCHRUN_OPERATOR_RESUME_FROM" not in env(pod)  # nothing reported yet


def test_a_volume_source_is_used_as_given_under_the_operators_name() -> None:
    source = {"hostPath": {"path": "/srv/ckpt", "type": "DirectoryOrCreate"}}
    pod = render_pod(doc({"volume": source}), 0, 0)
    assert ckpt_volume(pod) == {"name": "torchrun-checkpoint", **source}
    assert env(pod)["TORCHRUN_OPERATOR_CHECKPOINT_DIR"] == "/checkpoints"  # the default


def test_pods_created_after_a_checkpoint_was_reported_resume_from_it() -> None:
    last = {"step": 40, "path": "/ckpt/step-40.pt", "time": "2026-01-01T00:00:00Z"}
    d = doc(
        {"claimName": "ckpt", "mountPath": "/ckpt"}, status={"attempt": 1, "lastCheckpoint": last}
    )
    for pod in (render_pod(d, 0, 1), render_pod(d, 1, 1, replacement=1)):
        assert env(pod)["TORCHRUN_OPERATOR_RESUME_FROM"] == "/ckpt/step-40.pt"


def test_user_values_of_the_operators_variables_are_replaced() -> None:
    last = {"step": 1, "path": "/checkpoints/a"}
    d = doc({"claimName": "ckpt"}, status={"lastCheckpoint": last})
    d["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "TORCHRUN_OPERATOR_CHECKPOINT_DIR", "value": "/elsewhere"},
        {"name": "TORCHRUN_OPERATOR_RESUME_FROM", "value": "/stale"},
    ]
    rendered = render_pod(d, 0, 0)["spec"]["containers"][0]["env"]
    values = [(e["name"], e["value"]) for e in rendered if "CHECKPOINT_DIR" in e["name"]]
    assert values == [("TORCHRUN_OPERATOR_CHECKPOINT_DIR", "/checkpoints")]
    assert env(render_pod(d, 0, 0))["TORCHRUN_OPERATOR_RESUME_FROM"] == "/checkpoints/a"


def test_a_last_checkpoint_outside_the_mount_is_never_resumed_from() -> None:
    # The reconciler refuses such reports; one the status holds from before (another
    # mountPath, an older operator) must not reach a pod either.
    for path in ("/elsewhere/step-40.pt", "/ckpt/../etc/shadow", "step-40.pt", "/ckptx/40"):
        last = {"step": 40, "path": path, "time": "2026-01-01T00:00:00Z"}
        d = doc({"claimName": "ckpt", "mountPath": "/ckpt"}, status={"lastCheckpoint": last})
        told = env(render_pod(d, 0, 1))
        assert told["TORCHRUN_OPERATOR_CHECKPOINT_DIR"] == "/ckpt"
        assert "TORCHRUN_OPERATOR_RESUME_FROM" not in told, path


def test_without_spec_checkpoint_nothing_is_added_and_the_attempt_hash_is_unchanged() -> None:
    pod = render_pod(doc(None, status={"lastCheckpoint": {"step": 1, "path": "/a"}}), 0, 0)
    assert not any(v["name"] == "torchrun-checkpoint" for v in pod["spec"]["volumes"])
    assert not any(k.startswith("TORCHRUN_OPERATOR_CHECKPOINT") for k in env(pod))
    assert "TORCHRUN_OPERATOR_RESUME_FROM" not in env(pod)
    # A job without checkpoint hashes as before the field existed (no restart on upgrade);
    # setting one changes the pods, hence the hash.
    # (the hash the operator computed for this job before spec.checkpoint existed)
    assert spec_hash(job_spec(doc(None))) == "v1-4f70233f2f4b65d5"
    assert spec_hash(job_spec(doc({"claimName": "c"}))) != spec_hash(job_spec(doc(None)))
