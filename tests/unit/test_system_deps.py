"""Every external command the project runs is on a new machine or in the one list of system
dependencies (hack/sysdeps/packages.tsv), which the project's own installer installs.

The machine this runs on cannot fool it: what counts as present is what a *new* machine has
(hack/sysdeps/new-machine-commands.txt, generated from the package list of a new machine), not
what happens to be installed here. The commands are found statically: the first word of each
simple command of every tracked shell script and Makefile recipe, and the program of every
subprocess call, exec and shutil.which of the Python code whose argv starts with a literal.
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from localkube import sysdeps

ROOT = Path(__file__).resolve().parents[2]
SYSDEPS = ROOT / "hack" / "sysdeps"


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Shell builtins and keywords: never a package's.
SHELL_WORDS = _words(
    """
    alias bg bind break builtin caller case cd command compgen complete continue declare dirs
    disown do done echo elif else enable esac eval exec exit export false fc fg fi for function
    getopts hash help history if in jobs kill let local logout mapfile popd printf pushd pwd read
    readarray readonly return select set shift shopt source suspend test then time times trap
    true type typeset ulimit umask unalias unset until wait while
    """
)
# What the project builds or installs itself, so no Debian package brings it: the binaries of
# cluster/build.sh (the control plane, the kubelet, KWOK, kind, helm and the anchors), the
# pinned virtual environment's programs (requirements-test.txt, pyproject.toml's scripts), and
# the kind node image's own programs (run inside the node container, not on this machine).
PROJECT_BUILT = _words(
    """
    etcd etcdctl kube-apiserver kube-controller-manager kube-scheduler kubelet kubeadm coredns
    helm kind kwok kwokctl training-operator trainer-controller-manager jobset kueue pause
    kube-network-policies
    pytest ruff mypy lint-imports shellcheck pip torchrun py-spy kubectl-dtj torchrun-operator
    iptables-wrapper bridge-cni.sh
    """
)


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z", "--", *patterns], cwd=ROOT, capture_output=True, check=True
    )
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


# -- shell --------------------------------------------------------------------------------

_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")
_CASE_PATTERN = re.compile(r"^\s*\(?[^\s()]*\)(\s|$)")
_ARITH = re.compile(r"\$?\(\([^()]*(\([^()]*\)[^()]*)*\)\)")
_DOUBLE_QUOTED = re.compile(r'"(\\.|[^"\\])*"')
_SPLIT = re.compile(
    r"\|\||&&|[;|&()`]|\{\s|\}|\$\(|\bthen\b|\bdo\b|\belse\b|\bif\b|\bwhile\b|\buntil\b|!\s"
)
# Words that run the command after them: the command is the next word.
_PREFIXES = {"sudo", "nohup", "setsid", "exec", "command", "time", "env", "nice", "xargs"}
_NAME = re.compile(r"^[a-z][a-z0-9._+-]*$")


def shell_lines(text: str) -> Iterator[str]:
    """The lines of a script without comments and here-document bodies, continuations joined."""
    text = text.replace("\\\n", " ")
    end: str | None = None
    for line in text.splitlines():
        if end is not None:
            if line.strip() == end:
                end = None
            continue
        m = _HEREDOC.search(line)
        if m:
            end = m.group(2)
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        yield re.sub(r"(^|\s)#.*$", "", line)


def _quoted_commands(m: re.Match[str]) -> str:
    """A double-quoted word: a placeholder argument (QUOTED is never a command name), then the
    commands of its $(...) as commands of their own."""
    return " ; ".join(["QUOTED", *re.findall(r"\$\((\s*[\w./-]+)", m[0])])


def shell_functions(text: str) -> set[str]:
    return set(re.findall(r"^\s*(?:function\s+)?([A-Za-z_][\w-]*)\s*\(\)", text, re.M))


def shell_commands(text: str, functions: frozenset[str] = frozenset()) -> set[str]:
    """The first word of each simple command, where it is a literal name and not one of the
    script's functions (or `functions`, those of the scripts it sources)."""
    functions = functions | shell_functions(text)
    found: set[str] = set()
    for line in shell_lines(text):
        line = _CASE_PATTERN.sub(" ", line)
        # Quoted strings hold no commands we run (arguments, messages).
        line = re.sub(r"'[^']*'", "''", line)
        line = _ARITH.sub(" ", line)
        # A double-quoted string runs only the commands of its $(...): keep those.
        line = _DOUBLE_QUOTED.sub(_quoted_commands, line)
        for part in _SPLIT.split(line):
            words = part.split()
            while words and ("=" in words[0].split("/")[0] or words[0] in _PREFIXES):
                words.pop(0)  # VAR=value, or a prefix such as nohup
                while words and words[0].startswith("-"):
                    words.pop(0)  # the prefix's own flags (env -i, nice -n 10 ...)
                if words and words[0].isdigit():
                    words.pop(0)
            if not words:
                continue
            word = words[0].strip("\"'")
            if _NAME.match(word) and word not in functions:
                found.add(word)
    return found - SHELL_WORDS


def make_recipes(text: str) -> str:
    """The recipe lines of a Makefile (tab-indented), without make's own prefixes."""
    lines = [line[1:].lstrip("@-+") for line in text.splitlines() if line.startswith("\t")]
    return "\n".join(lines)


# -- python -------------------------------------------------------------------------------

_RUNNERS = {"run", "Popen", "check_call", "check_output", "call", "execvp", "execv", "execve"}
_RUNNER_MODULES = {"subprocess", "os"}
_MAY_RUN = re.compile(r"subprocess|\bexecv|which\(|ensure\(")


def _literal_program(args: list[ast.expr]) -> str | None:
    """The program of an argv given as call arguments: a list or tuple literal's first string,
    or the first string argument after any *starred prefix (sh(*in_host, "iptables", ...))."""
    for arg in args:
        if isinstance(arg, ast.Starred):
            continue
        if isinstance(arg, ast.List | ast.Tuple) and arg.elts:
            first = arg.elts[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                return first.value
            return None
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        return None
    return None


def _wrappers(tree: ast.Module) -> set[str]:
    """Functions of the module that pass one of their parameters on as a subprocess argv."""
    names = set()
    for fn in ast.walk(tree):
        if not isinstance(fn, ast.FunctionDef):
            continue
        params = {a.arg for a in fn.args.args}
        if fn.args.vararg:
            params.add(fn.args.vararg.arg)
        for call in ast.walk(fn):
            if (
                isinstance(call, ast.Call)
                and _is_runner(call, set())
                and call.args
                and isinstance(call.args[0], ast.Name)
                and call.args[0].id in params
            ):
                names.add(fn.name)
    return names


def _is_runner(call: ast.Call, imported: set[str]) -> bool:
    """subprocess.run(...), os.execvp(...), or run(...) imported from subprocess."""
    f = call.func
    if isinstance(f, ast.Attribute):
        return (
            f.attr in _RUNNERS and isinstance(f.value, ast.Name) and f.value.id in _RUNNER_MODULES
        )
    return isinstance(f, ast.Name) and f.id in imported


def _func_name(call: ast.Call) -> str | None:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None


def python_commands(source: str) -> set[str]:
    tree = ast.parse(source)
    wrappers = _wrappers(tree)
    imported = {
        a.asname or a.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module in _RUNNER_MODULES
        for a in node.names
        if a.name in _RUNNERS
    }
    found = set()
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        name = _func_name(call)
        if _is_runner(call, imported) or name in wrappers or name in {"which", "ensure"}:
            program = _literal_program(call.args)
            if program and _NAME.match(program.split("/")[-1]) and " " not in program:
                found.add(program.split("/")[-1] if program.startswith("/") else program)
    return found


# -- the check ----------------------------------------------------------------------------


@cache
def used_commands() -> dict[str, set[str]]:
    """command -> the files that run it."""
    used: dict[str, set[str]] = {}
    scripts = [p for p in tracked("*.sh", ".ci/run") if p.is_file()]
    # Functions of sourced scripts (images/base/minbase.sh) count as functions everywhere.
    functions = frozenset(f for p in scripts for f in shell_functions(p.read_text()))
    for path in scripts:
        for cmd in shell_commands(path.read_text(), functions):
            used.setdefault(cmd, set()).add(str(path.relative_to(ROOT)))
    for path in tracked("Makefile", "*.mk"):
        for cmd in shell_commands(make_recipes(path.read_text())):
            used.setdefault(cmd, set()).add(str(path.relative_to(ROOT)))
    for path in tracked("*.py"):
        source = path.read_text()
        if not _MAY_RUN.search(source):
            continue  # cheap: most modules run nothing
        for cmd in python_commands(source):
            used.setdefault(cmd, set()).add(str(path.relative_to(ROOT)))
    return used


def test_every_external_command_is_on_a_new_machine_or_in_the_dependency_list() -> None:
    new_machine = sysdeps.new_machine_commands()
    listed = {c for p in sysdeps.packages() for c in p.commands}
    unknown = {
        cmd: sorted(files)
        for cmd, files in used_commands().items()
        if cmd not in new_machine | listed | PROJECT_BUILT | SHELL_WORDS
    }
    assert not unknown, (
        "commands run by the project that a new machine lacks and hack/sysdeps/packages.tsv "
        f"does not list (add the package that provides each): {unknown}"
    )


def test_the_check_sees_commands_in_each_kind_of_file() -> None:
    """The scanner itself: a command in each position it must see is seen (so the check above
    cannot pass by seeing nothing)."""
    sh = "set -e\nfoo=1 iptables -S\nif ! mmdebstrap x; then exit 1; fi\nout=$(runc list)\n"
    sh += "cat <<'EOF'\nnotacommand here\nEOF\n  all) containerd ;;\n"
    assert {"iptables", "mmdebstrap", "runc", "containerd", "cat"} <= shell_commands(sh)
    assert "notacommand" not in shell_commands(sh)
    py = (
        "import subprocess, shutil\n"
        "def sh(*cmd):\n    return subprocess.run(cmd)\n"
        "subprocess.run(['iptables', '-S'])\nsh(*pre, 'dockerd')\nshutil.which('ctr')\n"
    )
    assert python_commands(py) == {"iptables", "dockerd", "ctr"}
    assert "iptables" in used_commands()  # the real tree: the Docker fixture runs it


def test_a_command_missing_from_both_lists_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Remove iptables' package from the list: the check must fail (a new machine has none)."""
    assert "iptables" not in sysdeps.new_machine_commands()
    kept = [p for p in sysdeps.packages() if p.name != "iptables"]
    monkeypatch.setattr(sysdeps, "packages", lambda: kept)
    with pytest.raises(AssertionError, match="iptables"):
        test_every_external_command_is_on_a_new_machine_or_in_the_dependency_list()


def test_the_list_is_well_formed() -> None:
    pkgs = sysdeps.packages()
    names = [p.name for p in pkgs]
    assert len(names) == len(set(names)), "a package listed twice"
    for p in pkgs:
        assert p.provides, f"{p.name} provides nothing to check it by"
        assert p.groups <= sysdeps.GROUPS, (p.name, p.groups - sysdeps.GROUPS)
        assert p.why, f"{p.name}: say why the project needs it"
    owners: dict[str, str] = {}
    for p in pkgs:
        for c in p.commands:
            assert owners.setdefault(c, p.name) == p.name, f"{c} listed under two packages"
