"""Root cause across nodes when a rank dies without an exception (found on the real cluster).

torchrun stamps a failure that left no error file with whole seconds (`int(time.time())`),
while a peer's recorded communication error carries milliseconds: a worker SIGKILLed at
9.97 s can be reported at 10.0, after its peer's "Connection reset by peer" at 9.98. The
communication error is a consequence, never the cause.
"""

from __future__ import annotations

from dtj_factory import failure, make_job, set_terminated, start, step
from reports import report
from torchrun_operator.launcher import contract


def _two_nodes_fail(
    kind: contract.FailureKind, exit_code: int, retryable: list[int] | None = None
) -> dict:
    policy = {"maxRestarts": 2, "retryableExitCodes": retryable or []}
    job, pods = start(make_job(nodes=2, failurePolicy=policy))
    pods = [
        set_terminated(
            pods[0],
            1,
            report("Failed", [0, 1], [failure(1, "comm", 9.98, "Connection reset by peer")]),
            t=10,
        ),
        set_terminated(
            pods[1],
            1,
            report("Failed", [2, 3], [failure(3, kind, 10.0, exit_code=exit_code)]),
            t=10,
        ),
    ]
    plan, _, _ = step(job, pods, 30)
    return plan.status


def test_a_killed_rank_is_the_root_cause_not_its_peers_connection_error() -> None:
    st = _two_nodes_fail("signal", -9)
    assert st["phase"] == "Restarting"
    assert st["failure"]["rank"] == 3 and st["failure"]["kind"] == "signal"
    assert st["restarts"][-1]["rank"] == 3 and st["restarts"][-1]["index"] == 1


def test_a_rank_exiting_1_fails_the_job_even_if_a_peer_reported_first() -> None:
    st = _two_nodes_fail("exit", 1)
    assert st["phase"] == "Failed" and st["attempt"] == 0
    assert st["failure"]["rank"] == 3 and st["failure"]["exitCode"] == 1
    assert st["counters"]["userFailures"] == 1 and st["counters"]["restarts"] == 0


def test_a_retryable_exit_code_is_the_cause_of_the_restart() -> None:
    st = _two_nodes_fail("exit", 42, retryable=[42])
    assert st["phase"] == "Restarting" and st["attempt"] == 1
    assert st["failure"]["rank"] == 3 and st["failure"]["exitCode"] == 42


def test_a_retryable_exit_code_is_recorded_as_an_infrastructure_restart() -> None:
    job, pods = start(
        make_job(nodes=1, failurePolicy={"maxRestarts": 2, "retryableExitCodes": [42]})
    )
    failed = set_terminated(
        pods[0], 42, report("Failed", [0], [failure(0, "exit", 10, exit_code=42)]), t=10
    )
    plan, _, _ = step(job, [failed], 11)
    assert plan.status["phase"] == "Restarting"
    assert plan.status["restarts"][-1]["kind"] == "infrastructure"
    assert plan.status["counters"]["infrastructureFailures"] == 1
