"""kube/events: the Event a job gets, and that a lost one never fails a reconcile."""

import datetime as dt
from typing import Any

import jobs
from fake_transport import FakeTransport, api
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube import events

JOB = jobs.document("j", namespace="ns", uid="u1")
NOW = dt.datetime(2026, 1, 2, 3, 4, 5, 678, tzinfo=dt.UTC)


def test_the_event_names_the_job_by_uid_and_is_generated_under_its_name() -> None:
    ev = events.event(JOB, "Warning", "Failed", "x" * 5000, NOW)
    assert ev["metadata"] == {"generateName": "j.", "namespace": "ns"}
    assert ev["involvedObject"] == {
        "apiVersion": "torchrun.dev/v1alpha1",
        "kind": "DistributedTrainingJob",
        "name": "j",
        "namespace": "ns",
        "uid": "u1",
    }
    assert (ev["type"], ev["reason"], len(ev["message"])) == ("Warning", "Failed", 1024)
    assert ev["firstTimestamp"] == ev["lastTimestamp"] == "2026-01-02T03:04:05Z"
    assert ev["source"] == {"component": events.COMPONENT}


def test_post_creates_it_in_the_jobs_namespace() -> None:
    t = FakeTransport()
    events.post(kclient.Writes(api(t)), JOB, "Normal", "Created", "pods created")
    (sent,) = t.sent
    assert (sent.method, sent.url) == ("POST", "https://apiserver.test/api/v1/namespaces/ns/events")
    body: Any = sent.body
    assert (body["kind"], body["reason"], body["message"]) == ("Event", "Created", "pods created")


def test_an_event_the_apiserver_refuses_is_logged_not_raised(caplog: Any) -> None:
    t = FakeTransport(answers=[(403, {"kind": "Status", "message": "events are forbidden"})])
    events.post(kclient.Writes(api(t)), JOB, "Normal", "Created", "pods created")
    assert "could not post event Created on j" in caplog.text
