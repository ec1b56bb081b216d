"""`kubectl dtj run`'s pure parts: the ConfigMap that ships the code, the job that runs it, the
progress line; and its command line as a person types it."""

from __future__ import annotations

import base64
import io
import tarfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jobs
import pytest
from torchrun_operator.api.models import JobSpec
from torchrun_operator.cli import run as R
from torchrun_operator.cli.main import build_parser
from torchrun_operator.client import Job


def parse(*argv: str) -> Any:
    return build_parser().parse_args(["run", *argv])


def test_the_command_line_as_torchrun_users_type_it() -> None:
    a = parse(
        "--nodes", "2", "--nproc-per-node", "gpu", "--gpus", "8", "train.py", "--", "--lr", "0.1"
    )
    assert (a.nodes, a.nproc_per_node, a.gpus, a.target) == (2, "gpu", 8, "train.py")
    assert R.script_args(a.args) == ["--lr", "0.1"]
    a = parse("train.py")
    assert (a.nodes, a.rank, a.detach, a.rm, R.script_args(a.args)) == (1, 0, False, False, [])


def test_job_names_are_dns_labels_from_the_script() -> None:
    assert R.job_name(Path("my_Train.py"), "abc123") == "my-train-abc123"
    assert R.job_name(Path("/x/2nd.py"), "abc123") == "nd-abc123"
    assert R.job_name(Path("___.py"), "abc123") == "job-abc123"
    assert len(R.job_name(Path("a" * 100 + ".py"), "abc123")) <= 63 - 16 + 1


def test_a_script_ships_as_data_and_runs_from_the_workspace(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    cm, path = R.code_configmap("t-code", script, None)
    assert cm["data"] == {"train.py": "print('hi')\n"} and path == "/workspace/train.py"
    doc = R.job_object(parse("--nodes", "2", str(script), "--", "-x", "1"), "t", cm, path)
    spec = JobSpec.model_validate(doc["spec"])  # a valid job
    assert spec.nodes == 2 and spec.nproc_per_node is None
    assert spec.trainer.command == ["python", "/workspace/train.py", "-x", "1"]
    assert doc["spec"]["template"]["spec"]["volumes"] == [
        {"name": "code", "configMap": {"name": "t-code"}}
    ]


def test_a_directory_ships_as_a_tar_that_an_init_container_unpacks(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text("X = 1\n")
    (tmp_path / "train.py").write_text("import pkg.model\n")
    (tmp_path / "__pycache__").mkdir()
    (tmp_path / "__pycache__" / "x.pyc").write_bytes(b"\0")
    cm, path = R.code_configmap("t-code", tmp_path, None)
    assert path == "/workspace/train.py" and "data" not in cm
    raw = io.BytesIO(base64.b64decode(cm["binaryData"][R.TARBALL]))
    with tarfile.open(fileobj=raw) as tar:
        assert sorted(tar.getnames()) == ["pkg", "pkg/model.py", "train.py"]
    doc = R.job_object(
        parse("--gpus", "2", "--nproc-per-node", "gpu", str(tmp_path)), "t", cm, path
    )
    spec = JobSpec.model_validate(doc["spec"])
    assert spec.nproc_per_node == "gpu" and spec.trainer.resources is not None
    pod = doc["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert (
        init["command"][:2] == ["python", "-c"] and "extractall('/workspace'" in init["command"][2]
    )
    assert {v["name"] for v in pod["volumes"]} == {"code", "code-tar"}
    # --script picks another entry point
    assert R.code_configmap("t-code", tmp_path, "pkg/model.py")[1] == "/workspace/pkg/model.py"


def test_what_cannot_be_shipped_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(R.RunError, match="no such file or directory"):
        R.code_configmap("c", tmp_path / "nope.py", None)
    with pytest.raises(
        R.RunError, match="has no train.py or main.py: name the script with --script"
    ):
        R.code_configmap("c", tmp_path, None)
    big = tmp_path / "big.py"
    big.write_text("#" * (R.MAX_PAYLOAD_BYTES + 1))
    with pytest.raises(R.RunError, match=r"over the 1008 KiB a ConfigMap can hold.*--image"):
        R.code_configmap("c", big, None)
    with pytest.raises(R.RunError, match='positive number or "gpu"'):
        R.job_object(parse("--nproc-per-node", "0", "x.py"), "t", {"metadata": {"name": "c"}}, "/w")


def test_the_progress_line_shows_phase_pods_step_rate_and_eta() -> None:
    status = {
        "phase": "Running",
        "attempt": 1,
        "nodes": {"desired": 2, "ready": 2},
        "progress": {
            "step": 120,
            "totalSteps": 1000,
            "stepsPerSecond": 2.5,
            "eta": "2026-01-01T00:05:00Z",
        },
    }
    job = Job.from_object(jobs.job("t", status=status))
    now = datetime(2026, 1, 1, tzinfo=UTC)
    assert R.progress_line(job, now) == (
        "Running 2/2 pods ready, attempt 1 | step 120/1000, 2.5 steps/s, "
        "ETA 2026-01-01T00:05:00Z (in 5m)"
    )
    assert R.progress_line(Job.from_object(jobs.job("t")), now) == "Pending 0/2 pods ready"


def test_the_screen_prints_each_new_progress_line_when_not_a_terminal() -> None:
    out, err = io.StringIO(), io.StringIO()
    screen = R.Screen(out, err)
    screen.status("Running 1/2")
    screen.status("Running 1/2")  # unchanged: not repeated
    screen.log("step 1")
    screen.status("Running 2/2")
    assert err.getvalue() == "Running 1/2\nRunning 2/2\n" and out.getvalue() == "step 1\n"


def test_on_a_runtime_the_job_names_it_and_leaves_the_image_to_it(tmp_path: Path) -> None:
    """`--runtime NAME`: spec.runtimeRef, no image of our own (the runtime's trainer gives it,
    docs/runtimes.md); merged onto a runtime, the job is valid."""
    from torchrun_operator.api.models import JobSpec
    from torchrun_operator.api.runtimemerge import merge

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    cm, path = R.code_configmap("t-code", script, None)
    doc = R.job_object(parse("--runtime", "torch-gpu", "--nodes", "2", str(script)), "t", cm, path)
    spec = doc["spec"]
    assert spec["runtimeRef"] == {"kind": "ClusterDistributedTrainingRuntime", "name": "torch-gpu"}
    assert "image" not in spec["template"]["spec"]["containers"][0]
    runtime = {"template": {"spec": {"containers": [{"name": "trainer", "image": "rt:1"}]}}}
    merged = merge(runtime, spec)
    JobSpec.model_validate(merged)  # what the operator validates: the merged spec
    assert merged["template"]["spec"]["containers"][0]["image"] == "rt:1"
    assert merged["template"]["spec"]["containers"][0]["command"][:2] == ["python", path]

    ns = parse("--runtime", "mine", "--runtime-kind", "DistributedTrainingRuntime", str(script))
    assert R.job_object(ns, "t", cm, path)["spec"]["runtimeRef"]["kind"] == (
        "DistributedTrainingRuntime"
    )
    # --image still wins over the runtime's.
    own = R.job_object(parse("--runtime", "x", "--image", "me:2", str(script)), "t", cm, path)
    assert own["spec"]["template"]["spec"]["containers"][0]["image"] == "me:2"


def test_a_directory_on_a_runtime_needs_an_image_for_its_unpack_step(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print(1)\n")
    cm, path = R.code_configmap("t-code", tmp_path, None)
    with pytest.raises(R.RunError, match="--image"):
        R.job_object(parse("--runtime", "x", str(tmp_path)), "t", cm, path)
