"""Exponential back-off, one shape for the kube/ loops: `doubling` (a delay that doubles with
each failure in a row, capped, safe for any count) and `Backoff` (the watches' re-list:
doubling with jitter, reset after a quiet spell). kube/podwatch.py's watches and
kube/rankmap.py's reads of pods that keep failing use them."""

from __future__ import annotations

import random
import time
from collections.abc import Callable

# Back-off between failed attempts, as client-go's reflector does it: from 0.8 s, doubling,
# at most 30 s. Each delay is drawn from [d/2, d] so replicas that failed together (an
# apiserver restart) do not come back in lockstep.
BACKOFF_INITIAL_SECONDS = 0.8
BACKOFF_MAX_SECONDS = 30.0
# A failure this long after the previous one starts again from the initial delay (client-go:
# 2 minutes): one broken stream an hour should not wait like the tenth in a row.
BACKOFF_RESET_SECONDS = 120.0


def doubling(initial: float, streak: int, cap: float) -> float:
    """`initial` after the first failure in a row (`streak` 1), doubled for each more, at most
    `cap`. min() before the power: 2**streak alone overflows a float past ~1000 failures."""
    delay: float = min(cap, initial * 2 ** min(max(streak - 1, 0), 64))
    return delay


class Backoff:
    """Exponential back-off with jitter, capped, reset after a quiet spell."""

    def __init__(
        self,
        initial: float = BACKOFF_INITIAL_SECONDS,
        cap: float = BACKOFF_MAX_SECONDS,
        reset_after: float = BACKOFF_RESET_SECONDS,
        clock: Callable[[], float] = time.monotonic,
        rand: Callable[[], float] = random.random,
    ) -> None:
        self._initial, self._cap, self._reset_after = initial, cap, reset_after
        self._clock, self._rand = clock, rand
        self._last: float | None = None
        self.streak = 0  # failures in a row, this one included

    def next(self) -> float:
        """Records a failure; returns how long to wait before the next attempt."""
        now = self._clock()
        if self._last is None or now - self._last > self._reset_after:
            self.streak = 0
        self._last = now
        self.streak += 1
        full = doubling(self._initial, self.streak, self._cap)
        return full / 2 + self._rand() * full / 2
