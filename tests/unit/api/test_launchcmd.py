"""A launcher in the trainer's command: taken apart as torchrun's argparse would, its flags
accepted, handed on or refused (api/launchcmd.py), and the job refused by the model when they
conflict with the spec."""

from __future__ import annotations

import argparse
import shlex
from datetime import UTC, datetime
from typing import Any

import jobs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError
from torchrun_operator.api import launchcmd
from torchrun_operator.api.launchcmd import LaunchCommandError, check, parse
from torchrun_operator.api.models import JobSpec
from torchrun_operator.reconcile import reconcile

# ---- which commands start with a launcher -------------------------------------------------


@pytest.mark.parametrize(
    ("command", "launcher"),
    [
        ("torchrun t.py", "torchrun"),
        ("/opt/conda/bin/torchrun t.py", "/opt/conda/bin/torchrun"),
        ("python -m torch.distributed.run t.py", "python -m torch.distributed.run"),
        ("python3 -m torch.distributed.run t.py", "python3 -m torch.distributed.run"),
        ("python3.11 -m torch.distributed.launch t.py", "python3.11 -m torch.distributed.launch"),
        (
            "/usr/bin/python3 -m torch.distributed.run t.py",
            "/usr/bin/python3 -m torch.distributed.run",
        ),
        ("python -u -m torch.distributed.run t.py", "python -m torch.distributed.run"),
        (
            "python -X dev -W ignore -m torch.distributed.run t.py",
            "python -m torch.distributed.run",
        ),
        ("python -um torch.distributed.launch t.py", "python -m torch.distributed.launch"),
        ("python -mtorch.distributed.run t.py", "python -m torch.distributed.run"),
    ],
)
def test_launchers_are_recognised(command: str, launcher: str) -> None:
    cmd = parse(shlex.split(command))
    assert cmd is not None
    assert cmd.launcher == launcher


@pytest.mark.parametrize(
    "command",
    [
        "python t.py --nnodes 2",
        "python -m torch.distributed.elastic t.py",
        "python -m mypkg.torchrun",
        "python -c 'import torch.distributed.run'",
        "torchrun.sh t.py",
        "/usr/bin/env torchrun t.py",  # not unwrapped; documented: write the launcher first
        "bash -c 'echo hi'",
        "deepspeed t.py",
    ],
)
def test_other_commands_are_left_alone(command: str) -> None:
    argv = shlex.split(command)
    assert parse(argv) is None
    assert not launchcmd.is_launcher(argv)
    assert check(argv, nproc=1, gpus=None) is None


# ---- the unwrapped program ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "program"),
    [
        ("torchrun t.py --epochs 3", "python t.py --epochs 3"),
        ("torchrun --nproc-per-node=2 t.py", "python t.py"),
        ("torchrun --nproc-per-node 2 t.py --nnodes 9", "python t.py --nnodes 9"),
        ("torchrun --nproc_per_node=2 t.py", "python t.py"),
        ("torchrun --nproc_per_node 2 t.py", "python t.py"),
        ("torchrun --nproc-per 2 t.py", "python t.py"),  # argparse's unique prefixes
        ("torchrun -m pkg.train --lr 1", "python -m pkg.train --lr 1"),
        ("torchrun --module pkg.train", "python -m pkg.train"),
        ("torchrun --no-python ./run.sh a", "./run.sh a"),
        ("torchrun --no_python ./run.sh a", "./run.sh a"),
        ("torchrun --run-path /w/t.py a", "python /w/t.py a"),
        ("torchrun -- t.py --x", "python t.py --x"),
        ("torchrun t.py -- --x", "python t.py -- --x"),
        ("torchrun t.py --master-port 1", "python t.py --master-port 1"),  # the script's own
        ("python3 -m torch.distributed.run t.py", "python3 t.py"),
        ("/usr/bin/python3 -u -m torch.distributed.run -m pkg", "/usr/bin/python3 -m pkg"),
        ("python -m torch.distributed.launch --use_env t.py", "python t.py"),
        ("python -m torch.distributed.launch --use-env --no-python ./a", "./a"),
        ("/opt/conda/bin/torchrun t.py", "python t.py"),
    ],
)
def test_program(command: str, program: str) -> None:
    cmd = parse(shlex.split(command))
    assert cmd is not None
    assert list(cmd.program) == shlex.split(program)


def test_program_from_command_and_args_split_anywhere() -> None:
    whole = ["torchrun", "--nproc-per-node", "2", "t.py", "--epochs", "3"]
    for i in range(1, len(whole)):
        cmd = parse(whole[:i] + whole[i:])
        assert cmd is not None and list(cmd.program) == ["python", "t.py", "--epochs", "3"]


# ---- local rank argument --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "arg"),
    [
        ("python -m torch.distributed.launch t.py", "--local-rank"),
        ("python -m torch.distributed.launch --nproc_per_node=2 t.py", "--local-rank"),
        ("python -m torch.distributed.launch --use_env t.py", None),
        ("python -m torch.distributed.launch --use-env t.py", None),
        ("python -m torch.distributed.launch --use t.py", None),
        ("python -m torch.distributed.run t.py", None),
        ("torchrun t.py", None),
    ],
)
def test_launch_implies_local_rank_arg(command: str, arg: str | None) -> None:
    cmd = parse(shlex.split(command))
    assert cmd is not None and cmd.local_rank_arg == arg


# ---- flags: refused, compared, handed on ----------------------------------------------------

OWNED = [
    "--nnodes=2",
    "--nnodes 2",
    "--nnodes 1:4",
    "--nnode=2",
    "--rdzv-backend=c10d",
    "--rdzv_backend c10d",
    "--rdzv-endpoint=host:29400",
    "--rdzv_endpoint host:29400",
    "--rdzv-id=7",
    "--rdzv_id 7",
    "--rdzv-conf=join_timeout=9",
    "--rdzv_conf join_timeout=9",
    "--standalone",
    "--max-restarts=3",
    "--max_restarts 3",
    "--max-restarts=0",
    "--node-rank=0",
    "--node_rank 1",
    "--master-addr=10.0.0.1",
    "--master_addr 10.0.0.1",
    "--master-port=29500",
    "--master_port 29500",
    "--local-addr=1.2.3.4",
    "--local_addr 1.2.3.4",
]

SPEC_FIELD = {
    "--nnode": "spec.nodes",
    "--rdzv-id": "rendezvous id of its own",
    "--rdzv": "spec.rendezvous",
    "--standalone": "spec.nodes: 1",
    "--max": "spec.torchrun.maxRestarts",
    "--node": "static rendezvous",
    "--master": "spec.rendezvous.port",
    "--local": "pod's IP",
}


@pytest.mark.parametrize("flag", OWNED)
@pytest.mark.parametrize("launcher", ["torchrun", "python -m torch.distributed.launch"])
def test_owned_flags_are_refused_with_the_spec_field(launcher: str, flag: str) -> None:
    argv = shlex.split(f"{launcher} {flag} t.py --epochs 3")
    problem = check(argv, nproc=1, gpus=None)
    assert problem is not None
    assert flag in problem, problem
    hint = next(v for k, v in SPEC_FIELD.items() if flag.replace("_", "-").startswith(k))
    assert hint in problem, problem


def test_every_problem_is_named_at_once() -> None:
    problem = check(
        shlex.split("torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d t.py"), 2, None
    )
    assert problem is not None
    for flag in ("--nnodes=2", "--nproc-per-node=4", "--rdzv-backend=c10d"):
        assert flag in problem


@pytest.mark.parametrize(
    ("flag", "nproc", "gpus", "ok"),
    [
        ("--nproc-per-node=2", 2, None, True),
        ("--nproc-per-node 2", 2, None, True),
        ("--nproc_per_node=2", 2, None, True),
        ("--nproc_per_node 2", 2, None, True),
        ("--nproc-per-node=4", 2, None, False),
        ("--nproc-per-node=gpu", 8, 8, True),
        ("--nproc-per-node=gpu", 1, None, False),
        ("--nproc-per-node=gpu", 4, 8, False),
        ("--nproc-per-node=auto", 8, 8, True),
        ("--nproc-per-node=auto", 1, None, False),
        ("--nproc-per-node=cpu", 1, None, False),
        ("--nproc-per-node=xpu", 1, None, False),
    ],
)
def test_nproc_per_node_must_agree(flag: str, nproc: int, gpus: int | None, ok: bool) -> None:
    problem = check(shlex.split(f"torchrun {flag} t.py"), nproc, gpus)
    if ok:
        assert problem is None
    else:
        assert problem is not None and "spec.nprocPerNode" in problem and flag in problem


@pytest.mark.parametrize(
    ("flags", "passthrough"),
    [
        ("--log-dir=/logs", ["--log-dir", "/logs"]),
        ("--log_dir /logs", ["--log-dir", "/logs"]),
        ("-r 3 -t 3", ["--redirects", "3", "--tee", "3"]),
        ("-r3 -t=3", ["--redirects", "3", "--tee", "3"]),
        ("--redirects=0:1", ["--redirects", "0:1"]),
        ("--monitor_interval 1", ["--monitor-interval", "1"]),
        ("--role trainer", ["--role", "trainer"]),
        ("--start_method=fork", ["--start-method", "fork"]),
        ("--local_ranks_filter=0", ["--local-ranks-filter", "0"]),
        ("--shutdown_timeout 60", ["--shutdown-timeout", "60"]),
        ("--virtual-local-rank", ["--virtual-local-rank"]),
        ("--signals-to-handle=SIGTERM,SIGUSR1", ["--signals-to-handle", "SIGTERM,SIGUSR1"]),
        ("--nproc-per-node=1 -m", []),
    ],
)
def test_tuning_flags_are_handed_on(flags: str, passthrough: list[str]) -> None:
    argv = shlex.split(f"torchrun {flags} t.py")
    cmd = parse(argv)
    assert cmd is not None
    assert cmd.passthrough == passthrough
    assert check(argv, nproc=1, gpus=None) is None


def test_handed_on_flags_parse_in_torchruns_own_parser() -> None:
    """What the renderer hands on is what torchrun's own parser takes (its flag table here
    mirrors get_args_parser; torch is not installed in the operator's environment)."""
    parser = argparse.ArgumentParser(allow_abbrev=False)
    for opt in launchcmd.TORCHRUN_OPTIONS:
        if opt.names == ("-h", "--help"):
            continue
        kwargs: dict[str, Any] = {} if opt.takes_value else {"action": "store_true"}
        parser.add_argument(*opt.names, **kwargs)
    cmd = parse(shlex.split("torchrun -r3 --log_dir /x --virtual_local_rank --role r t.py"))
    assert cmd is not None
    ns = parser.parse_args(cmd.passthrough)
    assert (ns.redirects, ns.log_dir, ns.virtual_local_rank, ns.role) == ("3", "/x", True, "r")


@pytest.mark.parametrize(
    ("command", "why"),
    [
        ("torchrun --nproc-per-node", "needs a value"),
        ("torchrun --nproc-per-node --nnodes 2 t.py", "needs a value"),
        ("torchrun --bogus t.py", "not a torchrun flag"),
        ("torchrun -x t.py", "not a torchrun flag"),
        ("torchrun --use-env t.py", "not a torchrun flag"),  # launch's only
        ("torchrun --n t.py", "ambiguous"),
        ("torchrun --standalone=1 t.py", "takes no value"),
        ("torchrun --nproc-per-node=2", "no script"),
        ("torchrun", "no script"),
        ("torchrun --no-python -m t", "cannot be used together"),
        ("python -m torch.distributed.launch --no-python ./a", "needs --use-env"),
        ("torchrun --help t.py", "help"),
    ],
)
def test_commands_that_cannot_be_taken_apart(command: str, why: str) -> None:
    argv = shlex.split(command)
    problem = check(argv, nproc=1, gpus=None)
    assert problem is not None and why in problem, problem
    if "help" not in why:
        with pytest.raises(LaunchCommandError):
            parse(argv)


# ---- a flag's value that looks like a flag ----------------------------------------------------


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        ("torchrun --role=--nnodes=9 t.py", "--role=--nnodes=9"),
        ("torchrun -r=--nnodes=3 t.py", "-r=--nnodes=3"),
        ("torchrun -r--nnodes=3 t.py", "-r--nnodes=3"),
        ("torchrun --log_dir=--tee=3 t.py", "--log_dir=--tee=3"),
        ("torchrun --rol=-x t.py", "--rol=-x"),  # an abbreviation, a short flag as the value
        ("torchrun --nproc-per-node=2 --tee=-r3 t.py", "--tee=-r3"),
        ("python -m torch.distributed.launch --role=--master_port=1 t.py", "--role"),
        ("torchrun --role --log-dir=/x t.py", "--role"),  # separate: the next token is a flag
    ],
)
def test_a_value_that_looks_like_a_flag_is_refused(command: str, flag: str) -> None:
    """The pod's torchrun gets handed-on flags with their values as separate tokens, where a
    value starting with '-' is read as a flag: `--role=--nnodes=9` would fail in every pod."""
    argv = shlex.split(command)
    problem = check(argv, nproc=2 if "nproc" in command else 1, gpus=None)
    assert problem is not None and flag in problem and "looks like a flag" in problem, problem
    with pytest.raises(LaunchCommandError):
        parse(argv)


@pytest.mark.parametrize("command", ["torchrun --local-ranks-filter=-1 t.py", "torchrun -r-1 t.py"])
def test_a_negative_number_is_a_value(command: str) -> None:
    """argparse takes a negative number for a value (torchrun has no flag that looks like one)."""
    assert check(shlex.split(command), nproc=1, gpus=None) is None


def _torchrun_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    for opt in launchcmd.TORCHRUN_OPTIONS:
        if opt.names == ("-h", "--help"):
            continue
        kwargs: dict[str, Any] = {} if opt.takes_value else {"action": "store_true"}
        parser.add_argument(*opt.names, **kwargs)
    return parser


@settings(max_examples=300, deadline=None)
@given(
    value=st.text(alphabet="-=_:,. 0123456789abnrt", max_size=12),
    form=st.sampled_from(["--role={}", "--role {}", "-r{}", "-r={}", "-r {}"]),
)
def test_every_accepted_value_reaches_torchrun_as_written(value: str, form: str) -> None:
    """The general rule: whatever value parse() accepts, torchrun's own parser reads back from
    the handed-on flags; any other is refused with a LaunchCommandError, never passed on."""
    flag, _, rest = form.partition("{}")
    head = form.format(value)
    argv = ["torchrun", *([flag.strip(), value] if form.endswith(" {}") else [head]), "t.py"]
    try:
        cmd = parse(argv)
    except LaunchCommandError:
        return
    assert cmd is not None
    (given_,) = cmd.given
    try:
        ns = _torchrun_parser().parse_args(cmd.passthrough)
    except (argparse.ArgumentError, SystemExit) as e:
        raise AssertionError(
            f"{argv} was accepted, but torchrun cannot read {cmd.passthrough}"
        ) from e
    read = ns.role if flag.startswith("--role") else ns.redirects
    assert read == given_.value


# ---- a launcher inside a shell command -------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["sh", "-c", "torchrun train.py"],
        ["bash", "-c", "pip install x && torchrun --nproc-per-node=2 train.py"],
        ["bash", "-lc", "cd /w; exec /opt/conda/bin/torchrun train.py"],
        ["/bin/sh", "-ec", "OMP_NUM_THREADS=1 torchrun train.py"],
        ["sh", "-c", "python3 -m torch.distributed.launch train.py"],
        ["sh", "-c", "if true; then python -u -m torch.distributed.run t.py; fi"],
    ],
)
def test_a_launcher_in_a_shell_command_is_refused(command: list[str]) -> None:
    problem = check(command, nproc=1, gpus=None)
    assert problem is not None and "shell command" in problem


@pytest.mark.parametrize(
    "command",
    [
        ["sh", "-c", "echo torchrun"],
        ["sh", "-c", "python /opt/torchrun-scripts/train.py"],
        ["sh", "-c", "pip install torchrun-tools && python train.py"],
        ["sh", "script-that-runs-torchrun.sh"],
    ],
)
def test_shell_commands_without_a_launcher_are_accepted(command: list[str]) -> None:
    assert check(command, nproc=1, gpus=None) is None


# ---- in the model ---------------------------------------------------------------------------


def spec(command: list[str], args: list[str] | None = None, **over: Any) -> dict[str, Any]:
    """A job's spec (tests/jobs.py) running `command` `args`; `container`: more fields of its
    trainer, `over`: of the spec."""
    trainer = {"name": "t", **({"args": args} if args is not None else {})}
    trainer.update(over.pop("container", {}))
    job = jobs.job(command=command, trainer=trainer, **over)
    spec: dict[str, Any] = job["spec"]
    return spec


def test_model_accepts_a_launcher_that_agrees() -> None:
    JobSpec.model_validate(spec(["torchrun"], ["--nproc-per-node=2", "t.py"], nprocPerNode=2))
    JobSpec.model_validate(
        spec(
            ["torchrun", "--nproc_per_node", "gpu", "t.py"],
            container={"resources": {"limits": {"nvidia.com/gpu": 4}}},
        )
    )
    JobSpec.model_validate(spec(["python", "-m", "torch.distributed.launch", "t.py"]))


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        (spec(["torchrun", "--nnodes=2", "t.py"]), "spec.nodes"),
        (spec(["torchrun"], ["--nproc-per-node", "2", "t.py"]), "spec.nprocPerNode"),
        (spec(["torchrun", "--max-restarts=3", "t.py"]), "spec.torchrun.maxRestarts"),
        (spec(["torchrun", "--standalone", "t.py"]), "spec.nodes: 1"),
        (spec(["sh", "-c", "torchrun t.py"]), "shell command"),
        (spec(["torchrun", "--frobnicate", "t.py"]), "not a torchrun flag"),
    ],
)
def test_model_refuses_a_launcher_that_conflicts(bad: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as info:
        JobSpec.model_validate(bad)
    assert says in str(info.value)


def test_local_rank_arg_field() -> None:
    assert JobSpec.model_validate(spec(["python", "t.py"])).torchrun.local_rank_arg is None
    for value in launchcmd.LOCAL_RANK_ARGS:
        s = JobSpec.model_validate(spec(["python", "t.py"], torchrun={"localRankArg": value}))
        assert s.torchrun.local_rank_arg == value
    with pytest.raises(ValidationError):
        JobSpec.model_validate(spec(["python", "t.py"], torchrun={"localRankArg": "--rank"}))
    with pytest.raises(ValidationError):
        JobSpec.model_validate(spec(["python", "t.py"], torchrun={"localRankArg": True}))


def test_a_conflict_cel_cannot_see_fails_the_job_as_invalid_spec() -> None:
    """CEL checks only the first flags written --flag=value; the reconciler fails the rest."""
    job = jobs.document(
        "j",
        spec(["torchrun", "--nproc-per-node", "1", "--nnodes", "2", "t.py"]),
        namespace="ns",
        uid="u",
        generation=1,
    )
    plan = reconcile(job, [], datetime(2026, 1, 1, tzinfo=UTC))
    assert plan.status["phase"] == "Failed" and plan.create == []
    (failed,) = [c for c in plan.status["conditions"] if c["type"] == "Failed"]
    assert failed["reason"] == "InvalidSpec"
    assert "--nnodes 2" in failed["message"] and "spec.nodes" in failed["message"]
