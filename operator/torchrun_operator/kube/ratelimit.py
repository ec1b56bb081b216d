"""A client-side limit on the operator's API requests: a token bucket, as client-go's clients
have (flowcontrol.NewTokenBucketRateLimiter). The operator shares the apiserver with every
other tenant; API Priority and Fairness protects the server, this keeps one operator from
being the reason it must.

`burst` requests may go at once; after that one request per 1/`qps` seconds. A request that
finds the bucket empty reserves the next token and sleeps until it is due, so waiting
requests leave in the order they came, and nothing spins.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# kube-scheduler's client defaults (KubeSchedulerConfiguration.clientConnection): a controller
# that creates pods in bursts, as ours does for a large gang. client-go's own (5/10) and
# controller-runtime's (20/30) would spread a 512-pod gang over 17 to 25 s.
DEFAULT_QPS = 50.0
DEFAULT_BURST = 100


class TokenBucket:
    """`qps` tokens a second, at most `burst` banked; qps 0 means no limit."""

    def __init__(
        self,
        qps: float,
        burst: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        observe: Callable[[float], None] | None = None,
    ) -> None:
        if qps < 0:
            raise ValueError(f"qps must be >= 0 (0: no limit), not {qps}")
        if burst < 1:
            raise ValueError(f"burst must be >= 1, not {burst}")
        self.qps = qps
        self.burst = burst
        self._clock = clock
        self._sleep = sleep
        self._observe = observe
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def reserve(self) -> float:
        """Takes one token, banked or yet to come; returns the seconds until it is due."""
        if self.qps == 0:
            return 0.0
        with self._lock:
            now = self._clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.qps)
            self._last = now
            self._tokens -= 1.0
            return 0.0 if self._tokens >= 0 else -self._tokens / self.qps

    def wait(self) -> float:
        """Blocks until this request may go; returns the seconds it waited."""
        delay = self.reserve()
        if delay > 0:
            self._sleep(delay)
        if self._observe is not None:
            self._observe(delay)
        return delay
