"""progressTimeoutSeconds reaches the launcher through the trainer's environment."""

from __future__ import annotations

from typing import Any

import jobs
from torchrun_operator.render import render_pod


def job(**run_policy: Any) -> dict[str, Any]:
    return jobs.job(
        "j",
        image="i",
        command=["python", "x"],
        trainer={"name": "t"},
        metadata={"namespace": "ns", "uid": "u"},
        runPolicy=run_policy,
    )


def env(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_progress_timeout_env_only_when_set() -> None:
    on = env(render_pod(job(progressTimeoutSeconds=120), 1, 0))
    assert on["TORCHRUN_OPERATOR_PROGRESS_TIMEOUT"] == "120"
    assert on["TORCHRUN_OPERATOR_PROGRESS_FILE"] == "/var/run/torchrun/progress"
    assert "TORCHRUN_OPERATOR_PROGRESS_TIMEOUT" not in env(render_pod(job(), 1, 0))


def test_a_user_value_of_the_timeout_is_replaced() -> None:
    j = job(progressTimeoutSeconds=60)
    j["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "TORCHRUN_OPERATOR_PROGRESS_TIMEOUT", "value": "1"}
    ]
    names = [e["name"] for e in render_pod(j, 0, 0)["spec"]["containers"][0]["env"]]
    assert names.count("TORCHRUN_OPERATOR_PROGRESS_TIMEOUT") == 1
    assert env(render_pod(j, 0, 0))["TORCHRUN_OPERATOR_PROGRESS_TIMEOUT"] == "60"
