"""GPU benchmark: the pods the operator renders for a DDP job, against bare torchrun.

Three layouts run one after another in this one process, on the same GPUs:

* ``bare``: ``torchrun --standalone --nproc-per-node N gpu_ddp_step.py`` (the baseline);
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

Figures are ratios or differences against the bare run of the same call (bench/README.md).

    python bench/gpu_bench.py                    # 2 GPUs, nccl
    python bench/gpu_bench.py --smoke --cpu      # gloo on CPU, tiny model: CI's rot check
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEP_SCRIPT = ROOT / "bench" / "gpu_ddp_step.py"
LAUNCHER = ROOT / "operator" / "torchrun_operator" / "launcher" / "launcher.py"
if str(ROOT / "operator") not in sys.path:
    sys.path.insert(0, str(ROOT / "operator"))

from torchrun_operator.api import names  # noqa: E402
from torchrun_operator.launcher import launcher as contract  # noqa: E402
from torchrun_operator.render import pod as podmod  # noqa: E402
from torchrun_operator.render import render_pod  # noqa: E402

# Where the training script lives in the (notional) image; mapped to STEP_SCRIPT locally.
IMAGE_SCRIPT = "/workspace/gpu_ddp_step.py"
JOB_NAME = "ddp-bench"
JOB_UID = "00000000-0000-4000-8000-00000000bench"

LAYOUTS = ("bare", "one-pod", "two-pods")
HEADERS = {
    "bare": "bare torchrun",
    "one-pod": "one pod ({n} {unit}s)",
    "two-pods": "two pods (1 {unit} each, emulated)",
}
# (key in the result line, row label, how to compare with bare: "ratio" or "delta")
ROWS: list[tuple[str, str, str]] = [
    ("step_ms_mean", "DDP step, mean (ms)", "ratio"),
    ("step_ms_median", "DDP step, median (ms)", "ratio"),
    ("busbw_gbps", "all-reduce bus bandwidth (GB/s)", "ratio"),
    ("startup_pg_s", "launch -> process group up (s)", "delta"),
    ("startup_first_step_s", "launch -> first step done (s)", "delta"),
    ("wall_s", "launch -> all processes exited (s)", "delta"),
]
STEP_TARGET = 0.01  # one-pod DDP step within 1% of bare torchrun
STARTUP_TARGET_S = 2.0  # one-pod launch -> first step within 2 s of bare torchrun


# ------------------------------------------------------------------------------------------
# the job and its pods


def make_job(nodes: int, gpus_per_pod: int, nproc: int, script_args: list[str]) -> dict[str, Any]:
    """A DistributedTrainingJob as a user would write it. With GPUs, nprocPerNode is "gpu"
    so the operator's own sizing (the nvidia.com/gpu limit) sets the worker count."""
    container: dict[str, Any] = {
        "name": "trainer",
        "image": "pytorch/pytorch:latest",
        "command": ["python", IMAGE_SCRIPT],
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


def localize_pod(pod: dict[str, Any], workdir: Path, port: int, gpus: Sequence[int] | None) -> Proc:
    """The trainer container of a rendered pod as a local process: what the kubelet, the
    device plugin and cluster DNS would supply is substituted, nothing else is changed."""
    container = copy.deepcopy(pod["spec"]["containers"][0])
    state = workdir / "state"
    state.mkdir(parents=True, exist_ok=True)
    paths = {  # volume mounts -> local paths (longest first, so prefixes don't clash)
        podmod.LAUNCHER_PATH: str(LAUNCHER),
        podmod.PROGRESS_FILE: str(state / "progress"),
        contract.STATE_DIR: str(state),
        IMAGE_SCRIPT: str(STEP_SCRIPT),
    }

    def local(value: str) -> str:
        for src, dst in paths.items():
            if value == src or value.startswith(src + "/"):
                return dst + value[len(src) :]
        return value

    argv = [local(a) for a in [*container["command"], *container.get("args", [])]]
    if argv[0] == "python":
        argv[0] = sys.executable
    # Cluster DNS: <job>-0.<job> resolves to pod 0, here 127.0.0.1 on a free port.
    i = argv.index("--rdzv-endpoint")
    host = argv[i + 1].rsplit(":", 1)[0]
    if host != names.rendezvous_host(JOB_NAME):
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
    n = args.nproc
    gpus = list(range(n)) if not args.cpu else None
    if layout == "bare":
        env = dict(os.environ)
        if gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpus))
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(n),
            str(STEP_SCRIPT),
            *script_args,
        ]
        workdir = base / "bare"
        workdir.mkdir(parents=True)
        return [Proc("torchrun", argv, env, workdir)]

    nodes, per_pod = (1, n) if layout == "one-pod" else (n, 1)
    job = make_job(nodes, 0 if args.cpu else per_pod, per_pod, script_args)
    port = free_port()
    procs = []
    for i in range(nodes):
        pod = render_pod(job, i, attempt=0)
        grant = None if gpus is None else gpus[i * per_pod : (i + 1) * per_pod]
        proc = localize_pod(pod, base / pod["metadata"]["name"], port, grant)
        if layout == "two-pods":
            # Separate pods share no /dev/shm and cannot open each other's GPU memory.
            proc.env["NCCL_P2P_DISABLE"] = "1"
            proc.env["NCCL_SHM_DISABLE"] = "1"
        procs.append(proc)
    return procs


# ------------------------------------------------------------------------------------------
# running


def run_layout(
    layout: str, args: argparse.Namespace, script_args: list[str], base: Path
) -> dict[str, Any]:
    procs = layout_procs(layout, args, script_args, base / layout)
    common = {"BENCH_T0": "", "PYTHONUNBUFFERED": "1"}
    if args.cpu:
        # Every layout alike: gloo on loopback, one thread per rank on a small CI machine.
        common |= {"GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    if args.nccl_debug:
        common |= {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
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
            )
        running.append((p, popen, log))
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

    result: dict[str, Any] | None = None
    for _, _, log in running:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"bench": "gpu_ddp_step"' in line:
                result = json.loads(line)
    if result is None:
        raise RuntimeError(f"{layout}: no result line\n{_tail(running[0][2])}")
    result["wall_s"] = wall
    result["layout"] = layout
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


def _tail(log: Path, lines: int = 40) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no output)"


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


def aggregate(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Median over repeats of each figure."""
    return {key: statistics.median(r[key] for r in runs) for key, _, _ in ROWS}


def compare(kind: str, value: float, base: float) -> str:
    if kind == "ratio":
        return f"{value / base:.3f}x" if base else "n/a"
    return f"{value - base:+.2f} s"


def table(figures: dict[str, dict[str, float]], nproc: int, unit: str) -> str:
    heads = [HEADERS[layout].format(n=nproc, unit=unit) for layout in LAYOUTS]
    cols = ["figure", *heads, "one pod vs bare", "two pods vs bare"]
    out = ["| " + " | ".join(cols) + " |", "|" + "|".join(["---"] * len(cols)) + "|"]
    for key, label, kind in ROWS:
        vals = [figures[layout][key] for layout in LAYOUTS]
        fmt = "{:.2f}" if key != "busbw_gbps" else "{:.1f}"
        cells = [
            label,
            *(fmt.format(v) for v in vals),
            compare(kind, vals[1], vals[0]),
            compare(kind, vals[2], vals[0]),
        ]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def verdicts(figures: dict[str, dict[str, float]]) -> list[str]:
    bare, one = figures["bare"], figures["one-pod"]
    step = one["step_ms_mean"] / bare["step_ms_mean"] - 1
    start = one["startup_first_step_s"] - bare["startup_first_step_s"]
    return [
        f"target: one-pod DDP step within {STEP_TARGET:.0%} of bare torchrun: {step:+.2%} "
        + ("PASS" if abs(step) <= STEP_TARGET else "MISS"),
        f"target: one-pod launch -> first step within {STARTUP_TARGET_S:g} s of bare "
        f"torchrun: {start:+.2f} s " + ("PASS" if start <= STARTUP_TARGET_S else "MISS"),
    ]


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
    p.add_argument("--layouts", default=",".join(LAYOUTS), help="for debugging: a subset")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument(
        "--nccl-debug",
        action="store_true",
        help="NCCL_DEBUG=INFO (INIT,NET) to report the transport NCCL chose",
    )
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per layout run")
    p.add_argument("--json-out", type=Path, help="write every run's results here")
    p.add_argument("--keep", type=Path, help="keep the processes' logs in this directory")
    p.add_argument("script_args", nargs="*", help="after --: passed to gpu_ddp_step.py")
    return p.parse_args(argv)


def script_args_for(args: argparse.Namespace) -> list[str]:
    out: list[str] = []
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
    if unknown := set(layouts) - set(LAYOUTS):
        raise SystemExit(f"unknown layouts: {sorted(unknown)}")
    if not args.cpu:
        import torch

        if torch.cuda.device_count() < args.nproc:
            raise SystemExit(
                f"need {args.nproc} GPUs, see {torch.cuda.device_count()}; "
                "use --cpu for gloo on CPU"
            )
    script_args = script_args_for(args)
    base = Path(tempfile.mkdtemp(prefix="gpu-bench-"))
    runs: dict[str, list[dict[str, Any]]] = {layout: [] for layout in layouts}
    try:
        for r in range(args.repeats):
            for layout in layouts:  # interleaved, so drift in clocks or heat hits all alike
                res = run_layout(layout, args, script_args, base / f"r{r}")
                runs[layout].append(res)
                print(
                    f"# {layout} run {r}: step {res['step_ms_mean']:.3f} ms, busbw "
                    f"{res['busbw_gbps']:.1f} GB/s, first step {res['startup_first_step_s']:.2f}"
                    f" s, transport {[p['transport'] for p in res['processes']]}",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        if args.keep:
            shutil.copytree(base, args.keep, dirs_exist_ok=True)
        shutil.rmtree(base, ignore_errors=True)

    figures = {layout: aggregate(rs) for layout, rs in runs.items()}
    first = next(iter(runs.values()))[0]
    print(
        f"device: {first['device']} x{args.nproc}; torch {first['torch']}"
        + (f", NCCL {first['nccl']}" if first.get("nccl") else "")
        + f"; backend {first['backend']}; {first['params'] / 1e6:.1f}M params, "
        f"{first['dtype']}, batch {first['batch']}/rank, {first['steps']} timed steps; "
        f"all-reduce {first['allreduce_mb']:g} MiB; median of {args.repeats} run(s) each"
    )
    print(
        "two-pods EMULATES separate pods on one host: NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1, "
        "one GPU visible per pod, local processes on 127.0.0.1"
    )
    if set(layouts) == set(LAYOUTS):
        print(table(figures, args.nproc, "CPU rank" if args.cpu else "GPU"))
        for line in verdicts(figures):
            print(line)
    else:
        print(json.dumps(figures, indent=1))
    if args.json_out:
        args.json_out.write_text(json.dumps({"figures": figures, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
