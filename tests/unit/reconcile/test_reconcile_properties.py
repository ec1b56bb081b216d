import re
from typing import Any

from hypothesis import given, settings
from pod_histories import STEPS, Step, drive, jobs
from torchrun_operator.api.models import JobStatus

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@settings(max_examples=60, deadline=None)
@given(job=jobs(), steps=STEPS)
def test_reconcile_is_idempotent_and_pods_are_valid(job: dict[str, Any], steps: list[Step]) -> None:
    # `drive` checks idempotence after each step (pod_histories.settled): the same inputs
    # again, after the shell applied the plan, give nothing new to do or say.
    for now in drive(job, steps):
        plan = now.plan
        observed = {p["metadata"]["name"] for p in now.pods}
        JobStatus.model_validate(plan.status)
        created = [p["metadata"]["name"] for p in plan.create]
        assert len(created) == len(set(created))
        assert not set(created) & observed, "never create over an existing (even terminating) pod"
        for c in plan.create:
            assert DNS1123_LABEL.match(c["metadata"]["name"]) and len(c["metadata"]["name"]) <= 63
            assert len(c["spec"]["hostname"]) <= 63
        assert len(plan.status.get("ranks", [])) <= now.job["spec"]["nodes"]
