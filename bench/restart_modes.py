"""A restart inside the pods (torchrun's own, `spec.torchrun.maxRestarts`) against a gang restart
that recreates every pod (`spec.failurePolicy.maxRestarts`), with real torchrun on the local
cluster, at 8 and 16 pods.

    LOCALKUBE_BIN=$(cluster/build.sh) PYTHONPATH=operator:cluster:tests:tests/integration \\
        .venv/bin/python -m bench.restart_modes --pods 8,16

One local cluster (two process nodes) and one operator process; for each size and mode a job
of that many pods, one worker each (gloo), in a namespace of its own. In the first round every
worker joins, then global rank 1 exits with code 3 three seconds later while the others wait.
Then:

* `in-pod`: torchrun restarts the workers of every pod in place (torchrun maxRestarts 1,
  failurePolicy maxRestarts 0): the agents stay, the pods stay, a new rendezvous round;
* `recreate`: torchrun gives up (maxRestarts 0); exit code 3 is listed as retryable, so the
  operator restarts the gang (failurePolicy maxRestarts 1, no back-off): every pod is deleted
  and created again, and each new pod starts its launcher (and imports torch) anew.

Each worker prints the host's clock when its round started (after init_process_group and an
all-reduce) and rank 1 when it fails; the process node keeps every pod's log on the host, and the
same clock serves all pods. The figure is the time from the failure to the last worker of the
next round started: how long training stood still. Both modes run in the same process, on the
same cluster, one after the other; the ratio is what to read.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jobs
from campaign_cluster import local_cluster
from campaign_operator import Operator
from dtj import IMAGE, apply, wait_phase
from kubernetes import client, config
from localkube.testing import create_namespace

RETRYABLE = 3
SCRIPT = f"""\
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
# torchrun counts the in-place restart on the failed pod's agent only, not always on the
# others' (tests/integration/test_inpod_restarts.py): the highest count says the round.
restarts = torch.tensor([int(os.environ["TORCHELASTIC_RESTART_COUNT"])])
dist.all_reduce(restarts, op=dist.ReduceOp.MAX)
first = restarts.item() == 0 and os.environ["TORCHELASTIC_RUN_ID"].endswith("-0")
print(f"BENCH start {{time.time():.3f}}", flush=True)
if first:
    if dist.get_rank() == 1:
        time.sleep(3)
        print(f"BENCH fail {{time.time():.3f}}", flush=True)
        os._exit({RETRYABLE})
    time.sleep(3600)  # stopped by torchrun, or deleted with its pod
dist.barrier()
dist.destroy_process_group()
"""
MODES: dict[str, dict[str, Any]] = {
    "in-pod": {"torchrun": {"maxRestarts": 1}, "failurePolicy": {"maxRestarts": 0}},
    "recreate": {
        "torchrun": {"maxRestarts": 0},
        "failurePolicy": {
            "maxRestarts": 1,
            "backoffSeconds": 0,
            "retryableExitCodes": [RETRYABLE],
        },
    },
}
LINE = re.compile(r"BENCH (start|fail) (\d+\.\d+)")


def stood_still(logs: list[str]) -> float:
    """Seconds from rank 1's failure to the last worker's start in the round after it."""
    fail = min(float(m[2]) for text in logs for m in LINE.finditer(text) if m[1] == "fail")
    starts = [float(m[2]) for text in logs for m in LINE.finditer(text) if m[1] == "start"]
    after = [t for t in starts if t > fail]
    if not after:
        raise RuntimeError("no worker started after the failure")
    return max(after) - fail


def run(api: client.ApiClient, cluster: Any, pods: int, mode: str) -> dict[str, Any]:
    ns = f"restart-{mode}-{pods}"
    create_namespace(api, ns)
    name = "bench"
    docs = jobs.scripted(
        name,
        {"bench.py": SCRIPT},
        ["python", "/workspace/bench.py"],
        nodes=pods,
        nproc=1,
        image=IMAGE,
        pod={"terminationGracePeriodSeconds": 5},
        **MODES[mode],
    )
    began = time.monotonic()
    apply(api, ns, docs)
    done = wait_phase(api, ns, name, {"Succeeded", "Failed"}, timeout=900)
    took = time.monotonic() - began
    status = done["status"]
    if status["phase"] != "Succeeded":
        raise RuntimeError(f"{mode} at {pods} pods: {status.get('failure')}")
    logs_dir = Path(cluster.layout.node_state) / "logs" / ns
    logs = [p.read_text(errors="replace") for p in logs_dir.glob("*/trainer.log")]
    result = {
        "pods": pods,
        "mode": mode,
        "stood_still_s": round(stood_still(logs), 2),
        "job_s": round(took, 1),
        "attempt": status.get("attempt", 0),
    }
    client.CoreV1Api(api).delete_namespace(ns)
    return result


def table(results: list[dict[str, Any]]) -> str:
    rows = [
        "| pods | in-pod restart: training stood still (s) | recreate: stood still (s) | "
        "recreate / in-pod |",
        "| --- | --- | --- | --- |",
    ]
    for pods in sorted({r["pods"] for r in results}):
        by = {r["mode"]: r["stood_still_s"] for r in results if r["pods"] == pods}
        ratio = by["recreate"] / by["in-pod"] if by.get("in-pod") else float("nan")
        rows.append(f"| {pods} | {by['in-pod']:.1f} | {by['recreate']:.1f} | {ratio:.2f}x |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.restart_modes", description=__doc__)
    p.add_argument("--pods", default="8,16", help="comma-separated job sizes")
    p.add_argument("--json", type=Path, help="write the figures here")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.pods.split(",") if x]
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-restart-") as tmp:
        work = Path(tmp)
        with local_cluster(work) as cluster:
            api = config.new_client_from_config(config_file=str(cluster.kubeconfig))
            op = Operator(cluster.kubeconfig, "", work / "operator.log", {}, [])
            try:
                for pods in sizes:
                    for mode in MODES:
                        r = run(api, cluster, pods, mode)
                        print(json.dumps(r), flush=True)
                        results.append(r)
            finally:
                op.stop()
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
