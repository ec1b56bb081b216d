"""kubectl-dtj output, from status dicts shaped as the operator writes them (docs/design.md)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import jobs
import pytest
import yaml
from torchrun_operator.cli import format as fmt
from torchrun_operator.cli.main import build_parser, run

NOW = datetime(2026, 11, 26, 12, 0, 0, tzinfo=UTC)

FAILURE_MESSAGE = (
    "Traceback (most recent call last):\n"
    '  File "/workspace/train.py", line 42, in <module>\n'
    "RuntimeError: CUDA error: device-side assert triggered"
)


def failed_job() -> dict[str, Any]:
    return jobs.document(
        "llama",
        namespace="team-a",
        creationTimestamp="2026-11-26T11:00:00Z",
        status={
            "phase": "Failed",
            "attempt": 2,
            "worldSize": 16,
            "nodes": {
                "desired": 2,
                "scheduled": 2,
                "running": 0,
                "succeeded": 0,
                "failed": 2,
                "summary": "0/2",
            },
            "restarts": [
                {
                    "attempt": 1,
                    "at": "2026-11-26T11:10:00Z",
                    "kind": "infrastructure",
                    "reason": "NodeLost",
                    "index": 0,
                    "step": 1200,
                },
                {
                    "attempt": 2,
                    "at": "2026-11-26T11:20:00Z",
                    "kind": "user",
                    "rank": 3,
                    "reason": "Error",
                },
            ],
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "BackoffLimitExceeded",
                    "message": "2 gang restarts",
                }
            ],
            "ranks": [
                {
                    "index": 1,
                    "nodeRank": 0,
                    "pod": "llama-1",
                    "node": "gpu-node-3",
                    "globalRanks": "0-7",
                    "phase": "Failed",
                    "restarts": 2,
                    "exitCode": 1,
                    "reason": "Error",
                },
                {
                    "index": 0,
                    "nodeRank": 1,
                    "pod": "llama-0",
                    "node": "gpu-node-17",
                    "globalRanks": "8-15",
                    "phase": "Failed",
                    "restarts": 2,
                    "exitCode": 143,
                    "reason": "Signal",
                },
            ],
            "failure": {
                "rank": 3,
                "index": 1,
                "nodeRank": 0,
                "pod": "llama-1",
                "node": "gpu-node-3",
                "exitCode": 1,
                "kind": "user",
                "reason": "Error",
                "message": FAILURE_MESSAGE,
                "at": "2026-11-26T11:30:00Z",
            },
            "startTime": "2026-11-26T11:00:05Z",
            "completionTime": "2026-11-26T11:30:07Z",
        },
    )


def running_job(name: str = "bert", namespace: str = "team-b") -> dict[str, Any]:
    return jobs.document(
        name,
        namespace=namespace,
        creationTimestamp="2026-11-26T11:59:15Z",
        status={
            "phase": "Running",
            "attempt": 0,
            "worldSize": 4,
            "nodes": {"desired": 4, "scheduled": 4, "running": 3},
        },
    )


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (119, "119s"),
        (125, "2m5s"),
        (600, "10m"),
        (179 * 60, "179m"),
        (3 * 3600 + 60, "3h1m"),
        (8 * 3600, "8h"),
        (47 * 3600, "47h"),
        (49 * 3600, "2d1h"),
        (10 * 86400, "10d"),
        (800 * 86400, "2y70d"),
        (9 * 365 * 86400, "9y"),
    ],
)
def test_age_matches_kubectl(seconds: int, text: str) -> None:
    assert fmt.human_duration(seconds) == text


def test_age_of_missing_timestamp() -> None:
    assert fmt.format_age(None, NOW) == "<none>"
    assert fmt.format_age("2026-11-26T11:59:00Z", NOW) == "60s"


def test_list_columns_and_values() -> None:
    lines = fmt.format_job_list([running_job(), failed_job()], NOW).splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "NODES", "WORLD", "ATTEMPT", "AGE"]
    # sorted by namespace, then name: team-a's llama before team-b's bert
    assert lines[1].split() == ["llama", "Failed", "0/2", "16", "2", "60m"]
    assert lines[2].split() == ["bert", "Running", "3/4", "4", "0", "45s"]
    # columns line up: every row's PHASE starts where the header's does
    col = lines[0].index("PHASE")
    assert all(line[col:].split()[0] in ("PHASE", "Running", "Failed") for line in lines)


def test_list_all_namespaces_adds_namespace_and_sorts_by_it() -> None:
    listed = [running_job("b", "zz"), running_job("a", "aa")]
    lines = fmt.format_job_list(listed, NOW, all_namespaces=True).splitlines()
    assert lines[0].split()[:2] == ["NAMESPACE", "NAME"]
    assert [line.split()[0] for line in lines[1:]] == ["aa", "zz"]


def test_list_of_a_job_without_status_yet() -> None:
    job = {"metadata": {"name": "new", "creationTimestamp": "2026-11-26T11:59:59Z"}}
    assert fmt.format_job_list([job], NOW).splitlines()[1].split() == [
        "new",
        "Pending",
        "-",
        "-",
        "0",
        "1s",
    ]


def test_empty_list() -> None:
    assert fmt.format_job_list([], NOW) == "No resources found."


def test_status_summary_rank_table_and_root_cause() -> None:
    text = fmt.format_job_status(failed_job(), NOW)
    summary = dict(
        (k.strip(), v.strip())
        for k, v in (line.split(":", 1) for line in text.split("\n\n")[0].splitlines())
    )
    assert summary["Phase"] == "Failed"
    assert summary["Attempt"] == "2"
    assert summary["World size"] == "16"
    assert summary["Nodes"] == "desired 2, scheduled 2, running 0, succeeded 0, failed 2"
    assert summary["Duration"] == "30m02s"
    assert "Failed=True (BackoffLimitExceeded): 2 gang restarts" in text

    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("INDEX"))
    assert lines[header].split() == [
        "INDEX",
        "POD",
        "NODE",
        "NODE-RANK",
        "GLOBAL-RANKS",
        "PHASE",
        "RESTARTS",
        "EXIT",
        "REASON",
    ]
    # sorted by pod index, whatever order the status lists them in; the node rank is
    # torchrun's, which c10d assigned in another order
    assert lines[header + 1].split() == [
        "0",
        "llama-0",
        "gpu-node-17",
        "1",
        "8-15",
        "Failed",
        "2",
        "143",
        "Signal",
    ]
    assert lines[header + 2].split() == [
        "1",
        "llama-1",
        "gpu-node-3",
        "0",
        "0-7",
        "Failed",
        "2",
        "1",
        "Error",
    ]


def test_status_lists_gang_restarts() -> None:
    lines = fmt.format_job_status(failed_job(), NOW).splitlines()
    start = lines.index("Restarts:")
    assert lines[start + 1].split() == [
        "ATTEMPT",
        "AT",
        "KIND",
        "RANK",
        "INDEX",
        "STEP",
        "REASON",
    ]
    assert lines[start + 2].split() == [
        "1",
        "2026-11-26T11:10:00Z",
        "infrastructure",
        "<none>",
        "0",
        "1200",
        "NodeLost",
    ]
    assert lines[start + 3].split() == [
        "2",
        "2026-11-26T11:20:00Z",
        "user",
        "3",
        "<none>",
        "<none>",
        "Error",
    ]


def test_list_prefers_ready_over_running() -> None:
    job = running_job()
    job["status"]["nodes"]["ready"] = 2
    assert fmt.format_job_list([job], NOW).splitlines()[1].split()[2] == "2/4"


def test_root_cause_is_shown_in_full() -> None:
    text = fmt.format_job_status(failed_job(), NOW)
    cause = text[text.index("Root cause:") :]
    assert "rank: 3" in cause
    assert "index: 1" in cause
    assert "node rank: 0" in cause
    assert "pod: llama-1" in cause
    assert "node: gpu-node-3" in cause
    assert "exit code: 1" in cause
    assert "kind: user" in cause
    for line in FAILURE_MESSAGE.splitlines():
        assert line in cause


def test_root_cause_says_where_the_users_code_raised() -> None:
    job = failed_job()
    where = "/workspace/train.py:9 in <module>"
    job["status"]["failure"].update(
        location=where, message=f"KeyError: 'lr' (at {where})", kind="exception"
    )
    lines = fmt.format_job_status(job, NOW).splitlines()
    block = lines[lines.index("Root cause:") :]
    assert f"  location: {where}" in block
    assert block[block.index("  message:") + 1] == f"    KeyError: 'lr' (at {where})"


def test_status_before_pods_exist() -> None:
    job = {"metadata": {"name": "x", "namespace": "d"}, "status": {}}
    text = fmt.format_job_status(job, NOW)
    assert "Pending" in text
    assert "INDEX" not in text
    assert "Root cause" not in text


def test_rank_entry_without_exit_or_node_prints_placeholders() -> None:
    job = running_job()
    job["status"]["ranks"] = [{"index": 0, "pod": "bert-0", "phase": "Pending"}]
    row = fmt.format_job_status(job, NOW).splitlines()[-1].split()
    assert row == ["0", "bert-0", "<none>", "<none>", "<none>", "Pending", "0", "-", "<none>"]


def test_status_written_by_an_older_operator_reads_nodeRank_as_the_index() -> None:
    job = running_job()
    job["status"]["ranks"] = [{"nodeRank": 1, "pod": "bert-1", "phase": "Running"}]
    row = fmt.format_job_status(job, NOW).splitlines()[-1].split()
    assert row[:6] == ["1", "bert-1", "<none>", "<none>", "<none>", "Running"]
    assert fmt.find_rank_entry(job, index=1)["pod"] == "bert-1"


def test_live_progress_shows_per_pod_steps_and_the_job_eta() -> None:
    job = running_job()
    job["status"]["ranks"] = [
        {
            "index": 0,
            "pod": "bert-0",
            "nodeRank": 1,
            "globalRanks": "2-3",
            "round": 0,
            "phase": "Running",
            "step": 120,
            "stepsPerSecond": 2.5,
            "lastStepAt": "2026-11-26T11:59:57Z",
        },
        {"index": 1, "pod": "bert-1", "nodeRank": 0, "globalRanks": "0-1", "phase": "Running"},
    ]
    job["status"]["progress"] = {
        "step": 120,
        "totalSteps": 1000,
        "stepsPerSecond": 2.5,
        "eta": "2026-11-26T12:05:49Z",
    }
    text = fmt.format_job_status(job, NOW)
    assert "Progress:   step 120/1000, 2.5 steps/s, ETA 2026-11-26T12:05:49Z (in 5m49s)" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("INDEX"))
    assert lines[header].split()[6:9] == ["STEP", "STEPS/S", "LAST-STEP"]
    assert lines[header + 1].split() == [
        *["0", "bert-0", "<none>", "1", "2-3", "Running", "120", "2.5", "3s", "ago"],
        *["0", "-", "<none>"],
    ]
    assert lines[header + 2].split()[6:9] == ["<none>", "<none>", "<none>"]
    assert fmt.find_rank_entry(job, rank=1)["pod"] == "bert-1"
    assert fmt.find_rank_entry(job, node_rank=1)["pod"] == "bert-0"


@pytest.mark.parametrize(
    ("text", "ranks"),
    [("0-7", set(range(8))), ("5", {5}), ("0-1,4-5", {0, 1, 4, 5}), ("", set())],
)
def test_parse_rank_ranges(text: str, ranks: set[int]) -> None:
    assert fmt.parse_rank_ranges(text) == ranks


@pytest.mark.parametrize("text", ["a-b", "3-1", "-2", "0-"])
def test_malformed_rank_ranges_are_a_user_facing_error(text: str) -> None:
    with pytest.raises(fmt.FormatError, match="bad globalRanks"):
        fmt.parse_rank_ranges(text)


def test_find_rank_by_global_rank_node_rank_and_index() -> None:
    job = failed_job()
    assert fmt.find_rank_entry(job, rank=11)["pod"] == "llama-0"
    assert fmt.find_rank_entry(job, rank=0)["pod"] == "llama-1"
    assert fmt.find_rank_entry(job, node_rank=1)["pod"] == "llama-0"
    assert fmt.find_rank_entry(job, index=1)["pod"] == "llama-1"


def test_find_rank_out_of_range_says_world_size() -> None:
    with pytest.raises(fmt.FormatError, match="no global rank 16 .world size 16"):
        fmt.find_rank_entry(failed_job(), rank=16)
    with pytest.raises(fmt.FormatError, match="no node rank 5"):
        fmt.find_rank_entry(failed_job(), node_rank=5)
    with pytest.raises(fmt.FormatError, match="no pod index 5"):
        fmt.find_rank_entry(failed_job(), index=5)


def test_find_rank_before_rendezvous_points_to_the_index() -> None:
    job = running_job()
    job["status"]["ranks"] = [{"index": 0, "pod": "bert-0"}]
    with pytest.raises(fmt.FormatError, match="not assigned yet.*--index"):
        fmt.find_rank_entry(job, rank=0)
    with pytest.raises(fmt.FormatError, match="not known yet.*--index"):
        fmt.find_rank_entry(job, node_rank=0)


def test_json_and_yaml_output_round_trip() -> None:
    job = failed_job()
    assert json.loads(fmt.format_objects(job, "json")) == job
    assert yaml.safe_load(fmt.format_objects(job, "yaml")) == job
    listed = json.loads(fmt.format_objects([job], "json"))
    assert listed["kind"] == "List" and listed["items"] == [job]


class FakeKube:
    namespace = "ctx-ns"

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = jobs
        self.logs: list[tuple[str, str]] = []
        self.listed: list[str | None] = []

    def list_jobs(self, namespace: str | None) -> list[dict[str, Any]]:
        self.listed.append(namespace)
        return self.jobs

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        for job in self.jobs:
            if job["metadata"]["name"] == name:
                return job
        err = Exception("not found")
        err.status = 404  # type: ignore[attr-defined]
        raise err

    def stream_logs(self, namespace: str, pod: str, args: Any) -> None:
        self.logs.append((namespace, pod))


def test_commands_use_the_context_namespace_unless_told() -> None:
    kube = FakeKube([failed_job()])
    run(build_parser().parse_args(["list"]), kube, NOW)  # type: ignore[arg-type]
    run(build_parser().parse_args(["-n", "x", "list"]), kube, NOW)  # type: ignore[arg-type]
    run(build_parser().parse_args(["list", "-A"]), kube, NOW)  # type: ignore[arg-type]
    assert kube.listed == ["ctx-ns", "x", None]


def test_logs_by_rank_reads_the_pod_holding_it() -> None:
    kube = FakeKube([failed_job()])
    args = build_parser().parse_args(["logs", "llama", "--rank", "9", "-n", "team-a"])
    assert run(args, kube, NOW) == ""  # type: ignore[arg-type]
    assert kube.logs == [("team-a", "llama-0")]
    for flag, value, pod in (("--node-rank", "0", "llama-1"), ("--index", "0", "llama-0")):
        kube.logs.clear()
        args = build_parser().parse_args(["logs", "llama", flag, value, "-n", "team-a"])
        assert run(args, kube, NOW) == ""  # type: ignore[arg-type]
        assert kube.logs == [("team-a", pod)]


def test_missing_job_is_a_clear_error() -> None:
    args = build_parser().parse_args(["status", "nope"])
    with pytest.raises(fmt.FormatError, match="'nope' not found in namespace 'ctx-ns'"):
        run(args, FakeKube([]), NOW)  # type: ignore[arg-type]


def test_logs_needs_a_rank() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["logs", "llama"])


def test_fixtures_are_valid_status_objects() -> None:
    # The CLI reads raw dicts; this keeps the fixtures above in the shape the operator writes.
    from torchrun_operator.api.models import JobStatus

    for job in (failed_job(), running_job()):
        JobStatus.model_validate(job["status"])


class BrokenLogs(FakeKube):
    def __init__(self, jobs: list[dict[str, Any]], status: int, body: str) -> None:
        super().__init__(jobs)
        self.status, self.body = status, body

    def stream_logs(self, namespace: str, pod: str, args: Any) -> None:
        err = Exception("kubelet")
        err.status, err.body = self.status, self.body  # type: ignore[attr-defined]
        raise err


def test_logs_the_api_server_cannot_fetch_name_the_pod_and_node() -> None:
    body = json.dumps({"kind": "Status", "message": 'Get "https://n:10250/containerLogs": no host'})
    kube = BrokenLogs([failed_job()], 500, body)
    args = build_parser().parse_args(["logs", "llama", "--rank", "9", "-n", "team-a"])
    with pytest.raises(fmt.FormatError) as err:
        run(args, kube, NOW)  # type: ignore[arg-type]
    text = str(err.value)
    assert "pod llama-0 (index 0, node rank 1, node " in text
    assert "kubelet" in text and "containerLogs" in text


def test_logs_of_a_deleted_pod_say_so() -> None:
    kube = BrokenLogs([failed_job()], 404, "")
    args = build_parser().parse_args(["logs", "llama", "--rank", "9"])
    with pytest.raises(fmt.FormatError, match="pod llama-0 .* is gone"):
        run(args, kube, NOW)  # type: ignore[arg-type]


def test_status_says_why_a_gang_waits() -> None:
    message = "4 of 4 pods not scheduled; Native gang scheduling places 4 pods together or none"
    job = {
        "metadata": {"name": "b", "namespace": "d"},
        "status": {
            "phase": "Waiting",
            "scheduling": {"gang": "Native", "attempt": 0, "podGroup": "b-a0"},
            "conditions": [
                {
                    "type": "Scheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": message,
                }
            ],
        },
    }
    text = fmt.format_job_status(job, NOW)
    assert "Phase:      Waiting" in text
    assert "Gang:       Native, PodGroup b-a0" in text
    assert f"Scheduled=False (Unschedulable): {message}" in text


def _summary(text: str) -> dict[str, str]:
    head = text.split("\n\n")[0].splitlines()
    return {k.strip(): v.strip() for k, v in (line.split(":", 1) for line in head)}


def test_status_shows_the_runtime_the_job_resolved_or_waits_for() -> None:
    job = failed_job()
    job["spec"] = {"runtimeRef": {"name": "torch-gpu"}}
    assert _summary(fmt.format_job_status(job, NOW))["Runtime"] == (
        "ClusterDistributedTrainingRuntime torch-gpu (not resolved yet)"
    )
    job["status"]["runtime"] = {
        "kind": "ClusterDistributedTrainingRuntime",
        "name": "torch-gpu",
        "uid": "u",
        "resourceVersion": "42",
        "specHash": "0123456789abcdef",
        "spec": {},
    }
    assert _summary(fmt.format_job_status(job, NOW))["Runtime"] == (
        "ClusterDistributedTrainingRuntime torch-gpu (resourceVersion 42, spec hash "
        "0123456789abcdef)"
    )
    assert "Runtime" not in _summary(fmt.format_job_status(failed_job(), NOW))
