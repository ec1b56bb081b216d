"""Thin wrapper over the official client: plain dicts in and out, retries with back-off."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)
T = TypeVar("T")
JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"


def load(kubeconfig: str) -> client.ApiClient:
    api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)
    return api


def raw(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call a generated client method and return the response body as a dict."""
    resp = fn(*args, _preload_content=False, **kwargs)
    data = resp.data
    return json.loads(data) if data else {}


def status_of(e: BaseException) -> int | None:
    return e.status if isinstance(e, ApiException) else None


def retry(
    fn: Callable[[], T],
    what: str,
    attempts: int = 6,
    stop: Callable[[], bool] | None = None,
    ok_statuses: tuple[int, ...] = (),
) -> T | None:
    """Retry transient failures with exponential back-off; 4xx other than 409/429 are final.
    Returns None when the call failed with a status in `ok_statuses` (e.g. 404 after delete)."""
    delay = 0.2
    for i in range(attempts):
        try:
            return fn()
        except ApiException as e:
            if e.status in ok_statuses:
                return None
            if e.status is not None and 400 <= e.status < 500 and e.status not in (409, 429):
                raise
            if i == attempts - 1:
                raise
            log.warning("%s failed (%s), retrying", what, e.status)
        except Exception as e:  # connection errors: the apiserver may be restarting
            if i == attempts - 1:
                raise
            log.warning("%s failed (%s), retrying", what, e)
        if stop and stop():
            return None
        time.sleep(delay)
        delay = min(delay * 2, 5.0)
    return None
