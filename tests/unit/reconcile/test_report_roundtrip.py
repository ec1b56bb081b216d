"""The launcher's real report, read by the operator: what `build_summary` writes for a
success, a user's exception and a communication error, put into a pod's termination message
and read back by observe/rootcause, is what the user sees in status.ranks and the root cause.
A change to the report that the reader does not follow fails here."""

from __future__ import annotations

import traceback

from dtj_factory import at, make_job, set_terminated
from torchrun_operator.launcher import contract, report, shim
from torchrun_operator.reconcile import observe, rootcause
from torchrun_operator.render import render_pod


def _raised(exc: Exception) -> tuple[Exception, str]:
    """An exception as a worker raises it, with its real traceback."""
    try:
        raise exc
    except Exception as e:  # noqa: BLE001 - the point is to catch it
        return e, traceback.format_exc()


# Where _raised raises: the frame of the user's code the report names.
RAISED_AT = f"{__file__}:{_raised.__code__.co_firstlineno + 3} in _raised"


def _worker_failure(rank: int, local_rank: int, exc: Exception, t: float) -> contract.FailureRecord:
    """What the launcher records when a worker raised: the worker's error file (as the shim
    writes it), read by failure_record as the agent does."""
    e, tb = _raised(exc)
    error_file = shim.error_file_payload(e, tb, at(t).timestamp())
    return report.failure_record(rank, local_rank, 1, error_file, "", at(t).timestamp())


def _pod(index: int, summary: contract.Summary, exit_code: int, t: float = 10) -> observe.PodView:
    pod = render_pod(make_job(), index, 0)
    message = report.encode_summary(summary).decode("utf-8")
    return observe.view(set_terminated(pod, exit_code, message, t=t), "trainer")


def test_success_shows_node_rank_ranks_and_step() -> None:
    summary = report.build_summary(contract.SUCCEEDED, group_rank=1, ranks=[3, 2], step=120)
    entry = observe.rank_entry(0, _pod(0, summary, 0))
    assert entry["nodeRank"] == 1
    assert entry["globalRanks"] == "2-3"
    assert entry["step"] == 120
    assert entry["phase"] == "Succeeded" and "reason" not in entry


def test_user_exception_is_the_root_cause_with_its_message() -> None:
    failed = _worker_failure(3, 1, RuntimeError("rank 3 failed on purpose"), t=9.0)
    summary = report.build_summary(contract.FAILED, group_rank=1, ranks=[2, 3], failures=[failed])
    pod = _pod(0, summary, report.exit_code_for([failed]))
    entry = observe.rank_entry(0, pod)
    assert entry["reason"] == "Exception"
    assert entry["message"] == "RuntimeError: rank 3 failed on purpose"
    (cause,) = rootcause.pod_candidates(0, pod, None, at(20).timestamp())
    assert (cause.kind, cause.reason, cause.rank, cause.node_rank) == (
        "exception",
        "Exception",
        3,
        1,
    )
    assert cause.at == at(9.0).timestamp()
    assert cause.location == RAISED_AT
    assert cause.message == f"RuntimeError: rank 3 failed on purpose (at {RAISED_AT})"
    assert rootcause.classify(cause, []) == "user"


def test_communication_error_never_wins_over_the_exception_that_caused_it() -> None:
    # Rank 1 raised; a moment later rank 0, on another node, lost its gloo peer.
    root = _worker_failure(1, 1, ValueError("loss is nan"), t=9.0)
    peer = _worker_failure(
        0,
        0,
        RuntimeError(
            "[../gloo/transport/tcp/pair.cc:561] Connection closed by peer [10.0.0.2]:4242"
        ),
        t=9.5,
    )
    assert peer["kind"] == contract.KIND_COMM
    crashed = _pod(
        0, report.build_summary(contract.FAILED, group_rank=1, ranks=[1], failures=[root]), 1
    )
    bystander = _pod(
        1, report.build_summary(contract.FAILED, group_rank=0, ranks=[0], failures=[peer]), 1
    )
    assert observe.rank_entry(1, bystander)["reason"] == "CommunicationError"
    candidates = [
        *rootcause.pod_candidates(1, bystander, None, at(20).timestamp()),
        *rootcause.pod_candidates(0, crashed, None, at(20).timestamp()),
    ]
    cause = rootcause.root_cause(candidates)
    assert (cause.pod, cause.rank, cause.message) == (
        crashed.name,
        1,
        f"ValueError: loss is nan (at {RAISED_AT})",
    )


def test_agent_that_lost_the_store_reports_a_communication_error() -> None:
    # No worker failed on this node: the agent's rendezvous lost pod 0's store.
    message = "RendezvousConnectionError: The connection to the C10d store has failed."
    pod = _pod(1, report.build_summary(contract.FAILED, message=message), 1)
    (cause,) = rootcause.pod_candidates(1, pod, None, at(20).timestamp())
    assert cause.kind == contract.KIND_COMM
    assert rootcause.classify(cause, []) == "infrastructure"
