"""GPU failures through the rendered pods: what torch, NCCL and the launcher say, and the
`status.failure` the operator computes from it (issue 27; bench/README.md, "GPU failures").

Each scenario runs bench/gpu_fail_worker.py as the trainer of a job's rendered pods, the way
bench/gpu_bench.py runs them (its ``localize_pod``: the kubelet, device plugin and DNS
substituted), in the one-pod (N GPUs) and the two-pod (1 GPU each, emulated) layout. What each
pod's launcher wrote to its termination message becomes that pod's status (phase Failed, the
container's exit code and message), and reconcile/rootcause.py computes the root cause from the
pods as the operator would. Writes one JSON document (the reports, the computed failures, the
ends of the pod logs) to --out.

    PYTHONPATH=operator python bench/gpu_failures.py --out failures.json      # 2 GPUs
    PYTHONPATH=operator python bench/gpu_failures.py --cpu --scenarios nccl-timeout  # gloo
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))

import gpu_bench  # type: ignore[import-not-found,unused-ignore]  # noqa: E402
from torchrun_operator.reconcile.failure.cause import failure_record  # noqa: E402
from torchrun_operator.reconcile.observe import view  # noqa: E402
from torchrun_operator.reconcile.rootcause import classify, pod_candidates, root_cause  # noqa: E402

SCENARIOS: dict[str, tuple[str, list[str], tuple[int | None, str, str]]] = {
    # mode, which rank fails, what the operator must name: (rank, kind, class); rank None:
    # the global rank local rank 0 of pod index 0 got (the rendezvous decides it)
    "oom": ("oom", ["--rank", "1"], (1, "cuda-oom", "user")),
    "nccl-timeout": ("nccl-timeout", ["--rank", "1"], (1, "nccl-timeout", "infrastructure")),
    # the late rank in the pod that holds the rendezvous store: its launcher learns of the
    # failure only from the rendezvous another node's agent closed
    "nccl-timeout-host": (
        "nccl-timeout",
        ["--index", "0"],
        (None, "nccl-timeout", "infrastructure"),
    ),
    "sigkill": ("sigkill", ["--rank", "1"], (1, "signal", "infrastructure")),
}
LOG_TAIL = 6000


def pod_status(pod: dict[str, Any], exit_code: int | None, report: str | None) -> dict[str, Any]:
    """The pod as the apiserver would show it once its trainer ended."""
    out = json.loads(json.dumps(pod))
    out["metadata"]["uid"] = f"uid-{pod['metadata']['name']}"
    out["spec"]["nodeName"] = f"node-{pod['metadata']['name']}"
    term: dict[str, Any] = {"exitCode": exit_code if exit_code is not None else 137}
    term["reason"] = "Error" if exit_code else "Completed"
    if report:
        term["message"] = report
    out["status"] = {
        "phase": "Failed" if exit_code else "Succeeded",
        "containerStatuses": [{"name": "trainer", "state": {"terminated": term}}],
    }
    return out


def run(scenario: str, layout: str, args: argparse.Namespace, base: Path) -> dict[str, Any]:
    mode, which, expected = SCENARIOS[scenario]
    if args.cpu and expected[1] == "nccl-timeout":
        expected = (expected[0], "gloo-timeout", expected[2])
    script_args = ["--mode", mode, *which, "--timeout", str(args.timeout)]
    if args.cpu:
        script_args += ["--backend", "gloo"]
    nodes, per_pod = (1, args.nproc) if layout == "one-pod" else (args.nproc, 1)
    job = gpu_bench.make_job(
        nodes, 0 if args.cpu else per_pod, per_pod, "gpu_fail_worker.py", script_args
    )
    port = gpu_bench.free_port()
    started = []
    t0 = time.time()
    for i in range(nodes):
        pod = gpu_bench.render_pod(job, i, attempt=0)
        grant = None if args.cpu else list(range(i * per_pod, (i + 1) * per_pod))
        workdir = base / f"{scenario}-{layout}" / pod["metadata"]["name"]
        proc = gpu_bench.localize_pod(pod, workdir, port, grant)
        if layout == "two-pods":
            proc.env["NCCL_P2P_DISABLE"] = "1"
            proc.env["NCCL_SHM_DISABLE"] = "1"
        proc.env["PYTHONUNBUFFERED"] = "1"
        log = workdir / "pod.log"
        with open(log, "wb") as fp:
            p = subprocess.Popen(
                proc.argv, env=proc.env, cwd=workdir, stdout=fp, stderr=subprocess.STDOUT
            )
        started.append((pod, proc, p, log))
    pods, logs, reports = [], {}, {}
    for pod, proc, p, log in started:
        try:
            code: int | None = p.wait(timeout=max(1.0, t0 + args.limit - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            code = None
        report = (
            proc.termination_log.read_text()
            if proc.termination_log and proc.termination_log.exists()
            else None
        )
        name = pod["metadata"]["name"]
        reports[name] = json.loads(report) if report else None
        logs[name] = log.read_text(errors="replace")[-LOG_TAIL:]
        pods.append(pod_status(pod, code, report))
    candidates = []
    for i, raw in enumerate(pods):
        v = view(raw, "trainer")
        candidates.extend(pod_candidates(i, v, None, time.time()))
    cause = root_cause(candidates)
    klass = classify(cause, [])
    failure = failure_record(cause)
    if expected[0] is None:
        first = reports.get(pods[0]["metadata"]["name"]) or {}
        expected = ((first.get("ranks") or [None])[0], expected[1], expected[2])
    got = (failure.get("rank"), failure.get("kind"), klass)
    return {
        "scenario": scenario,
        "layout": layout,
        "wall_s": round(time.time() - t0, 1),
        "exit_codes": {
            p["metadata"]["name"]: p["status"]["containerStatuses"][0]["state"]["terminated"][
                "exitCode"
            ]
            for p in pods
        },
        "reports": reports,
        "failure": failure,
        "class": klass,
        "expected": {"rank": expected[0], "kind": expected[1], "class": expected[2]},
        "as_expected": got == expected,
        "logs": logs,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--scenarios", default=",".join(SCENARIOS))
    p.add_argument("--layouts", default="one-pod,two-pods")
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--timeout", type=float, default=20.0, help="init_process_group timeout")
    p.add_argument("--limit", type=float, default=240.0, help="seconds a run may take")
    p.add_argument("--cpu", action="store_true", help="gloo on CPU")
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args()
    base = args.workdir or Path(os.environ.get("TMPDIR", "/tmp")) / "gpu-failures"
    results = []
    for scenario in args.scenarios.split(","):
        for layout in args.layouts.split(","):
            r = run(scenario, layout, args, base)
            f = r["failure"]
            print(
                f"{scenario:13} {layout:9} {r['wall_s']:6.1f}s  rank {f.get('rank')} "
                f"kind {f.get('kind')} class {r['class']} reason {f.get('reason')} "
                f"{'OK' if r['as_expected'] else 'UNEXPECTED'}\n    {str(f.get('message'))[:300]}",
                flush=True,
            )
            results.append(r)
            args.out.write_text(json.dumps(results, indent=1))
    return 0 if all(r["as_expected"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
