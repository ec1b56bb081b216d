import re
from typing import Any

from dtj_factory import apply, at
from hypothesis import given, settings
from pod_histories import STEPS, Step, act, jobs, timeline
from torchrun_operator.api.models import JobStatus
from torchrun_operator.reconcile import reconcile

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@settings(max_examples=60, deadline=None)
@given(job=jobs(), steps=STEPS)
def test_reconcile_is_idempotent_and_pods_are_valid(job: dict[str, Any], steps: list[Step]) -> None:
    pods: list[dict[str, Any]] = []
    for action, idx, t in timeline(steps):
        job, pods = act(action, pods, job, idx, t)
        observed = {p["metadata"]["name"] for p in pods}
        plan = reconcile(job, pods, at(t))
        JobStatus.model_validate(plan.status)
        created = [p["metadata"]["name"] for p in plan.create]
        assert len(created) == len(set(created))
        assert not set(created) & observed, "never create over an existing (even terminating) pod"
        for c in plan.create:
            assert DNS1123_LABEL.match(c["metadata"]["name"]) and len(c["metadata"]["name"]) <= 63
            assert len(c["spec"]["hostname"]) <= 63
        assert len(plan.status.get("ranks", [])) <= job["spec"]["nodes"]
        job, pods = apply(job, pods, plan, t)
        # Same inputs again (after the shell applied the plan): nothing new to do or say.
        again = reconcile(job, pods, at(t))
        assert again.create == []
        assert again.delete == []
        assert again.events == [], again.events
        job2 = {**job, "status": again.status}
        assert reconcile(job2, pods, at(t)).status == again.status
        job = job2
