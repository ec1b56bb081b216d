"""A stand-in for the kubernetes client's REST layer: records requests, answers from a script."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass, field
from typing import Any, cast

import urllib3
from kubernetes import client
from kubernetes.client import rest
from torchrun_operator.kube import client as kclient
from torchrun_operator.kube import faults


class Body(io.BytesIO):
    """A response body that reads as closed once consumed, as a socket's does at EOF: urllib3
    streams (watches) until then."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self._size = len(data)

    def isclosed(self) -> bool:
        return self.closed or self.tell() >= self._size


@dataclass
class Sent:
    method: str
    url: str
    timeout: Any
    headers: Any = None
    body: Any = None


@dataclass
class FakeTransport:
    """Answers every request with `body` (JSON) and status 200, or with the next of
    `answers` (status, body) while there are any."""

    body: Any = field(default_factory=lambda: {"kind": "Pod", "metadata": {"name": "p"}})
    answers: list[tuple[int, Any]] = field(default_factory=list)
    sent: list[Sent] = field(default_factory=list)

    def request(
        self,
        method: str,
        url: str,
        headers: Any = None,
        body: Any = None,
        post_params: Any = None,
        _request_timeout: Any = None,
    ) -> rest.RESTResponse:
        self.sent.append(Sent(method, url, _request_timeout, headers, body))
        status, answer = self.answers.pop(0) if self.answers else (200, self.body)
        data = answer if isinstance(answer, bytes) else json.dumps(answer).encode()
        raw = urllib3.HTTPResponse(
            body=Body(data),
            status=status,
            headers={"Content-Type": "application/json"},
            preload_content=False,
        )
        return rest.RESTResponse(raw)

    def close(self) -> None:
        pass


def api(transport: FakeTransport, injector: faults.Injector | None = None) -> kclient.ApiClient:
    cfg = client.Configuration(host="https://apiserver.test")
    a = kclient.ApiClient(cfg, injector=injector)
    a.rest_client = cast(rest.RESTClientObject, transport)  # it answers what ApiClient asks
    return a
