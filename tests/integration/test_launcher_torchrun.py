"""The in-pod launcher with real torch and real torchrun on loopback (no cluster).

Each test runs the launcher as a subprocess exactly as the pod does (the zipapp the operator
ships, started by the pod's bootstrap, which checks its digest:
`python -c <bootstrap> launcher.pyz <digest> <torchrun flags> -- <user command>`) and checks what
the operator would see: the termination-message JSON, the exit code and the state files.

The launcher runs in the user's image, with whatever torch it has (2.1 to 2.15): the tests that
take `runtime` run twice, with the test venv's pinned torch and inside a Debian root with
Debian's own torch 2.6 on Python 3.13 (`hack/torch-root.sh`), as an image would hold them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pace
import pytest
from loadednode import LoadedNode
from localkube.procs import free_port
from torchrun_operator.launcher import contract
from torchrun_operator.render.configmap import packaged_launcher, packaged_launcher_digest
from torchrun_operator.render.pod import LAUNCHER_BOOTSTRAP

ROOT = Path(__file__).resolve().parents[2]
TRAIN_DDP = ROOT / "examples" / "scripts" / "train_ddp.py"

# No timeout of the module's own: its launches wait within bounds sized from the torch processes
# they start (pace), and pyproject.toml's 600 s a test stays the guard against a hang. A 120 s
# limit here failed a resume test that took 120.18 s on CI's loaded machine (issue 52).
pytestmark = [pytest.mark.slow]


@dataclass(frozen=True)
class Runtime:
    """Where the launcher runs: a python, and a wrapper that puts the command in its root."""

    name: str
    python: str
    root: Path | None = None

    def argv(self, cmd: list[str], tmp: Path) -> list[str]:
        if self.root is None:
            return cmd
        # In a mount namespace of its own (nothing leaks out): proc and dev, the test's folder
        # and the examples at the same paths inside, then chroot and the test's folder as cwd.
        script = (
            'set -e; r=$1; shift; mount -t proc proc "$r/proc"; mount --rbind /dev "$r/dev"; '
            'for d in "$TEST_DIR" "$EXAMPLES"; do mkdir -p "$r$d"; mount --bind "$d" "$r$d"; '
            'done; exec chroot "$r" /bin/sh -c \'cd "$0" && exec "$@"\' "$TEST_DIR" "$@"'
        )
        return [
            "unshare", "--mount", "--propagation", "private", "env",
            f"TEST_DIR={tmp}", f"EXAMPLES={ROOT / 'examples'}",
            "bash", "-c", script, "torch-root", str(self.root), *cmd,
        ]  # fmt: skip

    def start(self, *args: Any, **kwargs: Any) -> Node:
        return start(*args, runtime=self, **kwargs)

    def env(self) -> dict[str, str]:
        """The environment the launcher starts with: the image's, not this machine's."""
        if self.root is None:
            return dict(os.environ)
        return {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                "HOME": "/root", "LANG": "C.UTF-8"}  # fmt: skip


VENV = Runtime("venv", sys.executable)


@pytest.fixture(scope="module")
def debian_torch() -> Runtime:
    """Debian trixie's torch 2.6 on Python 3.13, made once and cached (hack/torch-root.sh)."""
    out = subprocess.run(
        [str(ROOT / "hack" / "torch-root.sh")], capture_output=True, text=True, timeout=900
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return Runtime("debian-torch-2.6", "/usr/bin/python3", Path(out.stdout.strip()))


@pytest.fixture(params=["venv", "debian-torch-2.6"])
def runtime(request: pytest.FixtureRequest) -> Runtime:
    if request.param == "venv":
        return VENV
    r: Runtime = request.getfixturevalue("debian_torch")
    return r


WORKER = textwrap.dedent(
    """
    import os, signal, sys, time
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    mode = os.environ.get("MODE", "ok")
    if mode == "big":
        raise RuntimeError("huge message " + "x" * 100_000 + " THE END")
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    assert t.item() == dist.get_world_size()
    if mode == "raise" and rank == int(os.environ["FAIL_RANK"]):
        raise RuntimeError(f"rank {rank} failed on purpose")
    if mode == "kill" and rank == int(os.environ["FAIL_RANK"]):
        os.kill(os.getpid(), signal.SIGKILL)
    if mode == "sleep":
        time.sleep(120)
    if mode == "linger":
        # Local rank 1 of the node FAIL_ON names raises, and takes LINGER seconds to exit after
        # its error file is written (an atexit handler); local rank 0 of the other node fails
        # LATE_AFTER seconds later (LATE: kill, SIGKILLed; raise, raises).
        here = os.environ["NODE_ROLE"] == os.environ["FAIL_ON"]
        if here and int(os.environ["LOCAL_RANK"]) == 1:
            import atexit
            atexit.register(time.sleep, float(os.environ["LINGER"]))
            raise KeyError(f"rank {rank} failed first")
        if not here and int(os.environ["LOCAL_RANK"]) == 0:
            time.sleep(float(os.environ["LATE_AFTER"]))
            if os.environ["LATE"] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"rank {rank} failed later")
        time.sleep(120)
    dist.all_reduce(t)  # survivors of a failed peer die here
    dist.barrier()
    print(f"rank {rank} argv {sys.argv[1:]}", flush=True)
    dist.destroy_process_group()
    """
)


@dataclass
class Node:
    proc: subprocess.Popen[str]
    state_dir: Path
    term: Path
    log: Path
    # How long its launch may take on the loaded machine: its torch processes and its peers'.
    budget: float

    def wait(self, timeout: float | None = None) -> int:
        timeout = self.budget if timeout is None else timeout
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"launcher did not exit in {timeout}s:\n{self.output()}") from None

    def summary(self) -> dict[str, Any]:
        raw = self.term.read_bytes()
        assert len(raw) <= 4096, raw[:200]
        data: dict[str, Any] = json.loads(raw)
        return data

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def start(
    tmp: Path,
    name: str,
    cmd: list[str],
    *,
    nnodes: int = 1,
    nproc: int = 2,
    port: int,
    is_host: bool = True,
    rdzv_id: str = "job-uid-0",
    # Both launchers import torch before they join: on a loaded machine (CI runs three test
    # workers on two cores) one may join long after the other. None: pace's bound for the
    # nnodes launchers' start.
    join_timeout: int | None = None,
    endpoint: str | None = None,
    env: dict[str, str] | None = None,
    prefix: list[str] | None = None,
    runtime: Runtime = VENV,
) -> Node:
    state_dir, term, log = tmp / f"{name}-state", tmp / f"{name}-term", tmp / f"{name}.log"
    jt = round(pace.torch_processes(nnodes)) if join_timeout is None else join_timeout
    args = [
        "--nnodes",
        str(nnodes),
        "--nproc-per-node",
        str(nproc),
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint or f"127.0.0.1:{port}",
        "--rdzv-id",
        rdzv_id,
        "--rdzv-conf",
        f"is_host={int(is_host)},join_timeout={jt},read_timeout=20",
        "--max-restarts",
        "0",
        "--monitor-interval",
        "0.2",
    ]
    full_env = {
        **runtime.env(),
        "TORCHRUN_OPERATOR_STATE_DIR": str(state_dir),
        "TORCHRUN_OPERATOR_TERMINATION_LOG": str(term),
        "TORCHRUN_OPERATOR_DNS_TIMEOUT": "10",
        "PET_LOCAL_ADDR": "127.0.0.1",
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        "GLOO_SOCKET_IFNAME": "lo",
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    launcher = tmp / contract.LAUNCHER_FILE  # as the ConfigMap mounts it
    if not launcher.exists():
        launcher.write_bytes(packaged_launcher())
    bootstrap = [
        runtime.python,
        "-c",
        LAUNCHER_BOOTSTRAP,
        str(launcher),
        packaged_launcher_digest(),
    ]
    fp = log.open("w")
    proc = subprocess.Popen(
        [*(prefix or []), *runtime.argv([*bootstrap, *args, "--", *cmd], tmp)],
        cwd=tmp,
        env=full_env,
        stdout=fp,
        stderr=subprocess.STDOUT,
        text=True,
    )
    fp.close()
    return Node(proc, state_dir, term, log, pace.launchers(nnodes, nproc))


@pytest.fixture
def worker(tmp_path: Path) -> list[str]:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    return ["python", str(script)]


def test_single_node_success(tmp_path: Path, worker: list[str], runtime: Runtime) -> None:
    node = runtime.start(tmp_path, "n0", [*worker, "--lr", "0.1"], port=free_port())
    assert node.wait() == 0, node.output()
    assert node.summary() == {
        "v": 1,
        "state": "Succeeded",
        "groupRank": 0,
        "ranks": [0, 1],
        "restarts": 0,
        "failures": [],
        "round": 0,  # the rendezvous round groupRank and ranks come from
    }
    assert (node.state_dir / "ready").exists()
    ranks = [json.loads((node.state_dir / f"rank-{i}.json").read_text()) for i in (0, 1)]
    assert [(r["rank"], r["groupRank"], r["worldSize"]) for r in ranks] == [(0, 0, 2), (1, 0, 2)]
    out = node.output()
    # the user's argv reached the script, and the launcher's log lines are prefixed
    assert "argv ['--lr', '0.1']" in out
    assert "[launcher] training succeeded" in out


def test_two_nodes_rank3_raises(tmp_path: Path, worker: list[str], runtime: Runtime) -> None:
    port = free_port()
    env = {"MODE": "raise", "FAIL_RANK": "3"}
    nodes = [
        runtime.start(tmp_path, f"n{i}", worker, nnodes=2, port=port, is_host=(i == 0), env=env)
        for i in (0, 1)
    ]
    codes = [n.wait() for n in nodes]
    assert codes == [1, 1], [n.output() for n in nodes]
    summaries = [n.summary() for n in nodes]
    # Each launcher's own lines say how it ended, should a state be another one.
    said = [[ln for ln in n.output().splitlines() if ln.startswith("[launcher]")] for n in nodes]
    assert all(s["state"] == "Failed" for s in summaries), (summaries, said)
    by_group = {s["groupRank"]: s for s in summaries}
    assert sorted(by_group) == [0, 1]
    holder = next(s for s in summaries if 3 in s["ranks"])
    other = next(s for s in summaries if 3 not in s["ranks"])
    assert holder["ranks"] == [2, 3] and other["ranks"] == [0, 1]

    root = holder["failures"][0]
    assert (root["rank"], root["localRank"], root["kind"]) == (3, 1, "exception")
    assert root["error"] == "RuntimeError: rank 3 failed on purpose"
    assert isinstance(root["at"], float) and abs(root["at"] - time.time()) < 120
    assert {f["kind"] for f in other["failures"]} <= {"comm", "signal"}
    # The other node's workers fail of the lost peer, or, when its agent first finds the
    # rendezvous the failed agent closed (and marked failed), its agent stops them and says so.
    closed = "RendezvousClosedError" in str(other.get("message"))
    assert other["failures"] or closed, other


# An address no pod holds (TEST-NET-2): what a stale DNS record of an earlier attempt's pod 0
# gives. Packets to it go nowhere; a store client sent there waits out its timeouts.
STALE = "198.51.100.7"


def test_the_store_host_reaches_its_own_store_when_its_name_points_elsewhere(
    tmp_path: Path, worker: list[str], runtime: Runtime
) -> None:
    """Attempts reuse hostnames, and a lagging cluster DNS answered pod 0's name with the
    address of the earlier attempt's pod 0 (the fault campaign's kueue-evict-117): pod 0's
    own agent could not reach the store it hosted. The store host now reaches it over
    loopback, whatever its name resolves to; the joiner finds it and both train."""
    port = free_port()
    nodes = [
        runtime.start(tmp_path, "n0", worker, nnodes=2, port=port, endpoint=f"{STALE}:{port}"),
        runtime.start(tmp_path, "n1", worker, nnodes=2, port=port, is_host=False),
    ]
    codes = [n.wait() for n in nodes]
    assert codes == [0, 0], [n.output() for n in nodes]
    assert [n.summary()["state"] for n in nodes] == ["Succeeded", "Succeeded"]
    assert f"rdzv_endpoint=localhost:{port}" in nodes[0].output()


def test_sigkilled_worker_is_a_signal_failure(
    tmp_path: Path, worker: list[str], runtime: Runtime
) -> None:
    node = runtime.start(
        tmp_path, "n0", worker, port=free_port(), env={"MODE": "kill", "FAIL_RANK": "1"}
    )
    assert node.wait() == 1, node.output()
    s = node.summary()
    assert s["state"] == "Failed", s
    killed = next(f for f in s["failures"] if f["rank"] == 1)
    assert (killed["kind"], killed["exitCode"]) == ("signal", -9)
    assert "SIGKILL" in killed["error"]
    assert all(f["kind"] != "exception" for f in s["failures"])


def test_huge_error_message_still_fits(tmp_path: Path, worker: list[str], runtime: Runtime) -> None:
    node = runtime.start(tmp_path, "n0", worker, nproc=1, port=free_port(), env={"MODE": "big"})
    assert node.wait() == 1, node.output()
    s = node.summary()  # parses, and is <= 4096 bytes
    (f,) = s["failures"]
    assert f["kind"] == "exception" and f["rank"] == 0
    assert f["error"].startswith("RuntimeError: huge message")
    assert f["error"].endswith("THE END")


def test_non_python_command_is_execed(tmp_path: Path, runtime: Runtime) -> None:
    node = runtime.start(
        tmp_path, "n0", ["sh", "-c", "echo hello from $RANK; exit 3"], nproc=1, port=free_port()
    )
    assert node.wait() == 3, node.output()
    (f,) = node.summary()["failures"]
    assert (f["kind"], f["exitCode"]) == ("exit", 3)
    assert "hello from 0" in node.output()


def test_argparse_exit_is_reported_with_its_stderr(tmp_path: Path, runtime: Runtime) -> None:
    # A launch-era script run without its --local_rank: argparse prints why and exits 2,
    # recording no error. The report quotes that stderr; the pod log still shows it as it came.
    script = tmp_path / "launch_era.py"
    script.write_text(
        textwrap.dedent(
            """
            import argparse, sys
            print("starting", flush=True)
            sys.stderr.write("some warning\\n")
            parser = argparse.ArgumentParser()
            parser.add_argument("--local_rank", type=int, required=True)
            parser.parse_args()
            """
        )
    )
    node = runtime.start(tmp_path, "n0", ["python", str(script)], nproc=1, port=free_port())
    assert node.wait() == 2, node.output()
    s = node.summary()
    assert s["state"] == "Failed" and len(s["failures"]) == 1, s
    argparse_line = "launch_era.py: error: the following arguments are required: --local_rank"
    for f in s["failures"]:
        assert (f["kind"], f["exitCode"]) == ("exit", 2), f
        assert f["error"] == "exited with code 2 without recording an error"
        assert f["stderr"].endswith(argparse_line), f
        assert f["stderr"].startswith("some warning\nusage: launch_era.py"), f
    out = node.output()
    assert re.search(r"^\S*:?" + re.escape(argparse_line) + "$", out, re.MULTILINE), out
    assert "starting" in out


def _netns_available() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode == 0


def test_dns_timeout(tmp_path: Path, worker: list[str]) -> None:
    # An empty network namespace: the lookup fails locally, no query leaves this machine.
    if not _netns_available():
        pytest.skip("needs `unshare --net` (root or user namespaces) to fail DNS offline")
    t0 = time.monotonic()
    node = start(
        tmp_path,
        "n0",
        worker,
        port=29400,
        is_host=False,
        endpoint="dtj-missing-0.dtj-missing:29400",
        env={"TORCHRUN_OPERATOR_DNS_TIMEOUT": "2"},
        prefix=["unshare", "--net"],
    )
    assert node.wait(timeout=30) == 1, node.output()
    elapsed = time.monotonic() - t0
    s = node.summary()
    assert s["state"] == "DNSTimeout"
    assert "dtj-missing-0.dtj-missing" in s["message"] and "2s" in s["message"]
    assert elapsed < 6, elapsed
    assert "[launcher] waiting for rendezvous host" in node.output() or elapsed < 5.5
    assert not (node.state_dir / "ready").exists()


def test_the_store_host_trains_without_resolving_its_own_name(
    tmp_path: Path, worker: list[str]
) -> None:
    # Pod 0 reaches the store it hosts over loopback: a name the cluster DNS cannot answer
    # (yet, or for minutes after an apiserver restart) must not hold it back.
    if not _netns_available():
        pytest.skip("needs `unshare --net` (root or user namespaces) to fail DNS offline")
    node = start(
        tmp_path,
        "n0",
        worker,
        port=29400,
        endpoint="dtj-missing-0.dtj-missing:29400",
        env={"TORCHRUN_OPERATOR_DNS_TIMEOUT": "2"},
        prefix=["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh"],
    )
    assert node.wait() == 0, node.output()
    assert node.summary()["state"] == "Succeeded"
    assert "waiting for rendezvous host" not in node.output()


def test_rendezvous_never_completes(tmp_path: Path, worker: list[str], runtime: Runtime) -> None:
    t0 = time.monotonic()
    node = runtime.start(tmp_path, "n0", worker, nnodes=2, port=free_port(), join_timeout=8)
    assert node.wait() == 1, node.output()
    s = node.summary()
    assert s["state"] == "RendezvousTimeout", s
    assert "rendezvous" in s["message"].lower()
    assert s["failures"] == [] and s["ranks"] == []
    assert time.monotonic() - t0 < 45
    assert not (node.state_dir / "ready").exists()


def test_sigterm_stops_training_promptly(
    tmp_path: Path, worker: list[str], runtime: Runtime
) -> None:
    node = runtime.start(tmp_path, "n0", worker, port=free_port(), env={"MODE": "sleep"})
    deadline = time.monotonic() + node.budget
    while not (node.state_dir / "ready").exists():
        assert node.proc.poll() is None, node.output()
        assert time.monotonic() < deadline, node.output()
        time.sleep(0.2)
    time.sleep(1.0)  # workers are inside their sleep
    t0 = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    assert node.wait(timeout=20) == 1, node.output()
    assert time.monotonic() - t0 < 10
    s = node.summary()
    assert s["state"] == "Failed" and "SIGTERM" in s["message"]


def _wait_ready(nodes: list[Node]) -> None:
    deadline = time.monotonic() + max(n.budget for n in nodes)
    while not all((n.state_dir / "ready").exists() for n in nodes):
        for n in nodes:
            assert n.proc.poll() is None, n.output()
        assert time.monotonic() < deadline, [n.output() for n in nodes]
        time.sleep(0.2)


def _failures(node: Node) -> dict[int, dict[str, Any]]:
    return {int(f["rank"]): f for f in node.summary()["failures"]}


# The worker that raised takes this long to exit: longer than any way its agent can end
# meanwhile (a closed rendezvous at once, a lost store after torch's store client gives up).
LINGER = "40"


@pytest.mark.timeout(400)
def test_a_worker_still_exiting_is_reported_when_a_peer_is_killed(
    tmp_path: Path, worker: list[str], runtime: Runtime, loaded_node: LoadedNode
) -> None:
    """Issue 45's race on a loaded node: local rank 1 of one node raises and is slow to exit
    (its error file written, an atexit handler running); a second later a rank of the other
    node is SIGKILLed. The first node's agent ends because the other ended (a closed
    rendezvous), not because its worker exited; its report still holds the worker's
    exception, at the time the worker recorded, before the later failure."""
    _race(tmp_path, worker, runtime, loaded_node, fail_on="joiner", late="kill")


@pytest.mark.timeout(400)
@pytest.mark.parametrize("runtime", ["venv"], indirect=True)
@pytest.mark.parametrize(("fail_on", "late"), [("host", "kill"), ("joiner", "raise")])
def test_a_worker_still_exiting_is_reported_whatever_ends_its_agent(
    tmp_path: Path,
    worker: list[str],
    runtime: Runtime,
    loaded_node: LoadedNode,
    fail_on: str,
    late: str,
) -> None:
    """The same race where the slow worker's node holds the store, and where the later
    failure is an exception of its own (the earlier one must still win)."""
    _race(tmp_path, worker, runtime, loaded_node, fail_on=fail_on, late=late)


def _race(
    tmp_path: Path,
    worker: list[str],
    runtime: Runtime,
    loaded_node: LoadedNode,
    fail_on: str,
    late: str,
) -> None:
    port = free_port()
    nodes = {}
    for role in ("host", "joiner"):
        env = {"MODE": "linger", "NODE_ROLE": role, "FAIL_ON": fail_on, "LINGER": LINGER,
               "LATE": late, "LATE_AFTER": "1"}  # fmt: skip
        nodes[role] = runtime.start(
            tmp_path, role, worker, nnodes=2, port=port, is_host=role == "host", env=env,
            prefix=loaded_node.prefix(),
        )  # fmt: skip
    _wait_ready(list(nodes.values()))
    loaded_node.hog()
    codes = {role: n.wait(timeout=180) for role, n in nodes.items()}
    assert codes == {"host": 1, "joiner": 1}, [n.output() for n in nodes.values()]
    first, later = nodes[fail_on], nodes["joiner" if fail_on == "host" else "host"]
    raised = [f for f in _failures(first).values() if f["kind"] == "exception"]
    assert len(raised) == 1, (first.summary(), first.output())
    assert raised[0]["localRank"] == 1
    assert raised[0]["error"] == f"KeyError: 'rank {raised[0]['rank']} failed first'"
    other = next(f for f in _failures(later).values() if f["localRank"] == 0)
    if late == "kill":
        assert (other["kind"], other["exitCode"]) == ("signal", -signal.SIGKILL), other
    else:
        assert other["error"].endswith("failed later"), other
    assert raised[0]["at"] < other["at"]
    assert loaded_node.hog_seconds() > 0.5  # it was loaded


@pytest.mark.timeout(400)
def test_sigterm_while_a_worker_is_still_exiting_reports_its_exception(
    tmp_path: Path, worker: list[str], runtime: Runtime, loaded_node: LoadedNode
) -> None:
    """The kubelet's SIGTERM reaches the launcher while a worker that raised is on its way out:
    the report says the launcher was stopped and still holds the worker's exception."""
    env = {"MODE": "linger", "NODE_ROLE": "host", "FAIL_ON": "host", "LINGER": LINGER}
    node = runtime.start(
        tmp_path, "n0", worker, port=free_port(), env=env, prefix=loaded_node.prefix()
    )
    _wait_ready([node])
    loaded_node.hog()
    deadline = time.monotonic() + 120
    while "failed first" not in node.output():  # the traceback: its error file is written
        assert node.proc.poll() is None and time.monotonic() < deadline, node.output()
        time.sleep(0.2)
    node.proc.send_signal(signal.SIGTERM)
    assert node.wait(timeout=120) == 1, node.output()
    s = node.summary()
    assert s["state"] == "Failed" and "SIGTERM" in s["message"], s
    raised = _failures(node)[1]
    assert (raised["kind"], raised["error"]) == ("exception", "KeyError: 'rank 1 failed first'")
    assert loaded_node.hog_seconds() > 0.5  # it was loaded


def _checksum(out: str) -> str:
    m = re.search(r"final checksum: ([0-9a-f]+) step (\d+)", out)
    assert m, out
    return f"{m.group(1)}@{m.group(2)}"


def test_example_script_resume_is_deterministic(tmp_path: Path, runtime: Runtime) -> None:
    def train(name: str, ckpt: Path, *extra: str) -> Node:
        node = runtime.start(
            tmp_path,
            name,
            [
                "python",
                str(TRAIN_DDP),
                "--epochs",
                "3",
                "--samples",
                "256",
                "--checkpoint-dir",
                str(ckpt),
                *extra,
            ],
            port=free_port(),
            rdzv_id=f"uid-{name}",
            env={"TORCHRUN_OPERATOR_PROGRESS_FILE": str(tmp_path / f"{name}.step")},
        )
        assert node.wait(node.budget + pace.train_ddp(3)) == 0, node.output()
        assert node.summary()["state"] == "Succeeded"
        return node

    whole = train("whole", tmp_path / "ck-whole")
    assert whole.summary()["step"] == 24  # 3 epochs x 256 samples / (2 ranks x 16)
    first = train("first", tmp_path / "ck-resume", "--stop-after-epoch", "1")
    assert (tmp_path / "ck-resume" / "checkpoint.pt").exists()
    resumed = train("resumed", tmp_path / "ck-resume")
    assert "resumed from" in resumed.output()
    assert _checksum(first.output()) != _checksum(whole.output())
    assert _checksum(resumed.output()) == _checksum(whole.output())
