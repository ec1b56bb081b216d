"""The failure table (reconcile/failurekinds.py) against what torch, NCCL, gloo and CUDA say
(tests/fixtures/failures/: `messages.json`, each with its source and whether it was captured;
`cpu-gloo.json`, a gloo timeout and a SIGKILL captured through the rendered pods by
bench/gpu_failures.py --cpu; `gpu-h200.json`, a CUDA out-of-memory, an NCCL watchdog timeout
and a SIGKILL captured the same way on 2 x H200; `h200-nccl-watchdog-stderr.log`, the whole
stderr of the rank whose watchdog aborted it), and what the operator does with each kind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from dtj_factory import failure, make_job, set_terminated, start, step
from reports import report
from torchrun_operator.launcher import contract
from torchrun_operator.reconcile import failurekinds

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "failures"
MESSAGES = json.loads((FIXTURES / "messages.json").read_text())
CPU_RUNS = json.loads((FIXTURES / "cpu-gloo.json").read_text())
GPU_RUNS = json.loads((FIXTURES / "gpu-h200.json").read_text())
CAPTURED_RUNS = [(f"cpu-{r['scenario']}-{r['layout']}", r) for r in CPU_RUNS] + [
    (f"h200-{r['scenario']}-{r['layout']}", r) for r in GPU_RUNS
]


@pytest.mark.parametrize("m", MESSAGES, ids=[f"{m['kind']}-{i}" for i, m in enumerate(MESSAGES)])
def test_each_message_is_the_kind_its_source_says(m: dict[str, Any]) -> None:
    found = failurekinds.match(m["text"])
    assert (found.kind if found else None) == m["kind"], m["source"]


def test_the_table_says_who_is_to_blame() -> None:
    by = failurekinds.BY_KIND
    assert (by["cuda-oom"].klass, by["cuda-oom"].node) == ("user", False)
    assert (by["gpu-device"].klass, by["gpu-device"].node) == ("infrastructure", True)
    for kind in ("nccl-timeout", "gloo-timeout", "nccl-comm"):
        assert (by[kind].klass, by[kind].node) == ("infrastructure", False)
    assert set(by) >= failurekinds.COLLECTIVE_KINDS


def test_the_launcher_counts_every_collective_message_as_a_communication_error() -> None:
    """The launcher dumps stacks on what it calls a communication error: every timeout and
    NCCL error of the table must be one to it, or the rank that never arrived goes unnamed."""
    for m in MESSAGES:
        if m["kind"] in failurekinds.COLLECTIVE_KINDS:
            assert contract.is_comm_error(m["text"]), m["text"]


def test_quote_finds_the_line_that_says_it() -> None:
    tail = "noise\n[rank0]: Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4)\nmore"
    kind = failurekinds.BY_KIND["nccl-timeout"]
    assert kind.quote(tail) == "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4)"
    assert kind.quote("nothing here") is None
    assert len(kind.quote("Watchdog caught collective operation timeout " + "x" * 999) or "") == (
        failurekinds.QUOTE_LIMIT
    )


def test_quote_drops_c10s_prefixes_and_starts_where_a_long_line_says_it() -> None:
    """The line torch 2.11 printed before aborting (captured on 2 x H200): its prefixes and
    the watchdog's preamble would leave no room for the timeout in the quote."""
    line = (
        "[rank0]:[E1127 05:43:03.899076653 ProcessGroupNCCL.cpp:2119] [PG ID 0 PG GUID "
        "0(default_pg) Rank 0] Process group watchdog thread terminated with exception: [Rank 0] "
        "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE, "
        "NumelIn=1024, NumelOut=1024, Timeout(ms)=15000) ran for 15053 milliseconds before "
        "timing out."
    )
    quoted = failurekinds.BY_KIND["nccl-timeout"].quote("x\n" + line)
    assert quoted == line[line.index("Watchdog caught") :]
    assert quoted.endswith("ran for 15053 milliseconds before timing out.")


def _one_pod_fails(*failures: contract.FailureRecord, nodes: int = 1) -> dict[str, Any]:
    job, pods = start(make_job(nodes=nodes, failurePolicy={"maxRestarts": 2}))
    pods[0] = set_terminated(pods[0], 1, report("Failed", [0, 1], list(failures)), t=10)
    _, _, _ = step(job, pods, 11)
    plan, _, _ = step(job, pods, 60)
    return plan.status


def test_a_cuda_out_of_memory_fails_the_job_naming_rank_gpu_and_size() -> None:
    oom = MESSAGES[0]["text"]
    st = _one_pod_fails(failure(1, "exception", 9.5, oom), failure(0, "signal", 10, exit_code=-15))
    assert st["phase"] == "Failed" and st["attempt"] == 0
    f = st["failure"]
    assert (f["rank"], f["kind"], f["reason"]) == (1, "cuda-oom", "CUDAOutOfMemory")
    assert "Tried to allocate 1048576.00 GiB. GPU 1" in f["message"]
    assert st["counters"]["userFailures"] == 1


def test_an_nccl_watchdog_abort_is_an_nccl_timeout_quoting_the_watchdog() -> None:
    """No error file (SIGABRT hit while the launcher formatted the traceback, issue 27): the
    kind and the watchdog's line come from the stderr tail, however much follows it."""
    watchdog = MESSAGES[3]["text"]
    aborted = failure(0, "signal", 9.5, "Signal 6 (SIGABRT) received by PID 77", exit_code=-6)
    aborted["stderr"] = watchdog + "\n" + "[rank0]: flight recorder dump ...\n" * 40
    st = _one_pod_fails(aborted)
    f = st["failure"]
    assert (f["rank"], f["kind"], f["reason"]) == (0, "nccl-timeout", "NCCLTimeout")
    first = f["message"].splitlines()[0]
    assert first.startswith(
        "Signal 6 (SIGABRT) received by PID 77: Watchdog caught collective operation timeout"
    )
    assert st["phase"] == "Restarting"  # infrastructure: worth a restart


def test_a_device_error_is_the_infrastructures() -> None:
    ecc = MESSAGES[8]["text"]
    st = _one_pod_fails(failure(1, "exception", 9.5, ecc))
    f = st["failure"]
    assert (f["rank"], f["kind"], f["reason"]) == (1, "gpu-device", "GPUDeviceError")
    assert st["phase"] == "Restarting" and st["counters"]["infrastructureFailures"] == 1


def test_a_sigterm_torchrun_sent_is_not_the_cause() -> None:
    """torch 2.15 reports the workers it stopped (SIGTERM) beside the one that failed."""
    gloo = MESSAGES[5]["text"]
    st = _one_pod_fails(failure(1, "signal", 10, exit_code=-15), failure(0, "comm", 9.5, gloo))
    assert st["failure"]["rank"] == 0 and st["failure"]["kind"] == "gloo-timeout"


@pytest.mark.parametrize("run", [r for _, r in CAPTURED_RUNS], ids=[i for i, _ in CAPTURED_RUNS])
def test_captured_runs_name_the_rank_that_never_arrived(run: dict[str, Any]) -> None:
    """The reports the pods' launchers wrote in bench/gpu_failures.py (on CPU with gloo, and
    on 2 x H200 with NCCL), through the reconciler: the timeout names the rank asleep outside
    the all-reduce, with its file:line, also when it is in the pod holding the rendezvous
    store (its launcher learns of the failure from the closed rendezvous); the NCCL watchdog's
    SIGABRT is a timeout from its stderr tail; the out-of-memory fails the job naming its rank;
    the SIGKILL names the killed rank."""
    reports = list(run["reports"].values())
    codes = list(run["exit_codes"].values())
    nodes = len(reports)
    job, pods = start(make_job(nodes=nodes, failurePolicy={"maxRestarts": 2}))
    for i, (r, code) in enumerate(zip(reports, codes, strict=True)):
        pods[i] = set_terminated(pods[i], code, json.dumps(r), t=10)
    plan, _, _ = step(job, pods, 60)
    f = plan.status["failure"]
    expected = run["expected"]
    assert (f["rank"], f["kind"]) == (expected["rank"], expected["kind"])
    user = expected["class"] == "user"
    assert plan.status["phase"] == ("Failed" if user else "Restarting")
    if run["scenario"].startswith("nccl-timeout"):
        # where the late rank slept (the worker's line when the run was captured)
        assert f["location"].endswith("gpu_fail_worker.py:60 in main")
        rank = expected["rank"]
        assert f["message"].startswith(f"rank {rank} (pod {f['pod']}) was not in the collective at")
        said = (
            "Watchdog caught collective operation timeout: WorkNCCL(SeqNum=4, OpType=ALLREDUCE"
            if f["kind"] == "nccl-timeout"
            else "Timed out waiting 3000ms for recv operation"
        )
        assert said in f["message"]
        late_pod = 0 if nodes == 1 or run["scenario"] == "nccl-timeout-host" else 1
        assert f["index"] == late_pod


def test_without_stacks_the_rank_that_timed_out_is_named() -> None:
    gloo = MESSAGES[5]["text"]
    st = _one_pod_fails(failure(0, "comm", 9.5, gloo))
    assert st["failure"]["rank"] == 0 and "location" not in st["failure"]


def test_the_documented_table_is_the_codes() -> None:
    """docs/failures.md's table has one row per kind, with the code's class, blame and reason."""
    doc = (Path(__file__).resolve().parents[3] / "docs" / "failures.md").read_text()
    rows = {}
    for line in doc.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 6 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = (cells[1], cells[2], cells[3].strip("`"))
    assert rows == {
        k.kind: (k.klass, "yes" if k.node else "no", k.reason) for k in failurekinds.TABLE
    }
