"""A trainer command that starts with a launcher, unwrapped.

Scripts often arrive with their launcher in the command: `torchrun --nproc-per-node=8
train.py`, `python -m torch.distributed.run ...`, or the older `python -m
torch.distributed.launch ...`. The operator runs torchrun itself (render/pod.py), so it takes
the script and its arguments out of such a command (`parse(...).program`) and checks the
launcher's flags (`problems`):

- a flag that says what the spec says (the same --nproc-per-node) is accepted and dropped;
- a flag that sets what the operator owns (--nnodes, --rdzv-*, --master-addr, --master-port,
  --node-rank, --standalone, --max-restarts, --local-addr) is refused, naming the spec field
  that says it instead;
- a flag that only tunes torchrun's logging, monitoring or shutdown is handed on to the pod's
  torchrun (`LaunchCommand.passthrough`);
- an unknown flag is refused: without knowing whether it takes a value, where the script
  starts is unknown.

Parsing follows torch.distributed.run's argparse (torch 2.x; every flag's dashed and
underscored spelling, `--flag=value` and `--flag value`, unique prefixes, `-m`/`--module`,
`--no-python`, `--run-path`, and launch's `--use-env`). A launcher inside a shell command
(`sh -c "pip install x && torchrun train.py"`) cannot be unwrapped, and would run a torchrun in
every worker: `nested_launcher` finds it, so that the job is refused. Pure: imports nothing of
ours (api/models.py uses it for admission, render/pod.py to render the pod).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

Handling = Literal["owned", "nproc", "module", "no_python", "run_path", "use_env", "pass"]

LOCAL_RANK_ARGS = ("--local-rank", "--local_rank")
"""The spellings of the argument torch.distributed.launch passes to each worker's script:
`--local-rank=N` since torch 2.0, `--local_rank=N` before."""

_RDZV = (
    "the operator runs torchrun's c10d rendezvous, hosted by pod 0; spec.rendezvous sets its "
    "port and join timeout"
)
_STATIC = (
    "only torchrun's static rendezvous reads it; the operator's c10d rendezvous on pod 0 assigns "
    "node ranks and MASTER_ADDR/MASTER_PORT (spec.rendezvous.port is its port)"
)


@dataclass(frozen=True)
class Option:
    """One torchrun flag: its spellings, whether it takes a value, and what the operator does
    with it (for "owned", `why` says which spec field says it instead)."""

    names: tuple[str, ...]
    takes_value: bool
    handling: Handling
    why: str = ""

    @property
    def canonical(self) -> str:
        return next((n for n in self.names if n.startswith("--") and "_" not in n), self.names[0])


# torch.distributed.run's get_args_parser (torch 2.15), every flag.
TORCHRUN_OPTIONS: tuple[Option, ...] = (
    Option(
        ("--nnodes",),
        True,
        "owned",
        "the operator sets it from spec.nodes, or spec.elastic's minNodes and maxNodes",
    ),
    Option(("--nproc-per-node", "--nproc_per_node"), True, "nproc"),
    Option(("--rdzv-backend", "--rdzv_backend"), True, "owned", _RDZV),
    Option(("--rdzv-endpoint", "--rdzv_endpoint"), True, "owned", _RDZV),
    Option(
        ("--rdzv-id", "--rdzv_id"),
        True,
        "owned",
        "the operator gives every attempt a rendezvous id of its own",
    ),
    Option(("--rdzv-conf", "--rdzv_conf"), True, "owned", _RDZV),
    Option(
        ("--standalone",),
        False,
        "owned",
        "the operator runs torchrun's c10d rendezvous, hosted by pod 0; spec.nodes: 1 runs a "
        "single pod",
    ),
    Option(
        ("--max-restarts", "--max_restarts"),
        True,
        "owned",
        "set spec.torchrun.maxRestarts instead (it may change while the job runs, a flag in the "
        "command may not)",
    ),
    Option(("--monitor-interval", "--monitor_interval"), True, "pass"),
    Option(("--start-method", "--start_method"), True, "pass"),
    Option(("--event-log-handler", "--event_log_handler"), True, "pass"),
    Option(("--role",), True, "pass"),
    Option(("-m", "--module"), False, "module"),
    Option(("--no-python", "--no_python"), False, "no_python"),
    Option(("--run-path", "--run_path"), False, "run_path"),
    Option(("--log-dir", "--log_dir"), True, "pass"),
    Option(("-r", "--redirects"), True, "pass"),
    Option(("-t", "--tee"), True, "pass"),
    Option(("--log-line-prefix-template", "--log_line_prefix_template"), True, "pass"),
    Option(("--local-ranks-filter", "--local_ranks_filter"), True, "pass"),
    Option(("--duplicate-stdout-filters", "--duplicate_stdout_filters"), True, "pass"),
    Option(("--duplicate-stderr-filters", "--duplicate_stderr_filters"), True, "pass"),
    Option(("--node-rank", "--node_rank"), True, "owned", _STATIC),
    Option(("--master-addr", "--master_addr"), True, "owned", _STATIC),
    Option(("--master-port", "--master_port"), True, "owned", _STATIC),
    Option(
        ("--local-addr", "--local_addr"),
        True,
        "owned",
        "the operator sets it to the pod's IP address",
    ),
    Option(("--logs-specs", "--logs_specs"), True, "pass"),
    Option(("--numa-binding", "--numa_binding"), True, "pass"),
    Option(("--signals-to-handle", "--signals_to_handle"), True, "pass"),
    Option(("--shutdown-timeout", "--shutdown_timeout"), True, "pass"),
    Option(("--virtual-local-rank", "--virtual_local_rank"), False, "pass"),
    Option(
        ("--print-completion", "--print_completion"),
        True,
        "owned",
        "it prints a shell completion script and trains nothing",
    ),
    Option(("-h", "--help"), False, "owned", "it prints torchrun's help and trains nothing"),
)
# torch.distributed.launch adds one flag to torchrun's.
LAUNCH_OPTIONS: tuple[Option, ...] = (
    *TORCHRUN_OPTIONS,
    Option(("--use-env", "--use_env"), False, "use_env"),
)

# Flags the operator owns, as prefixes of a command-line token: the CEL rule (api/models.py)
# checks the tokens right after the launcher for them.
OWNED_FLAG_PREFIXES = (
    "--nnodes",
    "--rdzv",
    "--standalone",
    "--max-restarts",
    "--max_restarts",
    "--node-rank",
    "--node_rank",
    "--master-addr",
    "--master_addr",
    "--master-port",
    "--master_port",
    "--local-addr",
    "--local_addr",
)

# The spellings of the flags that take a value, for the CEL rule (api/models.py) that refuses
# a value that looks like a flag where it sees one: `--role=--nnodes=9`, `-r=--nnodes=3`,
# `--role --log-dir=x`.
VALUE_FLAGS = tuple(n for o in LAUNCH_OPTIONS if o.takes_value for n in o.names)

_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?$")
# Python's own options that take a value (`python -X dev -m torch.distributed.run ...`).
_PYTHON_VALUE_OPTIONS = {"-W", "-X", "--check-hash-based-pycs"}


class LaunchCommandError(ValueError):
    """A launcher command the operator cannot take apart."""


@dataclass(frozen=True)
class Given:
    """A flag as the command gives it."""

    option: Option
    text: str
    """As written, for messages: `--nnodes=2`, `--nnodes 2`, `-r3`."""
    value: str | None
    tokens: tuple[int, int] = (0, 0)
    """Where it is in the command (+ args): tokens [start, end)."""


@dataclass(frozen=True)
class LaunchCommand:
    """A trainer command that starts with a launcher, taken apart."""

    launcher: str
    """The launcher as the command names it: torchrun, python -m torch.distributed.run, ..."""
    kind: Literal["run", "launch"]
    """torchrun and torch.distributed.run ("run"), or torch.distributed.launch ("launch")."""
    given: tuple[Given, ...]
    """The launcher's flags."""
    program: tuple[str, ...]
    """The command each worker runs, as the operator's launcher takes it: `python script
    args...`, `python -m module args...`, or `program args...` (--no-python)."""
    use_env: bool = field(default=True)
    """False for torch.distributed.launch without --use-env: it passed --local-rank."""

    @property
    def local_rank_arg(self) -> str | None:
        """The argument torch.distributed.launch would pass each worker (torch 2.x spelling),
        None when the command passes none."""
        return None if self.use_env else LOCAL_RANK_ARGS[0]

    @property
    def passthrough(self) -> list[str]:
        """The flags handed on to the pod's torchrun, in canonical spelling with the value as
        a separate token (as the operator's own flags are)."""
        out: list[str] = []
        for g in self.given:
            if g.option.handling == "pass":
                out.append(g.option.canonical)
                if g.value is not None:
                    out.append(g.value)
        return out


def _python_module(argv: Sequence[str]) -> tuple[str, int] | None:
    """(module, index after it) of `python [options] -m module ...`, else None."""
    i = 1
    while i < len(argv):
        tok = argv[i]
        if tok in _PYTHON_VALUE_OPTIONS:
            i += 2
            continue
        if not tok.startswith("-") or tok == "-" or tok.startswith("--"):
            return None  # a script, stdin, or --version and the like
        skip_next = False
        for j in range(1, len(tok)):  # a cluster of short options: -u, -um, -Xdev, -mpkg
            ch = tok[j]
            if ch == "m":
                if j + 1 < len(tok):
                    return tok[j + 1 :], i + 1
                return (argv[i + 1], i + 2) if i + 1 < len(argv) else None
            if ch == "c":
                return None
            if ch in "WX":
                skip_next = j + 1 == len(tok)
                break
        i += 2 if skip_next else 1
    return None


def _launcher(argv: Sequence[str]) -> tuple[str, Literal["run", "launch"], int] | None:
    """(how the command names the launcher, its kind, index of the first token after it)."""
    if not argv:
        return None
    first = os.path.basename(argv[0])
    if first == "torchrun":
        return argv[0], "run", 1
    if not _PYTHON.match(first):
        return None
    found = _python_module(argv)
    if found is None:
        return None
    module, end = found
    if module == "torch.distributed.run":
        return f"{argv[0]} -m {module}", "run", end
    if module == "torch.distributed.launch":
        return f"{argv[0]} -m {module}", "launch", end
    return None


def is_launcher(argv: Sequence[str]) -> bool:
    """Whether the command starts with torchrun or python -m torch.distributed.run/launch."""
    return _launcher(argv) is not None


def _lookup(token: str, options: Sequence[Option]) -> Option:
    """The option a long flag names, exactly or by a unique prefix (argparse's
    allow_abbrev)."""
    exact = [o for o in options if token in o.names]
    if exact:
        return exact[0]
    matches = {o for o in options for n in o.names if n.startswith("--") and n.startswith(token)}
    if len(matches) == 1:
        return matches.pop()
    if matches:
        spellings = ", ".join(sorted(o.canonical for o in matches))
        raise LaunchCommandError(f"{token} is ambiguous (it could be {spellings})")
    raise LaunchCommandError(
        f"{token} is not a torchrun flag the operator knows, so it cannot tell where the "
        "script starts: remove it"
    )


def _is_value(token: str) -> bool:
    """Whether argparse takes `token` as an option's value (not for a flag: `-1` is one)."""
    return (
        not token.startswith("-")
        or token == "-"
        or re.fullmatch(r"-\d+(\.\d+)?", token) is not None
    )


_FLAG_AS_VALUE_FIX = (
    "give the flag a value that does not start with '-' (a negative number may), or remove it"
)


def parse(argv: Sequence[str]) -> LaunchCommand | None:
    """The command taken apart if it starts with a launcher, else None. Raises
    LaunchCommandError if it starts with one but cannot be taken apart."""
    found = _launcher(argv)
    if found is None:
        return None
    launcher, kind, i = found
    options = LAUNCH_OPTIONS if kind == "launch" else TORCHRUN_OPTIONS
    given: list[Given] = []

    def take_value(written: str, attached: str | None, at: int) -> tuple[str, int]:
        # The pod's torchrun gets a handed-on flag's value as a token of its own (passthrough),
        # where a value starting with "-" reads as a flag: whatever the command gives a flag,
        # attached or not, must be a value to argparse.
        if attached is not None:
            if not _is_value(attached):
                raise LaunchCommandError(
                    f"{argv[at]} gives {written} a value that looks like a flag ({attached}): "
                    f"torchrun would read it as one; {_FLAG_AS_VALUE_FIX}"
                )
            return attached, at
        if at + 1 >= len(argv):
            raise LaunchCommandError(f"{written} needs a value")
        if not _is_value(argv[at + 1]):
            raise LaunchCommandError(
                f"{written} needs a value, and {argv[at + 1]} after it looks like a flag: "
                f"torchrun would read it as one; {_FLAG_AS_VALUE_FIX}"
            )
        return argv[at + 1], at + 1

    script: str | None = None
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            if i + 1 < len(argv):
                script, i = argv[i + 1], i + 1
            break
        if _is_value(tok):
            script = tok
            break
        if tok.startswith("--"):
            name, eq, attached = tok.partition("=")
            opt = _lookup(name, options)
            if opt.takes_value:
                value, j = take_value(name, attached if eq else None, i)
                given.append(Given(opt, " ".join(argv[i : j + 1]), value, (i, j + 1)))
                i = j
            elif eq:
                raise LaunchCommandError(f"{name} takes no value ({tok})")
            else:
                given.append(Given(opt, tok, None, (i, i + 1)))
        else:  # short flags, possibly run together: -m, -r 3, -r3, -r=3, -t 3
            j = 1
            while j < len(tok):
                short = "-" + tok[j]
                short_opt = next((o for o in options if short in o.names), None)
                if short_opt is None:
                    raise LaunchCommandError(
                        f"{short} (in {tok}) is not a torchrun flag the operator knows, so it "
                        "cannot tell where the script starts: remove it"
                    )
                if short_opt.takes_value:
                    rest = tok[j + 1 :]
                    value, k = take_value(short, rest.removeprefix("=") or None, i)
                    given.append(Given(short_opt, " ".join(argv[i : k + 1]), value, (i, k + 1)))
                    i = k
                    break
                given.append(Given(short_opt, short if len(tok) > 2 else tok, None, (i, i + 1)))
                j += 1
        i += 1
    if script is None:
        raise LaunchCommandError(f"{launcher} is given no script to run")
    script_args = list(argv[i + 1 :])
    handled = {g.option.handling for g in given}
    module, no_python = "module" in handled, "no_python" in handled
    use_env = kind == "run" or "use_env" in handled
    if module and no_python:
        raise LaunchCommandError("--no-python and --module cannot be used together")
    if no_python and not use_env:
        raise LaunchCommandError("with --no-python, torch.distributed.launch needs --use-env")
    if "run_path" in handled:
        program = ["python", script, *script_args]  # runpy.run_path: as `python script` runs it
    elif no_python:
        program = [script, *script_args]
    else:
        python = "python" if kind == "run" and launcher.endswith("torchrun") else argv[0]
        program = [python, *(["-m"] if module else []), script, *script_args]
    return LaunchCommand(launcher, kind, tuple(given), tuple(program), use_env)


def _procs(n: int) -> str:
    return f"{n} process{'es' if n != 1 else ''}"


def problems(cmd: LaunchCommand, nproc: int, gpus: int | None) -> list[str]:
    """Why the launcher's flags cannot stand in this job, one sentence each; `nproc` is the
    job's processes per pod (spec.nprocPerNode resolved), `gpus` the trainer's GPU limit."""
    out: list[str] = []
    for g in cmd.given:
        handling = g.option.handling
        if handling == "owned":
            out.append(f"{g.text} ({g.option.why})")
        elif handling == "nproc":
            value = g.value or ""
            if value.isdigit():
                ok = int(value) == nproc
                says = _procs(int(value))
            elif value in ("gpu", "auto"):
                ok = bool(gpus) and gpus == nproc
                says = (
                    f"a process per GPU the pod sees ({gpus}, its nvidia.com/gpu limit)"
                    if gpus
                    else (
                        "a process per CPU of the node (the pod has no GPU)"
                        if value == "auto"
                        else "a process per GPU, but the trainer has no nvidia.com/gpu limit"
                    )
                )
            else:
                ok, says = False, f"{value!r} processes"
            if not ok:
                out.append(
                    f"{g.text} (it says {says} per pod, the job runs {_procs(nproc)} per pod: "
                    'set spec.nprocPerNode instead, an integer or "gpu" for the trainer\'s '
                    "nvidia.com/gpu limit)"
                )
    return out


# A launcher at a shell command's command position: at the start, after ; & | ( or a newline,
# or after exec, then, do; variable assignments may come before it.
_AT_COMMAND = r"(?:^|[;&|(\n]|\bexec\b|\bthen\b|\bdo\b)\s*(?:\w+=\S*\s+)*(?:\S*/)?"
_SHELL_LAUNCHER = re.compile(
    _AT_COMMAND
    + r"(?:torchrun(?=\s|$|;|&|\|)"
    + r"|python[\d.]*\s+(?:-\S+\s+)*-m\s*torch\.distributed\.(?:run|launch)\b)"
)
_SHELLS = {"sh", "bash", "dash", "zsh", "ash", "ksh"}


def nested_launcher(argv: Sequence[str]) -> str | None:
    """The launcher a shell command (`sh -c "..."`) runs, if any, as it appears there."""
    if not argv or os.path.basename(argv[0]) not in _SHELLS:
        return None
    for i, tok in enumerate(argv[1:], 1):
        if not tok.startswith("-") or tok.startswith("--"):
            return None
        if "c" in tok[1:]:
            if i + 1 >= len(argv):
                return None
            m = _SHELL_LAUNCHER.search(argv[i + 1])
            return m.group(0).strip(" \t\n;&|(") if m else None
    return None


def check(argv: Sequence[str], nproc: int, gpus: int | None) -> str | None:
    """Why the trainer command `argv` (command + args) cannot run under the operator as given;
    None when it can (also when it starts with no launcher)."""
    nested = nested_launcher(argv)
    if nested is not None:
        return (
            f"the trainer's shell command runs a launcher ({nested}): the operator runs torchrun "
            "itself and cannot take the script out of a shell command, so every worker would "
            "start a torchrun of its own; run the script there instead (e.g. sh -c '...; exec "
            "python train.py'), or make the launcher the command itself (docs/migrating.md)"
        )
    try:
        cmd = parse(argv)
    except LaunchCommandError as e:
        found = _launcher(argv)
        name = found[0] if found else argv[0]
        return f"the trainer's command starts with {name}, which the operator runs itself: {e}"
    if cmd is None:
        return None
    found_problems = problems(cmd, nproc, gpus)
    if not found_problems:
        return None
    return (
        f"the trainer's command starts with {cmd.launcher}, which the operator runs itself, and "
        "these of its flags cannot stay: " + "; ".join(found_problems)
    )
