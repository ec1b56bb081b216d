"""A launcher in the trainer's command is rendered as if the user had written the script alone;
the local rank argument reaches the launcher as an environment variable (docs/migrating.md)."""

from __future__ import annotations

from typing import Any

import jobs
import pytest
from torchrun_operator.render import render_pod


def make_job(command: list[str], args: list[str] | None = None, **spec: Any) -> dict[str, Any]:
    return jobs.job(
        "train",
        command=command,
        trainer={"args": args} if args is not None else None,
        metadata={"namespace": "ml", "uid": "u-1", "generation": 1},
        **spec,
    )


def rendered(job: dict[str, Any]) -> tuple[list[str], list[str], dict[str, Any]]:
    """(the operator's torchrun flags, the user program, the env) of pod 0."""
    c = render_pod(job, 0, 0)["spec"]["containers"][0]
    args = c["args"]
    i = args.index("--")
    return args[:i], args[i + 1 :], {e["name"]: e.get("value") for e in c["env"]}


@pytest.mark.parametrize(
    ("command", "args", "program"),
    [
        (["torchrun", "train.py"], ["--epochs", "3"], ["python", "train.py", "--epochs", "3"]),
        (["torchrun"], ["--nproc-per-node=1", "train.py"], ["python", "train.py"]),
        (["/opt/conda/bin/torchrun", "-m", "pkg.train"], None, ["python", "-m", "pkg.train"]),
        (["python3", "-m", "torch.distributed.run", "t.py"], None, ["python3", "t.py"]),
        (["torchrun", "--no-python", "./run.sh"], ["a"], ["./run.sh", "a"]),
        (["python", "train.py"], ["--nnodes", "2"], ["python", "train.py", "--nnodes", "2"]),
    ],
)
def test_the_pod_runs_the_unwrapped_program(
    command: list[str], args: list[str] | None, program: list[str]
) -> None:
    flags, prog, _ = rendered(make_job(command, args))
    assert prog == program
    assert flags.count("--nproc-per-node") == 1 and flags.count("--nnodes") == 1


def test_unwrapped_is_rendered_exactly_as_the_script_alone() -> None:
    wrapped = render_pod(make_job(["torchrun", "--nproc_per_node", "1", "t.py", "-x"]), 1, 0)
    plain = render_pod(make_job(["python", "t.py", "-x"]), 1, 0)
    assert wrapped == plain


def test_tuning_flags_are_handed_on_before_the_separator() -> None:
    flags, prog, _ = rendered(make_job(["torchrun", "-r3", "--log_dir=/logs", "t.py"]))
    assert flags[-4:] == ["--redirects", "3", "--log-dir", "/logs"]
    assert prog == ["python", "t.py"]


@pytest.mark.parametrize(
    ("command", "torchrun", "expected"),
    [
        (["python", "t.py"], {}, None),
        (["python", "t.py"], {"localRankArg": "--local-rank"}, "--local-rank"),
        (["python", "t.py"], {"localRankArg": "--local_rank"}, "--local_rank"),
        (["python", "-m", "torch.distributed.launch", "t.py"], {}, "--local-rank"),
        (
            ["python", "-m", "torch.distributed.launch", "t.py"],
            {"localRankArg": "--local_rank"},
            "--local_rank",
        ),
        (["python", "-m", "torch.distributed.launch", "--use-env", "t.py"], {}, None),
        (["torchrun", "t.py"], {}, None),
    ],
)
def test_local_rank_arg_env(
    command: list[str], torchrun: dict[str, Any], expected: str | None
) -> None:
    _, _, env = rendered(make_job(command, torchrun=torchrun))
    assert env.get("TORCHRUN_OPERATOR_LOCAL_RANK_ARG") == expected


def test_a_users_own_local_rank_arg_env_is_replaced() -> None:
    job = make_job(["python", "t.py"])
    job["spec"]["template"]["spec"]["containers"][0]["env"] = [
        {"name": "TORCHRUN_OPERATOR_LOCAL_RANK_ARG", "value": "--evil"}
    ]
    _, _, env = rendered(job)
    assert "TORCHRUN_OPERATOR_LOCAL_RANK_ARG" not in env
