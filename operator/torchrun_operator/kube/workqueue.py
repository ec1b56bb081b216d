"""A keyed work queue with delays and de-duplication, as controller-runtime has.

Many pod events for one job collapse into one pending key, so a burst of 512 pod updates
costs a handful of reconciles, and a key is never processed by two workers at once (a key that
is re-added while it is being processed runs once more afterwards). A key whose processing
fails comes back after a per-key exponential back-off (backoff_delay), reset by a success;
one that the apiserver was too slow for comes back within seconds (slow_delay), its back-off
neither grown nor reset.

A key added as urgent (a change seen in a job's pods or Workload) goes before keys added
otherwise (a new or edited job): a failure in a running gang, or the status of pods that just
started, must not wait behind a burst of hundreds of new jobs being set up, each of which
spends several requests of the client's rate limit. controller-runtime's priority queue
orders its initial list below live events for the same reason. So that new jobs still start
while many running ones change, a normal key goes after at most URGENT_IN_A_ROW urgent ones.
"""

from __future__ import annotations

import heapq
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

from .backoff import doubling

# The longest any key waits, whatever delay it was added with. A reconcile re-plans its next
# wake-up every time it runs, so waking a far-off key early costs one reconcile an hour; an
# unbounded delay (a spec's activeDeadlineSeconds is an int64) overflows Condition.wait, whose
# limit is threading.TIMEOUT_MAX, and the OverflowError would kill the worker inside get().
MAX_DELAY_SECONDS = 3600.0

# Urgent keys handed out in a row before a waiting normal one. Each key is one reconcile, so a
# normal key waits for at most this many reconciles per worker beyond its turn among its kind.
URGENT_IN_A_ROW = 4


# After a failed reconcile: 2 s, then twice as long after each failure in a row, at most
# 5 minutes (a job that fails that often waits on a person or on an apiserver that is down;
# a watch event still wakes it at once). The jitter spreads the jobs that failed together
# (the apiserver was away) so that they do not all come back in the same second.
BACKOFF_BASE_SECONDS = 2.0
BACKOFF_MAX_SECONDS = 300.0
BACKOFF_JITTER = 0.2


def backoff_delay(
    failures: int,
    jitter: float = 0.0,
    base: float = BACKOFF_BASE_SECONDS,
    cap: float = BACKOFF_MAX_SECONDS,
) -> float:
    """Seconds to wait after `failures` failures in a row (0: none, no wait): `base` doubled
    for each after the first, at most `cap`, less up to BACKOFF_JITTER of it for `jitter` in
    [0, 1]. For one jitter it never shrinks as failures grow, and never passes the cap."""
    if failures < 1:
        return 0.0
    delay = doubling(base, failures, cap)
    return delay * (1.0 - BACKOFF_JITTER * min(max(jitter, 0.0), 1.0))


# After a reconcile that the apiserver was too slow for (a write timed out, a 429, 503 or 504,
# kube/client.is_slow): again after 2 s, or the Retry-After asked, at most 10 s, whatever
# failed before. Slow is not broken: the job's back-off would climb to 5 minutes over a
# control plane that answers in 10 s, while each try lands some of its writes (the reconcile
# reads back what landed) and the next does the rest. No faster than 2 s: each try costs the
# busy apiserver requests, and the client's rate limit already paces them. The jitter spreads
# jobs that were slow together.
SLOW_RETRY_SECONDS = 2.0
SLOW_RETRY_MAX_SECONDS = 10.0


def slow_delay(asked: float | None, jitter: float = 0.0) -> float:
    """Seconds to wait after a slow try: SLOW_RETRY_SECONDS less up to BACKOFF_JITTER of it
    for `jitter` in [0, 1], or `asked` (a Retry-After) when longer, at most
    SLOW_RETRY_MAX_SECONDS."""
    base = SLOW_RETRY_SECONDS * (1.0 - BACKOFF_JITTER * min(max(jitter, 0.0), 1.0))
    return min(max(base, asked or 0.0), SLOW_RETRY_MAX_SECONDS)


def _bounded(seconds: float) -> float:
    """A delay in [0, MAX_DELAY_SECONDS]: negative and NaN mean "now", +inf the maximum."""
    if math.isnan(seconds) or seconds <= 0:
        return 0.0
    return min(seconds, MAX_DELAY_SECONDS)


class WorkQueue:
    def __init__(
        self,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._clock = clock
        self._jitter = jitter
        self._failures: dict[Hashable, int] = {}  # failures in a row, per key
        self._cond = threading.Condition()
        # FIFOs of keys due now, urgent and normal. A key moved to the urgent one leaves a
        # stale entry in the normal one, skipped when reached: _queued says where it lives.
        self._ready: dict[bool, deque[Hashable]] = {True: deque(), False: deque()}
        self._queued: dict[Hashable, bool] = {}  # key -> urgent, for keys in _ready
        self._waiting = {True: 0, False: 0}  # live keys in each FIFO
        self._in_a_row = 0  # urgent keys handed out since the last normal one
        self._processing: set[Hashable] = set()
        self._dirty: dict[Hashable, bool] = {}  # re-added while processing -> urgent
        self._delayed: list[tuple[float, int, Hashable]] = []  # heap of (due, seq, key)
        self._due: dict[Hashable, float] = {}  # earliest due time per delayed key
        self._due_urgent: set[Hashable] = set()  # delayed keys added as urgent
        self._seq = 0
        self._shutdown = False

    def add(self, key: Hashable, after: float = 0.0, urgent: bool = False) -> None:
        """Queues `key` (after `after` seconds); `urgent`: before keys added without it."""
        after = _bounded(after)
        with self._cond:
            if self._shutdown:
                return
            if after > 0:
                due = self._clock() + after
                if urgent:
                    self._due_urgent.add(key)
                # Keep only the earliest wake-up per key: a later one adds nothing.
                if key in self._due and self._due[key] <= due:
                    return
                self._due[key] = due
                self._seq += 1
                heapq.heappush(self._delayed, (due, self._seq, key))
                self._cond.notify()
                return
            self._add_now(key, urgent)

    def add_failed(self, key: Hashable, at_least: float = 0.0) -> float:
        """After a failure of `key`: adds it back after its back-off, or after `at_least`
        when that is longer (a Retry-After the apiserver asked for); the delay chosen."""
        with self._cond:
            failures = self._failures.get(key, 0) + 1
            self._failures[key] = failures
        delay = _bounded(max(backoff_delay(failures, self._jitter()), at_least))
        self.add(key, after=delay)
        return delay

    def add_slow(self, key: Hashable, asked: float | None = None) -> float:
        """After a try of `key` the apiserver was too slow for: adds it back after slow_delay
        (`asked`: a Retry-After), its failures in a row left as they are; the delay chosen."""
        delay = slow_delay(asked, self._jitter())
        self.add(key, after=delay)
        return delay

    def succeeded(self, key: Hashable) -> None:
        """`key` was processed without failing: its next failure backs off from the start."""
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: Hashable) -> int:
        """Failures of `key` in a row so far."""
        with self._cond:
            return self._failures.get(key, 0)

    def due_in(self, key: Hashable) -> float | None:
        """Seconds until `key`'s delayed wake-up comes due; None when it has none."""
        with self._cond:
            due = self._due.get(key)
        return None if due is None else due - self._clock()

    def _add_now(self, key: Hashable, urgent: bool = False) -> None:
        if key in self._processing:
            self._dirty[key] = self._dirty.get(key, False) or urgent
            return
        queued = self._queued.get(key)
        if queued is None or (urgent and not queued):
            if queued is not None:
                self._waiting[False] -= 1  # its normal entry turns stale
            self._queued[key] = urgent
            self._waiting[urgent] += 1
            self._ready[urgent].append(key)
            self._cond.notify()

    def _pop(self) -> Hashable | None:
        """The next key due now, urgent first (URGENT_IN_A_ROW at most while a normal one
        waits); None if none."""
        urgent = self._waiting[True] > 0 and (
            self._in_a_row < URGENT_IN_A_ROW or self._waiting[False] == 0
        )
        if not urgent and self._waiting[False] == 0:
            return None
        fifo = self._ready[urgent]
        while True:
            key = fifo.popleft()
            if self._queued.get(key) is urgent:
                break  # else stale: the key moved, or was handed out and queued again
        del self._queued[key]
        self._waiting[urgent] -= 1
        self._in_a_row = self._in_a_row + 1 if urgent else 0
        return key

    def _promote_due(self) -> float | None:
        """Moves delayed keys whose time has come; returns seconds until the next one."""
        now = self._clock()
        while self._delayed:
            due, _, key = self._delayed[0]
            if self._due.get(key) != due:  # superseded by an earlier wake-up
                heapq.heappop(self._delayed)
                continue
            if due > now:
                return due - now
            heapq.heappop(self._delayed)
            del self._due[key]
            urgent = key in self._due_urgent
            self._due_urgent.discard(key)
            self._add_now(key, urgent)
        return None

    def get(self, timeout: float | None = None) -> Hashable | None:
        """Blocks until a key is due; None on shutdown or timeout. Never raises: workers loop
        on it, and an exception here would end a worker for good."""
        if timeout is not None and not timeout > 0:  # negative or NaN: do not block
            timeout = 0.0
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._shutdown:
                    return None
                wait = self._promote_due()
                key = self._pop()
                if key is not None:
                    self._processing.add(key)
                    return key
                if deadline is not None:
                    left = deadline - self._clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                # Bounded here too (a long get() timeout, a clock that jumps): a wait cut
                # short only goes round the loop once more.
                self._cond.wait(None if wait is None else _bounded(wait))

    def done(self, key: Hashable) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._add_now(key, self._dirty.pop(key))

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._queued) + len(self._due)
