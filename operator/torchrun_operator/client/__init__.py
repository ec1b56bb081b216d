"""torchrun_operator.client: the Python SDK for DistributedTrainingJobs (docs/sdk.md).

    from torchrun_operator.client import Client
    c = Client()
    job = c.submit(spec, name="mnist")
    status = c.wait("mnist", timeout=3600)

It needs only kubernetes, pydantic and pyyaml (`pip install torchrun-operator`); the
operator's own dependencies (kopf, prometheus-client) are the `operator` extra.
"""

from .client import Client
from .errors import (
    ClientError,
    JobFailed,
    JobNotFound,
    LogsUnavailable,
    RankNotFound,
    WaitTimeout,
)
from .job import Job

__all__ = [
    "Client",
    "ClientError",
    "Job",
    "JobFailed",
    "JobNotFound",
    "LogsUnavailable",
    "RankNotFound",
    "WaitTimeout",
]
