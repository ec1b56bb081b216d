"""`kubectl dtj run` and `kubectl dtj status --watch` as a person uses them: typed into a shell in
a terminal (tmux), against the local cluster, the screen read back as the person sees it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pace
import pytest
import yaml
from dtj import REPO, get_job, wait_for
from kubernetes import client
from kubernetes.client.exceptions import ApiException

pytestmark = pytest.mark.usefixtures("operator")

# A training script without torch.distributed: it counts steps, reports them in the progress
# file (with the total, for an ETA) and prints them; rank FAIL_RANK raises at FAIL_AT.
SCRIPT = """\
import argparse, os, time
from helper import report

p = argparse.ArgumentParser()
p.add_argument("--steps", type=int, default=10)
p.add_argument("--step-sleep", type=float, default=0.5)
p.add_argument("--fail-rank", type=int, default=-1)
p.add_argument("--fail-at", type=int, default=0)
a = p.parse_args()
rank = int(os.environ["RANK"])
for step in range(1, a.steps + 1):
    if rank == a.fail_rank and step == a.fail_at:
        raise RuntimeError(f"boom on rank {rank} at step {step}")
    report(step, a.steps)
    print(f"rank {rank} step {step}", flush=True)
    time.sleep(a.step_sleep)
print(f"rank {rank} done", flush=True)
"""
HELPER = """\
import os

def report(step, total):
    path = os.environ.get("TORCHRUN_OPERATOR_PROGRESS_FILE")
    if path and os.environ.get("LOCAL_RANK") == "0":
        with open(path + ".tmp", "w") as f:
            f.write(f"{step} {total}\\n")
        os.replace(path + ".tmp", path)
"""


class Terminal:
    """A shell in a tmux session of its own (its own server, its socket in the test's
    temporary directory)."""

    def __init__(self, socket: Path, env: dict[str, str], cwd: Path) -> None:
        self.socket, self.env = socket, env
        self.tmux(
            "new-session", "-d", "-s", "t", "-x", "200", "-y", "50", "-c", str(cwd),
            "bash --norc --noprofile",
        )  # fmt: skip
        self.tmux("set-option", "-g", "history-limit", "5000")
        self.type("PS1='$ '; clear")

    def window(self, name: str) -> None:
        """Another window, a shell as the first one (not a login shell: its PATH stays)."""
        self.tmux("new-window", "-t", f"t:{name}", "bash --norc --noprofile")
        self.type("PS1='$ '; clear", window=name)

    def tmux(self, *args: str) -> str:
        out = subprocess.run(
            ["tmux", "-S", str(self.socket), "-f", "/dev/null", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return out.stdout

    def type(self, line: str, window: str = "0") -> None:
        self.tmux("send-keys", "-t", f"t:{window}", "-l", line)
        self.tmux("send-keys", "-t", f"t:{window}", "Enter")

    def keys(self, *keys: str, window: str = "0") -> None:
        self.tmux("send-keys", "-t", f"t:{window}", *keys)

    def screen(self, window: str = "0") -> str:
        """What the window shows, with its scrollback."""
        return self.tmux("capture-pane", "-p", "-J", "-t", f"t:{window}", "-S", "-")

    def visible(self, window: str = "0") -> str:
        """What the window shows now, without its scrollback."""
        return self.tmux("capture-pane", "-p", "-J", "-t", f"t:{window}")

    def wait_for(self, pattern: str, timeout: float, window: str = "0") -> re.Match[str]:
        def found() -> re.Match[str] | None:
            return re.search(pattern, self.screen(window), re.MULTILINE)

        try:
            match: re.Match[str] = wait_for(f"{pattern!r} on the screen", found, timeout)
        except TimeoutError:
            raise AssertionError(f"{pattern!r} never showed:\n{self.screen(window)}") from None
        return match

    def exit_code(self, window: str = "0") -> int:
        """The exit code of the command that just ended, as `echo $?` shows it."""
        self.type("echo EXIT=$?", window)
        return int(self.wait_for(r"^EXIT=(\d+)$", 30, window).group(1))

    def close(self) -> None:
        subprocess.run(
            ["tmux", "-S", str(self.socket), "kill-server"], env=self.env, capture_output=True
        )


@pytest.fixture
def term(cluster: Any, namespace: str, tmp_path: Path) -> Iterator[Terminal]:
    assert shutil.which("tmux"), "tmux is not on PATH (hack/sysdeps/packages.tsv, group test)"
    assert shutil.which("kubectl"), "kubectl is not on PATH"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    plugin = bin_dir / "kubectl-dtj"
    plugin.write_text(
        "#!/bin/sh\n"
        f'PYTHONPATH="{REPO / "operator"}" exec "{sys.executable}" '
        '-m torchrun_operator.cli.main "$@"\n'
    )
    plugin.chmod(0o755)
    # The person's kubeconfig, its context in the test's namespace.
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    for ctx in config["contexts"]:
        ctx["context"]["namespace"] = namespace
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "KUBECONFIG": str(kubeconfig),
        "HOME": str(tmp_path),
        "TERM": "xterm-256color",
        "LANG": "C.UTF-8",
    }
    work = tmp_path / "work"
    (work / "proj").mkdir(parents=True)
    (work / "proj" / "train.py").write_text(SCRIPT)
    (work / "proj" / "helper.py").write_text(HELPER)
    # A single script: its helper inlined.
    (work / "single.py").write_text(SCRIPT.replace("from helper import report\n", HELPER))
    t = Terminal(tmp_path / "tmux.sock", env, work)
    try:
        yield t
    finally:
        t.close()


def test_run_a_directory_follows_its_progress_and_exits_0(
    term: Terminal, kube: client.ApiClient, namespace: str
) -> None:
    term.type("kubectl dtj run --nodes 2 --name run-ok proj -- --steps 60 --step-sleep 0.5")
    term.wait_for(r"^job run-ok submitted in namespace " + namespace, 60)
    # The live progress line, from the step the script reports, with an ETA.
    term.wait_for(r"Running 2/2 pods ready \| step \d+/60, [\d.]+ steps/s, ETA ", pace.attempts())
    # rank 0's log: its lines, or, where the apiserver cannot fetch logs (the local cluster's
    # process nodes have no kubelet), a notice naming the pod that holds rank 0
    term.wait_for(
        r"^rank 0 step 1$|^\(no log of rank 0: cannot fetch the logs of pod run-ok-\d", 120
    )
    # The end: the per-rank table, and the command's exit code is the job's.
    term.wait_for(r"^Phase:\s+Succeeded$", 180)
    screen = term.screen()
    assert re.search(r"^INDEX\s+POD\s+NODE", screen, re.MULTILINE), screen
    assert len(re.findall(r"^\d\s+run-ok-\d\s+\S+\s+\d\s+\S+\s+Succeeded", screen, re.M)) == 2
    assert "Root cause:" not in screen
    assert term.exit_code() == 0
    # The code's ConfigMap belongs to the job (by uid): deleting the job deletes it.
    job = get_job(kube, namespace, "run-ok")
    cm: Any = client.CoreV1Api(kube).read_namespaced_config_map("run-ok-code", namespace)
    [owner] = cm.metadata.owner_references
    assert (owner.kind, owner.name, owner.uid) == (
        "DistributedTrainingJob",
        "run-ok",
        job["metadata"]["uid"],
    )
    assert cm.binary_data and "workspace.tar.gz" in cm.binary_data


def test_run_a_failing_script_prints_the_root_cause_and_exits_1(term: Terminal) -> None:
    term.type(
        "kubectl dtj run --nodes 2 --name run-fail single.py -- --steps 20 --step-sleep 0.2 "
        "--fail-rank 1 --fail-at 3"
    )
    term.wait_for(r"^Phase:\s+Failed$", 180)
    term.wait_for(r"^Root cause:$", 10)
    screen = term.screen()
    cause = screen[screen.index("Root cause:") :]
    assert re.search(r"^\s+rank: 1$", cause, re.MULTILINE), cause
    assert "RuntimeError: boom on rank 1 at step 3" in cause
    assert term.exit_code() == 1


def test_status_watch_redraws_in_place_and_ctrl_c_asks_before_deleting(
    term: Terminal, kube: client.ApiClient, namespace: str
) -> None:
    term.type("kubectl dtj run --nodes 2 --name run-long single.py -- --steps 1000")
    term.wait_for(r"Running 2/2 pods ready \| step \d+/1000", pace.attempts())

    # A second window: the status, redrawn in place as the steps go by.
    term.window("1")
    term.type("kubectl dtj status run-long --watch", window="1")
    first = term.wait_for(r"^Progress:\s+step (\d+)/1000", 60, window="1")
    later = term.wait_for(rf"^Progress:\s+step (?!{first.group(1)}/)(\d+)/1000", 60, window="1")
    assert int(later.group(1)) > int(first.group(1))
    shown = term.visible("1")
    # in place: one status on the screen, not one appended per change
    assert shown.count("Name:") == 1 and shown.count("Progress:") == 1, shown
    assert re.search(r"^Phase:\s+Running$", shown, re.MULTILINE), shown

    # Ctrl-C in the first window: asked, answered yes, deleted.
    term.keys("C-c")
    term.wait_for(r"delete job run-long\? \[y/N\]", 30)
    term.type("y")
    term.wait_for(r"^job run-long deleted$", 30)
    assert term.exit_code() == 130

    def gone() -> bool:
        try:
            get_job(kube, namespace, "run-long")
        except ApiException as e:
            return e.status == 404
        return False

    wait_for("run-long deleted", gone, 60)
    # The watch ends with the job.
    term.type("echo WATCH=$?", window="1")
    term.wait_for(r"^WATCH=1$", 60, window="1")
