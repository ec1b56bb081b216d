import threading

from torchrun_operator.kube.workqueue import WorkQueue


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
