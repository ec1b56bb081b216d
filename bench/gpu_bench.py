"""GPU benchmark: the pods the operator renders for a DDP job, against bare torchrun.

Three layouts run one after another in this one process, on the same GPUs:

* ``bare``: ``torchrun --standalone --nproc-per-node N <script>`` (the baseline);
* ``one-pod``: the job ``nodes=1, nprocPerNode=gpu`` with an ``nvidia.com/gpu`` limit of N;
* ``two-pods``: the job ``nodes=N, nprocPerNode=gpu`` with a limit of 1 GPU per pod.

For the pod layouts the pods are rendered by ``torchrun_operator.render.render_pod`` and their
trainer container (command, args, env) is run as local processes, with what the kubelet and
cluster would supply substituted: the downward-API pod IP and the rendezvous host name become
127.0.0.1 (the endpoint's port a free one), the mounted launcher and the emptyDir paths become
local files, ``CUDA_VISIBLE_DEVICES`` is what the device plugin would grant each pod. The
two-pod layout EMULATES separate pods on one host: ``NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1`` and
one GPU visible per process, so NCCL talks over the network stack as separate pods without
shared memory or P2P would; it is not a real two-pod deployment (no veth, no CNI).

Three workloads (``--workload``): ``step`` (gpu_ddp_step.py: DDP step time of a 100M-parameter
MLP on synthetic tensors, all-reduce bandwidth, startup), ``data`` (gpu_ddp_data.py: epoch
time of a small CNN fed by a CPU-heavy torchvision pipeline with no loader workers, and what
each worker process sees of its CPU: threads, affinity, environment) and ``mnist``
(gpu_ddp_mnist.py: the MNIST tutorials' shape, FakeData 1x28x28 + ToTensor, no loader workers,
pin_memory: the time is Python in each worker's main thread). Diagnostic layouts
(``DIAGNOSTIC_LAYOUTS``) change one thing each against bare or one-pod; ``--pyspy`` samples the
ranks and the agent of the mnist workload with py-spy (bench/pyspy_summary.py reads them).

Figures are ratios or differences against the bare run of the same call (bench/README.md).

    python bench/gpu_bench.py                    # 2 GPUs, nccl
    python bench/gpu_bench.py --workload data --layouts bare,one-pod --repeats 5
    python bench/gpu_bench.py --smoke --cpu      # gloo on CPU, tiny model: CI's rot check

``--pin`` gives each layout of a repeat its own CPU set (disjoint, equal-sized, taken from this
process's affinity): the process the harness starts (bare torchrun, or a pod's launcher) is
started with that affinity and its workers inherit it. With ``--concurrent`` the sets rotate
between the layouts every repeat (with two layouts: swap), so no layout always has the same
cores; one after the other, all layouts of a repeat run on the same set, and the set alternates
over repeats. ``--pin-ranks`` also pins each rank's main thread to one CPU of its layout's set
(the data workload; the script does it from ``BENCH_RANK_CPUS``, the same way in every layout).
"""

from __future__ import annotations

import argparse
import copy
import functools
import hashlib
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BENCH_DIR = ROOT / "bench"
if str(ROOT / "operator") not in sys.path:
    sys.path.insert(0, str(ROOT / "operator"))

from torchrun_operator.api import names  # noqa: E402
from torchrun_operator.launcher import contract  # noqa: E402
from torchrun_operator.render import pod as podmod  # noqa: E402
from torchrun_operator.render import render_pod  # noqa: E402
from torchrun_operator.render.configmap import (  # noqa: E402
    packaged_launcher,
    packaged_launcher_digest,
)

# Where the training scripts live in the (notional) image; mapped to BENCH_DIR locally.
IMAGE_DIR = "/workspace"
JOB_NAME = "ddp-bench"
JOB_UID = "00000000-0000-4000-8000-00000000bench"


@functools.cache
def launcher_pyz() -> Path:
    """The launcher as the ConfigMap mounts it: the operator's zipapp, written once, named by
    its digest (the rendered pods' bootstrap checks it)."""
    path = Path(tempfile.gettempdir()) / f"torchrun-launcher-{packaged_launcher_digest()[:16]}"
    path.mkdir(exist_ok=True)
    pyz = path / contract.LAUNCHER_FILE
    if not pyz.exists() or pyz.read_bytes() != packaged_launcher():
        pyz.write_bytes(packaged_launcher())
    return pyz


LAYOUTS = ("bare", "one-pod", "two-pods")
# Diagnostic layouts, each the bare or one-pod layout with one thing changed, to find what a
# difference between those two comes from (``--layouts``; bench/README.md):
# * bare-shim: bare torchrun running the launcher's worker shim (``launcher.pyz --worker python
#   script``) instead of the script: the shim alone, without the launcher's agent or env;
# * one-pod-agent-store: the one-pod layout without TORCH_DISABLE_SHARE_RDZV_TCP_STORE, so the
#   workers use the agent's store, as under bare torchrun, instead of rank 0 hosting one;
# * one-pod-base: the one-pod layout with the launcher file given by --base-launcher (another
#   version of the launcher, a launcher.pyz or an old launcher.py, e.g. before a change),
#   interleaved with the current one;
# * bare-net: bare torchrun with the two-pod layout's NCCL transport (NCCL_P2P_DISABLE=1
#   NCCL_SHM_DISABLE=1): what the transport alone costs, to hold two-pods against.
DIAGNOSTIC_LAYOUTS = ("bare-shim", "one-pod-agent-store", "one-pod-base", "bare-net")
ALL_LAYOUTS = (*LAYOUTS, *DIAGNOSTIC_LAYOUTS)
HEADERS = {
    "bare": "bare torchrun",
    "one-pod": "one pod ({n} {unit}s)",
    "two-pods": "two pods (1 {unit} each, emulated)",
    "bare-shim": "bare torchrun + worker shim",
    "one-pod-agent-store": "one pod, agent's store",
    "one-pod-base": "one pod, --base-launcher",
    "bare-net": "bare torchrun, sockets",
}
VERSUS = {
    "one-pod": "one pod vs bare",
    "two-pods": "two pods vs bare",
    "bare-shim": "shim vs bare",
    "one-pod-agent-store": "agent's store vs bare",
    "one-pod-base": "base launcher vs bare",
    "bare-net": "sockets vs bare",
}
STEP_TARGET = 0.01  # one-pod DDP step within 1% of bare torchrun
STARTUP_TARGET_S = 2.0  # one-pod launch -> first step within 2 s of bare torchrun
EPOCH_TARGET = 0.02  # data-loading-bound: one-pod epoch time within 2% of bare torchrun


@dataclass(frozen=True)
class Workload:
    """A training script and the figures its result line carries."""

    script: str  # file name in bench/ (and in the notional image's IMAGE_DIR)
    tag: str  # "bench" field of its result line
    # (key in the result line, row label, how to compare with bare: "ratio" or "delta")
    rows: tuple[tuple[str, str, str], ...]


WORKLOADS = {
    "step": Workload(
        "gpu_ddp_step.py",
        "gpu_ddp_step",
        (
            ("step_ms_mean", "DDP step, mean (ms)", "ratio"),
            ("step_ms_median", "DDP step, median (ms)", "ratio"),
            ("busbw_gbps", "all-reduce bus bandwidth (GB/s)", "ratio"),
            ("startup_pg_s", "launch -> process group up (s)", "delta"),
            ("startup_first_step_s", "launch -> first step done (s)", "delta"),
            ("wall_s", "launch -> all processes exited (s)", "delta"),
        ),
    ),
    "data": Workload(
        "gpu_ddp_data.py",
        "gpu_ddp_data",
        (
            ("epoch_s_mean", "epoch, mean (s)", "ratio"),
            ("epoch_s_median", "epoch, median (s)", "ratio"),
            ("images_per_s", "images/s, all ranks", "ratio"),
            ("data_share", "time waiting for the next batch (share)", "ratio"),
            ("batch_data_ms_median", "one batch's loading, median (ms)", "ratio"),
            ("batch_data_ms_p10", "one batch's loading, 10th percentile (ms)", "ratio"),
            ("cpu_s_per_epoch", "CPU s per epoch, busiest rank", "ratio"),
            ("sys_s_per_epoch", "of which system (s), busiest rank", "ratio"),
            ("minflt_per_epoch", "minor page faults per epoch", "ratio"),
            ("other_threads_cpu_s_per_epoch", "CPU s/epoch, a rank's other threads", "ratio"),
            ("agent_cpu_s_per_epoch", "CPU s/epoch, the agent (torchrun/launcher)", "ratio"),
            ("nivcsw_per_epoch", "involuntary context switches per epoch", "ratio"),
            ("machine_busy_share", "machine: CPUs busy while timed (share)", "ratio"),
            ("machine_steal_share", "machine: CPU steal while timed (share)", "ratio"),
            ("startup_first_batch_s", "launch -> first step done (s)", "delta"),
            ("wall_s", "launch -> all processes exited (s)", "delta"),
        ),
    ),
    "mnist": Workload(
        "gpu_ddp_mnist.py",
        "gpu_ddp_mnist",
        (
            ("epoch_s_mean", "epoch, mean (s)", "ratio"),
            ("epoch_s_median", "epoch, median (s)", "ratio"),
            ("images_per_s", "images/s, all ranks", "ratio"),
            ("data_share", "time waiting for the next batch (share)", "ratio"),
            ("batch_data_ms_median", "one batch's loading, median (ms)", "ratio"),
            ("cpu_s_per_epoch", "CPU s per epoch, busiest rank", "ratio"),
            ("sys_s_per_epoch", "of which system (s), busiest rank", "ratio"),
            ("other_threads_cpu_s_per_epoch", "CPU s/epoch, a rank's other threads", "ratio"),
            ("agent_cpu_s_per_epoch", "CPU s/epoch, the agent (torchrun/launcher)", "ratio"),
            ("nvcsw_per_epoch", "voluntary context switches per epoch", "ratio"),
            ("nivcsw_per_epoch", "involuntary context switches per epoch", "ratio"),
            ("machine_busy_share", "machine: CPUs busy while timed (share)", "ratio"),
            ("startup_first_batch_s", "launch -> first step done (s)", "delta"),
            ("wall_s", "launch -> all processes exited (s)", "delta"),
        ),
    ),
}
# What each worker reports of its process (gpu_ddp_data.py's facts line), as table rows.
FACT_ROWS = (
    ("OMP_NUM_THREADS", "OMP_NUM_THREADS"),
    ("MKL_NUM_THREADS", "MKL_NUM_THREADS"),
    ("torch_num_threads", "torch.get_num_threads()"),
    ("torch_num_interop_threads", "torch.get_num_interop_threads()"),
    ("affinity_at_start", "CPU affinity at script start"),
    ("affinity", "CPU affinity, main thread (sched_getaffinity)"),
    ("parent_affinity", "CPU affinity of the parent (agent)"),
    ("cpu_count", "os.cpu_count()"),
    ("nice", "nice"),
    ("cgroup_cpu_max", "cgroup cpu.max"),
    ("os_threads", "OS threads after init_process_group"),
    ("os_thread_names", "their names (/proc/self/task/*/comm)"),
    ("faulthandler", "faulthandler enabled"),
    ("orig_argv", "worker command line (first 6 words)"),
)


# ------------------------------------------------------------------------------------------
# the job and its pods


def make_job(
    nodes: int, gpus_per_pod: int, nproc: int, script: str, script_args: list[str]
) -> dict[str, Any]:
    """A DistributedTrainingJob as a user would write it. With GPUs, nprocPerNode is "gpu"
    so the operator's own sizing (the nvidia.com/gpu limit) sets the worker count."""
    container: dict[str, Any] = {
        "name": "trainer",
        "image": "pytorch/pytorch:latest",
        "command": ["python", f"{IMAGE_DIR}/{script}"],
        "args": script_args,
    }
    spec: dict[str, Any] = {"nodes": nodes, "template": {"spec": {"containers": [container]}}}
    if gpus_per_pod:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus_per_pod}}
        spec["nprocPerNode"] = "gpu"
    else:
        spec["nprocPerNode"] = nproc
    return {
        "apiVersion": names.API_VERSION,
        "kind": names.KIND,
        "metadata": {"name": JOB_NAME, "namespace": "bench", "uid": JOB_UID},
        "spec": spec,
    }


@dataclass
class Proc:
    """One process to start: a pod's trainer container, or bare torchrun."""

    name: str
    argv: list[str]
    env: dict[str, str]
    workdir: Path
    termination_log: Path | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _field_ref(pod: dict[str, Any], path: str) -> str:
    """The downward API, for the fields a local process can answer."""
    values = {
        "status.podIP": "127.0.0.1",
        "status.hostIP": "127.0.0.1",
        "metadata.name": pod["metadata"]["name"],
        "metadata.namespace": pod["metadata"].get("namespace", "default"),
        "spec.nodeName": socket.gethostname(),
    }
    if path not in values:
        raise ValueError(f"benchmark cannot emulate downward-API field {path!r}")
    return values[path]


def localize_pod(
    pod: dict[str, Any],
    workdir: Path,
    port: int,
    gpus: Sequence[int] | None,
    launcher: Path | None = None,
) -> Proc:
    """The trainer container of a rendered pod as a local process: what the kubelet, the
    device plugin and cluster DNS would supply is substituted, nothing else is changed. With
    another ``launcher`` file, the bootstrap is given that file and its digest."""
    current = launcher_pyz()
    launcher = launcher or current
    container = copy.deepcopy(pod["spec"]["containers"][0])
    state = workdir / "state"
    state.mkdir(parents=True, exist_ok=True)
    paths = {  # volume mounts -> local paths (longest first, so prefixes don't clash)
        podmod.LAUNCHER_PATH: str(launcher),
        podmod.PROGRESS_FILE: str(state / "progress"),
        contract.STATE_DIR: str(state),
        IMAGE_DIR: str(BENCH_DIR),
    }

    def local(value: str) -> str:
        for src, dst in paths.items():
            if value == src or value.startswith(src + "/"):
                return dst + value[len(src) :]
        return value

    argv = [local(a) for a in [*container["command"], *container.get("args", [])]]
    if argv[0] == "python":
        argv[0] = sys.executable
    if launcher != current:  # the bootstrap checks the file against the digest after it
        i = argv.index(str(launcher))
        argv[i + 1] = hashlib.sha256(launcher.read_bytes()).hexdigest()
    # Cluster DNS: <job>-0.<job> resolves to pod 0, here 127.0.0.1 on a free port.
    i = argv.index("--rdzv-endpoint")
    host = argv[i + 1].rsplit(":", 1)[0]
    if host != names.rendezvous_host(JOB_NAME, 0):
        raise ValueError(f"unexpected rendezvous host {host!r} in rendered pod")
    argv[i + 1] = f"127.0.0.1:{port}"

    env = dict(os.environ)
    for e in container.get("env") or []:
        if "value" in e:
            env[e["name"]] = local(str(e["value"]))
        elif "fieldRef" in (e.get("valueFrom") or {}):
            env[e["name"]] = _field_ref(pod, e["valueFrom"]["fieldRef"]["fieldPath"])
        else:
            raise ValueError(f"benchmark cannot emulate env source of {e['name']!r}")
    term = workdir / "termination-log"
    # The kubelet's terminationMessagePath is a bind mount; locally the launcher's override.
    env[contract.ENV_TERMINATION_LOG] = str(term)
    if gpus is not None:  # the device plugin's grant
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
    return Proc(
        pod["metadata"]["name"],
        argv,
        env,
        workdir,
        term,
        {"rendered_args": container.get("args", [])},
    )


def layout_procs(
    layout: str, args: argparse.Namespace, script_args: list[str], base: Path
) -> list[Proc]:
    script = WORKLOADS[args.workload].script
    n = args.nproc
    gpus = list(range(n)) if not args.cpu else None
    if layout in ("bare", "bare-shim", "bare-net"):
        env = dict(os.environ)
        if layout == "bare-net":
            env |= {"NCCL_P2P_DISABLE": "1", "NCCL_SHM_DISABLE": "1"}
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        workdir = base / layout
        workdir.mkdir(parents=True)
        program = [str(BENCH_DIR / script), *script_args]
        if layout == "bare-shim":
            env[contract.ENV_STATE_DIR] = str(workdir / "state")
            program = [str(launcher_pyz()), "--worker", "python", *program]
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(n),
            *program,
        ]
        return [Proc("torchrun", argv, env, workdir)]

    nodes, per_pod = (1, n) if layout.startswith("one-pod") else (n, 1)
    launcher = launcher_pyz()
    if layout == "one-pod-base":
        if args.base_launcher is None:
            raise SystemExit("layout one-pod-base needs --base-launcher")
        launcher = args.base_launcher.resolve()
    job = make_job(nodes, 0 if args.cpu else per_pod, per_pod, script, script_args)
    port = free_port()
    procs = []
    for i in range(nodes):
        pod = render_pod(job, i, attempt=0)
        grant = None if gpus is None else gpus[i * per_pod : (i + 1) * per_pod]
        proc = localize_pod(pod, base / pod["metadata"]["name"], port, grant, launcher)
        if layout == "one-pod-agent-store":
            proc.env.pop("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", None)
        if layout == "two-pods":
            # Separate pods share no /dev/shm and cannot open each other's GPU memory.
            proc.env["NCCL_P2P_DISABLE"] = "1"
            proc.env["NCCL_SHM_DISABLE"] = "1"
        procs.append(proc)
    return procs


# ------------------------------------------------------------------------------------------
# running


@dataclass
class Started:
    """A layout's processes, started at ``t0``."""

    layout: str
    t0: float
    running: list[tuple[Proc, subprocess.Popen[bytes], Path]]
    cpus: list[int] | None = None


def run_layout(
    layout: str,
    args: argparse.Namespace,
    script_args: list[str],
    base: Path,
    cpus: list[int] | None = None,
) -> dict[str, Any]:
    return finish_layout(start_layout(layout, args, script_args, base, cpus), args)


def cpu_sets(args: argparse.Namespace, n_sets: int) -> list[list[int]]:
    """``n_sets`` disjoint CPU sets of ``--pin-cpus`` CPUs each (default: one per rank and two
    for the agents and helper threads), from this process's own affinity. CPU 0, which takes
    most of a VM's interrupts, is left out when there are CPUs enough without it."""
    size = args.pin_cpus or args.nproc + 2
    mine = sorted(os.sched_getaffinity(0))
    if len(mine) > size * n_sets:
        mine = [c for c in mine if c != 0] or mine
    if len(mine) < size * n_sets:
        raise SystemExit(
            f"--pin: {n_sets} sets of {size} CPUs need {size * n_sets}, "
            f"this process may run on {len(mine)}; set --pin-cpus"
        )
    return [mine[i * size : (i + 1) * size] for i in range(n_sets)]


def set_for(layout_index: int, repeat: int, n_sets: int, concurrent: bool) -> int:
    """Which CPU set a layout gets in a repeat. At the same time: each layout its own set,
    rotated every repeat (two layouts swap). One after the other: all layouts of a repeat the
    same set (the same cores, at different times), the set alternating over repeats."""
    return (layout_index + repeat) % n_sets if concurrent else repeat % n_sets


def start_layout(
    layout: str,
    args: argparse.Namespace,
    script_args: list[str],
    base: Path,
    cpus: list[int] | None = None,
) -> Started:
    procs = layout_procs(layout, args, script_args, base / layout)
    common = {"BENCH_T0": "", "PYTHONUNBUFFERED": "1"}
    if cpus is not None and args.pin_ranks:
        # Read by the training script after init_process_group: rank i's main thread onto
        # the i-th CPU of the set, in every layout alike.
        common["BENCH_RANK_CPUS"] = ",".join(map(str, cpus))
    if args.cpu:
        # Every layout alike: gloo on loopback, one thread per rank on a small CI machine.
        common |= {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    if args.nccl_debug:
        common |= {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    if args.pyspy is not None and args.profile_dir is not None:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
        common |= {
            "BENCH_PYSPY": str(args.pyspy.resolve()),
            "BENCH_PROFILE_OUT": str(args.profile_dir.resolve() / f"{layout}-{base.name}"),
            "BENCH_PROFILE_SECONDS": f"{args.profile_seconds:g}",
        }
    running: list[tuple[Proc, subprocess.Popen[bytes], Path]] = []
    t0 = time.time()
    for p in procs:
        env = {**p.env, **common, "BENCH_T0": repr(t0)}
        log = p.workdir / "output.log"
        with log.open("wb") as fp:
            popen = subprocess.Popen(
                p.argv,
                env=env,
                cwd=p.workdir,
                stdout=fp,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                # In the child before exec: torchrun (or the launcher) and every process it
                # starts inherit the set.
                preexec_fn=None if cpus is None else _pin(cpus),
            )
        running.append((p, popen, log))
    return Started(layout, t0, running, cpus)


def _pin(cpus: list[int]) -> Callable[[], None]:
    def pin() -> None:
        os.sched_setaffinity(0, cpus)

    return pin


def finish_layout(started: Started, args: argparse.Namespace) -> dict[str, Any]:
    layout, t0, running = started.layout, started.t0, started.running
    deadline = t0 + args.timeout
    codes = []
    for p, popen, log in running:
        try:
            codes.append(popen.wait(max(deadline - time.time(), 0.1)))
        except subprocess.TimeoutExpired:
            for _, other, _ in running:
                if other.poll() is None:
                    os.killpg(other.pid, 9)
                    other.wait()
            raise RuntimeError(
                f"{layout}: {p.name} did not finish in {args.timeout:g}s\n" + _tail(log)
            ) from None
    wall = time.time() - t0
    if any(codes):
        logs = "\n".join(
            f"--- {p.name} (exit {c})\n{_tail(log)}"
            for (p, _, log), c in zip(running, codes, strict=True)
        )
        raise RuntimeError(f"{layout}: exit codes {codes}\n{logs}")

    tag = WORKLOADS[args.workload].tag
    result: dict[str, Any] | None = None
    facts: list[dict[str, Any]] = []
    cpus: list[dict[str, Any]] = []
    threads: list[dict[str, Any]] = []
    for _, _, log in running:
        for line in log.read_text(errors="replace").splitlines():
            if not line.startswith("{"):
                continue
            if f'"bench": "{tag}"' in line:
                result = json.loads(line)
            elif '"bench": "gpu_ddp_facts"' in line:
                facts.append(json.loads(line))
            elif '"bench": "gpu_ddp_cpus"' in line:
                cpus.append(json.loads(line))
            elif '"bench": "gpu_ddp_threads"' in line:
                threads.append(json.loads(line))
    if result is None:
        raise RuntimeError(f"{layout}: no result line\n{_tail(running[0][2])}")
    result["wall_s"] = wall
    result["layout"] = layout
    result["cpus"] = None if started.cpus is None else cpu_list(started.cpus)
    if facts:
        result["facts"] = sorted(facts, key=lambda f: int(f["rank"]))
    if cpus:  # per rank: {CPU: batches loaded there}
        result["cpus_seen"] = [c["cpus_seen"] for c in sorted(cpus, key=lambda c: c["rank"])]
    if threads:  # per rank: {thread name: CPU seconds over the timed epochs}, its agent's too
        by_rank = sorted(threads, key=lambda t: int(t["rank"]))
        result["threads_cpu"] = [t["threads_cpu"] for t in by_rank]
        result["agent_threads_cpu"] = [t.get("agent_threads_cpu") for t in by_rank]
    result["processes"] = [
        {
            "name": p.name,
            "argv": p.argv,
            "summary": _summary(p.termination_log),
            "transport": _nccl_transport(log),
        }
        for p, _, log in running
    ]
    for proc in result["processes"]:
        summary = proc["summary"]
        if summary is not None and summary.get("state") != "Succeeded":
            raise RuntimeError(f"{layout}: launcher summary {summary}")
    return result


def cpu_list(cpus: Sequence[int]) -> str:
    """0-3,8 style."""
    runs: list[list[int]] = []
    for c in sorted(cpus):
        if runs and runs[-1][1] == c - 1:
            runs[-1][1] = c
        else:
            runs.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


# torchrun's own report of a failed worker (its traceback and the "Root Cause" table) is about
# 45 lines: a tail of 40 showed only that and cut off what the worker itself said before it.
FAILURE_TAIL_LINES = 150


def _tail(log: Path, lines: int = FAILURE_TAIL_LINES) -> str:
    """The log's last `lines` lines, without the JSON result lines (a rank's facts run to
    kilobytes and say nothing of why it failed)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return "(no output)"
    return "\n".join([line for line in text.splitlines() if not line.startswith("{")][-lines:])


def _summary(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data: dict[str, Any] = json.loads(path.read_bytes())
        return data
    except (OSError, ValueError):
        return {"state": "missing termination message"}


def _nccl_transport(log: Path) -> list[str]:
    """NCCL's own word on the channels it built (with --nccl-debug): P2P, SHM or NET."""
    seen: list[str] = []
    for line in log.read_text(errors="replace").splitlines():
        for marker in ("via P2P", "via SHM", "via NET/"):
            if marker in line:
                tag = (
                    marker
                    if marker != "via NET/"
                    else "via NET/" + line.split("via NET/")[1].split()[0].split("/")[0]
                )
                if tag not in seen:
                    seen.append(tag)
    return seen


# ------------------------------------------------------------------------------------------
# the table


def aggregate(runs: list[dict[str, Any]], workload: Workload) -> dict[str, float]:
    """Median over repeats of each figure."""
    return {key: statistics.median(r[key] for r in runs) for key, _, _ in workload.rows}


def compare(kind: str, value: float, base: float) -> str:
    if kind == "ratio":
        return f"{value / base:.3f}x" if base else "n/a"
    return f"{value - base:+.2f} s"


# Student's t, two-sided 95%, by degrees of freedom (1..30); 1.96 beyond.
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179,
       2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064,
       2.060, 2.056, 2.052, 2.048, 2.045, 2.042)  # fmt: skip


def ratio_stats(ratios: Sequence[float]) -> dict[str, float]:
    """Geometric mean of paired ratios and its 95% interval (t over the log ratios)."""
    logs = [math.log(v) for v in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return {"n": len(logs), "gmean": math.exp(mean), "lo": math.nan, "hi": math.nan}
    half = T95[min(len(logs) - 1, len(T95)) - 1] if len(logs) <= 31 else 1.96
    half *= statistics.stdev(logs) / math.sqrt(len(logs))
    return {
        "n": len(logs),
        "gmean": math.exp(mean),
        "lo": math.exp(mean - half),
        "hi": math.exp(mean + half),
        "sd_log": statistics.stdev(logs),
    }


def _ranks_batch_median(run: dict[str, Any]) -> float:
    vals = [r["batch_data_ms_median"] for r in run["ranks"]]
    return math.exp(statistics.fmean(math.log(v) for v in vals))


def _paired_report(
    layout: str,
    name: str,
    pairs: list[float],
    layout_runs: list[dict[str, Any]],
    sets: list[list[int]] | None,
    args: argparse.Namespace,
) -> dict[str, Any]:
    print(
        f"paired ratios {layout}/bare, {name}: "
        + " ".join(f"{v:.3f}" for v in pairs)
        + f" (median {statistics.median(pairs):.3f}, "
        f"{sum(v > 1 for v in pairs)} of {len(pairs)} above 1)"
    )
    st = ratio_stats(pairs)
    out: dict[str, Any] = {"ratios": pairs, **st}
    print(f"  {layout}/bare: {_ratio_line(st)}")
    if sets is not None and args.concurrent:
        # Which set this layout had: a difference between the sets' speeds shows as two
        # groups.
        by_set: dict[str, list[float]] = {}
        for o, v in zip(layout_runs, pairs, strict=True):
            by_set.setdefault(o["cpus"], []).append(v)
        out["by_set"] = {c: ratio_stats(vs) for c, vs in by_set.items()}
        for c, g in out["by_set"].items():
            print(f"  {layout} on CPUs {c}: {_ratio_line(g)}")
    return out


def _ratio_line(st: dict[str, float]) -> str:
    if st["n"] < 2:
        return f"geometric mean {st['gmean']:.3f} (1 pair)"
    return (
        f"geometric mean {st['gmean']:.3f}, 95% interval {st['lo']:.3f}-{st['hi']:.3f} "
        f"({st['n']} pairs, sd of log ratios {st['sd_log']:.3f})"
    )


def _fmt(key: str, value: float) -> str:
    if key in ("busbw_gbps", "images_per_s") or key.startswith(("nivcsw", "minflt", "batch_")):
        return f"{value:.1f}"
    if key.startswith(("agent_", "other_threads_")):
        return f"{value:.3f}"
    if key.endswith("_share"):
        return f"{value:.1%}"
    return f"{value:.2f}"


def _columns(layouts: Sequence[str], nproc: int, unit: str) -> list[str]:
    heads = [HEADERS[layout].format(n=nproc, unit=unit) for layout in layouts]
    return ["figure", *heads, *(VERSUS[x] for x in layouts if x != "bare")]


def _markdown(cols: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] * len(cols)) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def table(figures: dict[str, dict[str, float]], workload: Workload, nproc: int, unit: str) -> str:
    """One row per figure, one column per layout that ran (bare first), then each layout
    against bare."""
    layouts = [x for x in ALL_LAYOUTS if x in figures]
    rows = []
    for key, label, kind in workload.rows:
        vals = {x: figures[x][key] for x in layouts}
        rows.append(
            [
                label,
                *(_fmt(key, vals[x]) for x in layouts),
                *(compare(kind, vals[x], vals["bare"]) for x in layouts if x != "bare"),
            ]
        )
    return "\n".join(_markdown(_columns(layouts, nproc, unit), rows))


def _fact(facts: list[dict[str, Any]], key: str) -> str:
    """A fact over the ranks of one run: one value when they agree, else each rank's."""
    vals = []
    for f in facts:
        v = f.get(key)
        if key == "orig_argv" and isinstance(v, list):
            # A `-c` program (the launcher's worker entry) is shown as <code>: one table cell.
            v = " ".join("<code>" if "\n" in a else os.path.basename(a) for a in v[:6])
        elif isinstance(v, list):
            v = ", ".join(f"{n} x{v.count(n)}" if v.count(n) > 1 else n for n in sorted(set(v)))
        vals.append("-" if v is None else str(v))
    return vals[0] if len(set(vals)) == 1 else " / ".join(vals)


def facts_table(runs: dict[str, list[dict[str, Any]]], nproc: int, unit: str) -> str | None:
    """What each layout's workers saw of their process (first repeat; all ranks)."""
    layouts = [x for x in ALL_LAYOUTS if x in runs and runs[x] and runs[x][0].get("facts")]
    if "bare" not in layouts:
        return None
    cols = _columns(layouts, nproc, unit)[: 1 + len(layouts)]
    rows = [
        [label, *(_fact(runs[x][0]["facts"], key).replace("|", "\\|") for x in layouts)]
        for key, label in FACT_ROWS
    ]
    return "\n".join(_markdown(["worker process", *cols[1:]], rows))


# Set per run by torchrun's agent or by this harness: expected to differ between any two runs.
PER_RUN_ENV = {
    "BENCH_T0",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHRUN_OPERATOR_TERMINATION_LOG",
    "PET_RDZV_ENDPOINT",
    "PET_LOCAL_ADDR",
}


def env_diff(base: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    """The environment of a worker (its facts line) against a bare torchrun worker's: names
    only one of them has, and values that differ (of the names whose values are reported)."""
    b_names, o_names = set(base["env_names"]), set(other["env_names"])
    b_env, o_env = base["env"], other["env"]
    changed = {
        k: [b_env[k], o_env[k]]
        for k in sorted(set(b_env) & set(o_env))
        if b_env[k] != o_env[k] and k not in PER_RUN_ENV
    }
    return {
        "added": {k: o_env.get(k, "(value not reported)") for k in sorted(o_names - b_names)},
        "removed": sorted(b_names - o_names),
        "changed": changed,
    }


def verdicts(figures: dict[str, dict[str, float]], workload: str) -> list[str]:
    if "bare" not in figures or "one-pod" not in figures:
        return []
    bare, one = figures["bare"], figures["one-pod"]
    if workload in ("data", "mnist"):
        epoch = one["epoch_s_mean"] / bare["epoch_s_mean"] - 1
        bound = "data-loading" if workload == "data" else "loader"
        return [
            f"target: one-pod epoch ({bound} bound) within {EPOCH_TARGET:.0%} of bare "
            f"torchrun: {epoch:+.2%} " + ("PASS" if abs(epoch) <= EPOCH_TARGET else "MISS")
        ]
    step = one["step_ms_mean"] / bare["step_ms_mean"] - 1
    start = one["startup_first_step_s"] - bare["startup_first_step_s"]
    return [
        f"target: one-pod DDP step within {STEP_TARGET:.0%} of bare torchrun: {step:+.2%} "
        + ("PASS" if abs(step) <= STEP_TARGET else "MISS"),
        f"target: one-pod launch -> first step within {STARTUP_TARGET_S:g} s of bare "
        f"torchrun: {start:+.2f} s " + ("PASS" if start <= STARTUP_TARGET_S else "MISS"),
    ]


def describe(first: dict[str, Any], args: argparse.Namespace) -> str:
    head = (
        f"device: {first['device']} x{args.nproc}; torch {first['torch']}"
        + (f", NCCL {first['nccl']}" if first.get("nccl") else "")
        + f"; backend {first['backend']}; {first['params'] / 1e6:.2f}M params"
    )
    if args.workload == "mnist":
        return head + (
            f"; {first['source']} 1x28x28 + ToTensor, {first['samples_per_rank']} images/rank/"
            f"epoch in batches of {first['batch']}, no loader workers, pin_memory; "
            f"{first['epochs']} timed epoch(s); median of {args.repeats} run(s) each"
        )
    if args.workload == "data":
        return head + (
            f"; {first['source']}, {first['image_size']}px -> {first['crop']}px crops, "
            f"{first['samples_per_rank']} images/rank/epoch in batches of {first['batch']}, "
            f"no loader workers; {first['epochs']} timed epoch(s); "
            f"median of {args.repeats} run(s) each"
        )
    return head + (
        f", {first['dtype']}, batch {first['batch']}/rank, {first['steps']} timed steps; "
        f"all-reduce {first['allreduce_mb']:g} MiB; median of {args.repeats} run(s) each"
    )


def progress_line(layout: str, r: int, res: dict[str, Any], workload: Workload) -> str:
    figs = ", ".join(f"{key} {_fmt(key, res[key])}" for key, _, _ in workload.rows[:3])
    transport = [p["transport"] for p in res["processes"] if p["transport"]]
    return (
        f"# {layout} run {r}: {figs}"
        + (f", transport {transport}" if transport else "")
        + (f", CPUs {res['cpus']}" if res.get("cpus") else "")
    )


# ------------------------------------------------------------------------------------------
# main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="gloo on CPU (no GPUs needed)")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="tiny model, few steps: checks the harness, not the figures",
    )
    p.add_argument("--nproc", type=int, default=2, help="GPUs (or CPU ranks) in all")
    p.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="runs of each layout, interleaved; the table shows medians",
    )
    p.add_argument(
        "--layouts",
        default=",".join(LAYOUTS),
        help=f"comma-separated, of {', '.join(ALL_LAYOUTS)} (the last {len(DIAGNOSTIC_LAYOUTS)}: "
        "diagnostic variants, see bench/README.md)",
    )
    p.add_argument(
        "--base-launcher",
        type=Path,
        help="layout one-pod-base: this launcher (.pyz or old launcher.py), not the current",
    )
    p.add_argument(
        "--pyspy",
        type=Path,
        help="mnist workload: py-spy's path; each run's ranks and agent are sampled for "
        "--profile-seconds from the start of the timed epochs (slows them: not figures)",
    )
    p.add_argument("--profile-seconds", type=float, default=5.0)
    p.add_argument("--profile-dir", type=Path, help="with --pyspy: where the profiles go")
    p.add_argument(
        "--concurrent",
        action="store_true",
        help="start the layouts of each repeat at the same time, on the same GPUs: each "
        "repeat compares them under the same machine conditions (the CPU-bound data "
        "workload only; the step workload would measure the sharing)",
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="each layout of a repeat on its own CPU set (disjoint, equal-sized), inherited "
        "by the launcher and its workers; with --concurrent the sets rotate between the "
        "layouts every repeat, else all layouts of a repeat share one set",
    )
    p.add_argument(
        "--pin-cpus", type=int, default=None, help="CPUs per set with --pin (default nproc+2)"
    )
    p.add_argument(
        "--pin-ranks",
        action="store_true",
        help="with --pin, the data workload: each rank's main thread on one CPU of its set",
    )
    p.add_argument("--steps", type=int, default=None, help="step workload: timed steps")
    p.add_argument("--warmup", type=int, default=None, help="step workload: warm-up steps")
    p.add_argument(
        "--nccl-debug",
        action="store_true",
        help="NCCL_DEBUG=INFO (INIT,NET) to report the transport NCCL chose",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per layout run")
    p.add_argument("--json-out", type=Path, help="write every run's results here")
    p.add_argument("--keep", type=Path, help="keep the processes' logs in this directory")
    p.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="step",
        help="step: gpu_ddp_step.py (step time, bandwidth); data: gpu_ddp_data.py "
        "(data-loading-bound epoch time, worker thread facts); mnist: gpu_ddp_mnist.py "
        "(the MNIST tutorials' loader-bound shape: Python in the main thread)",
    )
    p.add_argument("script_args", nargs="*", help="after --: passed to the workload's script")
    return p.parse_args(argv)


def script_args_for(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
    if args.workload == "mnist":
        if args.smoke:
            out += ["--samples", "400", "--epochs", "1", "--warmup-batches", "1"]
        if args.cpu:
            out.append("--cpu")
        return out + list(args.script_args)
    if args.workload == "data":
        if args.smoke:
            out += ["--samples", "48", "--batch", "16", "--image-size", "48", "--crop", "32"]
            out += ["--width", "8", "--classes", "10", "--epochs", "1", "--warmup-batches", "1"]
        if args.cpu:
            out.append("--cpu")
        return out + list(args.script_args)
    if args.smoke:
        out += [
            "--width",
            "64",
            "--layers",
            "2",
            "--batch",
            "32",
            "--allreduce-mb",
            "1",
            "--allreduce-warmup",
            "1",
            "--allreduce-iters",
            "3",
        ]
        steps, warmup = args.steps or 5, args.warmup or 2
    else:
        steps, warmup = args.steps or 200, args.warmup or 20
    out += ["--steps", str(steps), "--warmup", str(warmup)]
    if args.cpu:
        out.append("--cpu")
    return out + list(args.script_args)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    layouts = [x for x in args.layouts.split(",") if x]
    if unknown := set(layouts) - set(ALL_LAYOUTS):
        raise SystemExit(f"unknown layouts: {sorted(unknown)}")
    if args.pin_ranks and (not args.pin or args.workload == "step"):
        raise SystemExit("--pin-ranks needs --pin and --workload data or mnist")
    sets = cpu_sets(args, len(layouts)) if args.pin else None
    if sets is not None:
        print("CPU sets: " + "; ".join(f"{chr(65 + i)} {cpu_list(c)}" for i, c in enumerate(sets)))
    if not args.cpu:
        import torch

        if torch.cuda.device_count() < args.nproc:
            raise SystemExit(
                f"need {args.nproc} GPUs, see {torch.cuda.device_count()}; "
                "use --cpu for gloo on CPU"
            )
    workload = WORKLOADS[args.workload]
    script_args = script_args_for(args)
    base = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in layouts}
    try:
        for r in range(args.repeats):
            # Interleaved, so drift in clocks or heat hits all alike, and the order rotates
            # each repeat, so no layout always runs first (after the others' page cache, say).
            k = r % len(layouts)
            order = layouts[k:] + layouts[:k]
            cpus = {
                x: None
                if sets is None
                else sets[set_for(layouts.index(x), r, len(sets), args.concurrent)]
                for x in layouts
            }
            if args.concurrent:
                started = [
                    start_layout(x, args, script_args, base / f"r{r}", cpus[x]) for x in order
                ]
                results = [finish_layout(st, args) for st in started]
            else:
                results = [run_layout(x, args, script_args, base / f"r{r}", cpus[x]) for x in order]
            for layout, res in zip(order, results, strict=True):
                runs[layout].append(res)
                print(progress_line(layout, r, res, workload), file=sys.stderr, flush=True)
            if args.json_out:  # what ran so far survives a run that is cut off
                args.json_out.write_text(json.dumps({"runs": runs}, indent=1))
    finally:
        if args.keep:
            shutil.copytree(base, args.keep, dirs_exist_ok=True)
        shutil.rmtree(base, ignore_errors=True)

    figures = {layout: aggregate(rs, workload) for layout, rs in runs.items()}
    unit = "CPU rank" if args.cpu else "GPU"
    print(describe(next(iter(runs.values()))[0], args))
    if "two-pods" in layouts:
        print(
            "two-pods EMULATES separate pods on one host: NCCL_P2P_DISABLE=1 "
            "NCCL_SHM_DISABLE=1, one GPU visible per pod, local processes on 127.0.0.1"
        )
    key = workload.rows[0][0]
    spread = {
        x: statistics.pstdev(r[key] for r in rs) / statistics.fmean(r[key] for r in rs)
        for x, rs in runs.items()
    }
    print(
        f"per run, {key}: "
        + "; ".join(f"{x} {' '.join(_fmt(key, r[key]) for r in rs)}" for x, rs in runs.items())
        + " (spread, stdev/mean: "
        + ", ".join(f"{x} {v:.2%}" for x, v in spread.items())
        + ")"
    )
    paired: dict[str, Any] = {}
    if "bare" in layouts and len(layouts) > 1:
        # Each repeat's layouts ran back to back (or at once): their ratio cancels drift that
        # is slower than a repeat, which the medians over repeats do not.
        measures: list[tuple[str, Callable[[dict[str, Any]], float]]] = [
            (key, lambda run: float(run[key]))
        ]
        if args.workload in ("data", "mnist"):
            # Each rank's median batch: robust to a CPU's short bursts of slowness, which
            # move an epoch's time; geometric mean over the ranks.
            measures.append(("batch_data_ms_median, mean over ranks", _ranks_batch_median))
        for x in layouts:
            if x == "bare":
                continue
            paired[x] = {}
            for name, measure in measures:
                pairs = [
                    measure(o) / measure(b) for o, b in zip(runs[x], runs["bare"], strict=True)
                ]
                paired[x][name] = _paired_report(x, name, pairs, runs[x], sets, args)
    if "bare" in layouts:
        print(table(figures, workload, args.nproc, unit))
    else:
        print(json.dumps(figures, indent=1))
    diffs: dict[str, Any] = {}
    facts = facts_table(runs, args.nproc, unit)
    if facts is not None:
        print(facts)
        base_facts = runs["bare"][0]["facts"][0]
        for x in layouts:
            if x != "bare" and runs[x][0].get("facts"):
                diffs[x] = env_diff(base_facts, runs[x][0]["facts"][0])
                print(f"environment of rank 0, {x} vs bare: {json.dumps(diffs[x])}")
    for line in verdicts(figures, args.workload):
        print(line)
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {
                    "figures": figures,
                    "paired": paired,
                    "cpu_sets": sets,
                    "env_diff": diffs,
                    "runs": runs,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
