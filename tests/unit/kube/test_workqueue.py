import threading

from hypothesis import given
from hypothesis import strategies as st
from torchrun_operator.kube.workqueue import (
    BACKOFF_BASE_SECONDS,
    BACKOFF_JITTER,
    BACKOFF_MAX_SECONDS,
    MAX_DELAY_SECONDS,
    URGENT_IN_A_ROW,
    WorkQueue,
    backoff_delay,
)


class FakeClock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_burst_of_adds_for_one_key_is_processed_once() -> None:
    q = WorkQueue()
    for _ in range(100):
        q.add(("ns", "job"))
    assert q.get(timeout=0) == ("ns", "job")
    q.done(("ns", "job"))
    assert q.get(timeout=0) is None


def test_a_key_added_while_processing_runs_again_after_done_never_concurrently() -> None:
    q = WorkQueue()
    q.add("k")
    assert q.get(timeout=0) == "k"
    q.add("k")
    assert q.get(timeout=0) is None  # not handed to a second worker while in progress
    q.done("k")
    assert q.get(timeout=0) == "k"


def test_delayed_keys_come_due_in_order_and_earliest_wake_up_wins() -> None:
    clock = FakeClock()
    q = WorkQueue(clock=clock)
    q.add("late", after=10)
    q.add("soon", after=1)
    q.add("late", after=20)  # a later wake-up for a key already due earlier adds nothing
    assert q.due_in("late") == 10 and q.due_in("never") is None
    assert q.get(timeout=0) is None
    clock.t = 1.5
    assert q.get(timeout=0) == "soon"
    clock.t = 10.5
    assert q.get(timeout=0) == "late"
    q.done("late")
    clock.t = 30
    assert q.get(timeout=0) is None


def test_shutdown_wakes_blocked_workers() -> None:
    q = WorkQueue()
    got: list[object] = []
    t = threading.Thread(target=lambda: got.append(q.get()))
    t.start()
    q.shutdown()
    t.join(timeout=2)
    assert not t.is_alive() and got == [None]


def _get_in_thread(q: WorkQueue) -> tuple[threading.Thread, list[object], list[BaseException]]:
    got: list[object] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            got.append(q.get())
        except BaseException as e:  # noqa: BLE001 - the test asserts there is none
            errors.append(e)

    t = threading.Thread(target=run)
    t.start()
    return t, got, errors


def test_a_huge_delay_never_raises_in_get() -> None:
    # activeDeadlineSeconds can be any int64: Condition.wait(1e11) raised OverflowError.
    q = WorkQueue()
    q.add("k", after=99999999999.0)
    t, got, errors = _get_in_thread(q)
    t.join(timeout=0.3)
    assert t.is_alive() and not errors  # blocked, not crashed
    q.shutdown()
    t.join(timeout=2)
    assert not t.is_alive() and got == [None] and errors == []


def test_delays_are_capped_at_max_delay() -> None:
    clock = FakeClock()
    q = WorkQueue(clock=clock)
    q.add("far", after=1e30)
    q.add("inf", after=float("inf"))
    assert q.get(timeout=0) is None
    clock.t = MAX_DELAY_SECONDS
    assert {q.get(timeout=0), q.get(timeout=0)} == {"far", "inf"}


def test_negative_and_nan_delays_mean_now() -> None:
    q = WorkQueue()
    q.add("neg", after=-5.0)
    q.add("nan", after=float("nan"))
    q.add("-inf", after=float("-inf"))
    assert [q.get(timeout=0) for _ in range(3)] == ["neg", "nan", "-inf"]


def test_odd_get_timeouts_never_raise() -> None:
    q = WorkQueue()
    assert q.get(timeout=float("nan")) is None
    assert q.get(timeout=-1.0) is None
    q.add("k", after=0.05)
    assert q.get(timeout=float("inf")) == "k"
    t, got, errors = _get_in_thread(q)  # nothing due: blocks until shutdown
    q.shutdown()
    t.join(timeout=2)
    assert got == [None] and errors == []


# -- back-off after failures ---------------------------------------------------------------


@given(
    st.integers(min_value=0, max_value=10_000),
    st.integers(min_value=0, max_value=10_000),
    st.floats(min_value=0.0, max_value=1.0),
)
def test_the_backoff_never_shrinks_as_failures_grow_and_never_passes_the_cap(
    a: int, b: int, jitter: float
) -> None:
    low, high = sorted((a, b))
    assert 0.0 <= backoff_delay(low, jitter) <= backoff_delay(high, jitter)
    assert backoff_delay(high, jitter) <= BACKOFF_MAX_SECONDS


@given(st.integers(min_value=1, max_value=10_000), st.floats(min_value=0.0, max_value=1.0))
def test_the_backoff_doubles_from_the_base_up_to_the_cap_less_the_jitter(
    failures: int, jitter: float
) -> None:
    plain = min(BACKOFF_BASE_SECONDS * 2.0 ** min(failures - 1, 63), BACKOFF_MAX_SECONDS)
    got = backoff_delay(failures, jitter)
    assert plain * (1 - BACKOFF_JITTER) <= got <= plain
    assert backoff_delay(0, jitter) == 0.0  # no failure, no wait


def test_a_failing_key_waits_longer_each_time_until_it_succeeds() -> None:
    clock = FakeClock()
    q = WorkQueue(clock=clock, jitter=lambda: 0.0)
    delays = []
    for _ in range(12):
        delays.append(q.add_failed("k"))
        clock.t += delays[-1] - 0.01
        assert q.get(timeout=0) is None  # not a moment before its back-off
        clock.t += 0.01
        assert q.get(timeout=0) == "k"
        q.done("k")
    assert delays[:4] == [2.0, 4.0, 8.0, 16.0]
    assert delays[-1] == BACKOFF_MAX_SECONDS
    assert q.failures("k") == 12
    q.succeeded("k")
    assert q.failures("k") == 0
    assert q.add_failed("k") == BACKOFF_BASE_SECONDS  # from the start again


def test_a_retry_after_longer_than_the_backoff_is_honoured() -> None:
    clock = FakeClock()
    q = WorkQueue(clock=clock, jitter=lambda: 0.0)
    assert q.add_failed("k", at_least=7.0) == 7.0
    clock.t = 6.9
    assert q.get(timeout=0) is None
    clock.t = 7.0
    assert q.get(timeout=0) == "k"
    q.done("k")
    assert q.add_failed("k", at_least=1.0) == 4.0  # the back-off, when it is the longer


def drain(q: WorkQueue) -> list[str]:
    """Every key due now, in the order handed out (each done at once); keys are strings."""
    got = []
    while (key := q.get(timeout=0)) is not None:
        got.append(str(key))
        q.done(key)
    return got


def test_urgent_keys_go_before_a_burst_of_new_jobs_but_never_starve_them() -> None:
    """Issue 26: with 500 jobs applied at once, a pod that started waited for the set-up of
    every job queued before it (status lag p95 47 s at the default rate limit)."""
    q = WorkQueue()
    for i in range(10):
        q.add(f"new-{i}")
    for i in range(10):
        q.add(f"changed-{i}", urgent=True)
    got = drain(q)
    assert sorted(got) == sorted(
        [f"new-{i}" for i in range(10)] + [f"changed-{i}" for i in range(10)]
    )
    # Each kind in the order it came; URGENT_IN_A_ROW urgent keys, then one new one.
    assert [k for k in got if k.startswith("new")] == [f"new-{i}" for i in range(10)]
    assert [k for k in got if k.startswith("changed")] == [f"changed-{i}" for i in range(10)]
    assert got[: URGENT_IN_A_ROW + 1] == [
        *(f"changed-{i}" for i in range(URGENT_IN_A_ROW)),
        "new-0",
    ]


def test_a_queued_key_added_as_urgent_moves_up_once() -> None:
    q = WorkQueue()
    for k in ("a", "b", "c"):
        q.add(k)
    q.add("c", urgent=True)
    q.add("c")  # a normal add of a key already urgent changes nothing
    assert len(q) == 3
    assert drain(q) == ["c", "a", "b"]


def test_urgency_survives_a_delay_and_a_re_add_while_processing() -> None:
    clock = FakeClock()
    q = WorkQueue(clock=clock)
    q.add("new")
    q.add("pod-event", after=0.5, urgent=True)
    q.add("pod-event", after=2)  # a later wake-up: the earlier one stays, and stays urgent
    clock.t = 1
    assert drain(q) == ["pod-event", "new"]
    q.add("x")
    q.add("busy")
    assert q.get(timeout=0) == "x"
    q.add("x", urgent=True)  # while processing: runs again after done, as urgent
    q.done("x")
    assert drain(q) == ["x", "busy"]


@given(
    st.lists(
        st.tuples(st.sampled_from(["add", "get", "done"]), st.sampled_from("abcde"), st.booleans()),
        max_size=60,
    )
)
def test_with_urgent_keys_every_key_is_handed_out_once_per_add_and_never_twice_at_once(
    ops: list[tuple[str, str, bool]],
) -> None:
    q = WorkQueue()
    queued: set[str] = set()
    processing: set[str] = set()
    dirty: set[str] = set()
    for op, key, urgent in ops:
        if op == "add":
            q.add(key, urgent=urgent)
            (dirty if key in processing else queued).add(key)
        elif op == "get":
            got = q.get(timeout=0)
            if not queued:
                assert got is None
                continue
            assert got in queued and got not in processing
            queued.discard(got)
            processing.add(got)
        elif key in processing:
            q.done(key)
            processing.discard(key)
            if key in dirty:
                dirty.discard(key)
                queued.add(key)
        assert len(q) == len(queued)
