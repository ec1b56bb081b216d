from typing import Any

import jobs
import pytest
from pydantic import ValidationError
from torchrun_operator.api.models import JobSpec


def spec(**over: Any) -> dict[str, Any]:
    """A job's spec (tests/jobs.py); `container`: fields of its trainer, `over`: of the spec."""
    trainer = {"name": "t", **over.pop("container", {})}
    spec: dict[str, Any] = jobs.job(command=["python", "x.py"], trainer=trainer, **over)["spec"]
    return spec


def test_defaults() -> None:
    s = JobSpec.model_validate(spec())
    assert s.rendezvous.port == 29400
    assert s.rendezvous.join_timeout_seconds == 600
    assert s.rendezvous.dns_timeout_seconds == 300
    assert s.torchrun.max_restarts == 0
    assert s.success_policy == "AllRanks"
    assert s.failure_policy.max_restarts == 3
    assert s.failure_policy.backoff_seconds == 10
    assert s.failure_policy.max_backoff_seconds == 300
    assert s.run_policy.clean_pod_policy == "KeepFailed"
    assert s.run_policy.suspend is False
    assert s.nproc_per_node is None


@pytest.mark.parametrize(
    "bad",
    [
        spec(nodes=0),
        spec(container={"image": ""}),
        spec(container={"command": []}),
        spec(nprocPerNode="gpu"),
        spec(nprocPerNode="cpu"),
        spec(nprocPerNode=0),
        spec(nodes=2, elastic={"minNodes": 3}),
        spec(nodes=4, elastic={"minNodes": 1, "maxNodes": 3}),
        spec(bogus=1),
        spec(runPolicy={"cleanPodPolicy": "Never"}),
    ],
)
def test_invalid_specs_rejected(bad: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        JobSpec.model_validate(bad)


def test_missing_command_rejected() -> None:
    s = spec()
    del s["template"]["spec"]["containers"][0]["command"]
    with pytest.raises(ValidationError):
        JobSpec.model_validate(s)


def test_elastic_and_gpu_accepted() -> None:
    s = JobSpec.model_validate(
        spec(
            nodes=3,
            elastic={"minNodes": 2, "maxNodes": 4},
            nprocPerNode="gpu",
            container={"resources": {"limits": {"nvidia.com/gpu": "8"}}, "env": [{"name": "A"}]},
        )
    )
    assert s.is_elastic and (s.min_nodes, s.max_nodes) == (2, 4)
