"""What the SDK raises: each error says what a person needs to act, in its message."""

from __future__ import annotations

from typing import Any


class ClientError(Exception):
    """Base of the SDK's own errors (the kubernetes client's ApiException passes through for
    anything else the apiserver refuses)."""


class JobNotFound(ClientError):
    def __init__(self, namespace: str, name: str) -> None:
        super().__init__(f"distributedtrainingjob {name!r} not found in namespace {namespace!r}")
        self.namespace, self.name = namespace, name


class JobFailed(ClientError):
    """The job ended Failed; `failure` is status.failure (the root cause), `job` the job as
    it ended."""

    def __init__(self, job: Any, message: str) -> None:
        super().__init__(message)
        self.job = job
        self.failure = job.status.failure


class WaitTimeout(ClientError, TimeoutError):
    """The job did not finish in time; `job` is the job as last seen (None: never seen)."""

    def __init__(self, job: Any, timeout: float) -> None:
        phase = job.status.phase if job is not None else None
        super().__init__(f"the job did not finish within {timeout:g}s (phase {phase or '-'})")
        self.job = job


class RankNotFound(ClientError):
    """No pod holds the rank (yet): the message says what is known."""


class LogsUnavailable(ClientError):
    """The apiserver could not give the pod's logs: `status` and `body` are its answer,
    `entry` the status.ranks entry of the pod."""

    def __init__(self, message: str, status: int | None, body: object, entry: Any) -> None:
        super().__init__(message)
        self.status, self.body, self.entry = status, body, entry
