"""What the live rank map and progress cost the operator: CPU and memory with many running jobs
whose pods report progress, against the same jobs with the reader off.

    LOCALKUBE_BIN=$(cluster/build.sh all) PYTHONPATH=operator:cluster \\
        .venv/bin/python -m bench.progress_cost --jobs 100 --nodes 8 --window 120

On the benchmark's KWOK cluster (bench/scale: a real control plane, fake nodes, no kubelet) the
pods run nothing, so no launcher answers on their IPs. The operator is therefore pointed at a
stub status server in this process (TORCHRUN_OPERATOR_STATUS_ADDRESS, benchmarks only): every
read of every pod goes to it, over TCP on the loopback, with the pod's IP as its Host, and it
answers as that pod's launcher does: the pod's binding (rdzvId, index: the stub finds the pod
by its IP in a list of the cluster's pods), a rank map and a step that advances every second.
So what is measured is everything the operator does for the feature (the read schedule, one
HTTP request per pod read, parsing, reconciling the answers, the status writes they cause), but
not the network between the operator and the pods, nor the launchers' side (a thread per pod
serving a few requests a minute).

Three runs, each with a fresh operator process and a fresh namespace, 100 jobs of 8 pods:

* `off`: TORCHRUN_OPERATOR_LIVE_STATUS=0, no reader (the operator before this feature);
* `rank map`: the reader on, the stub answers a rank map and no progress: the status changes
  once per pod;
* `progress`: the reader on, the stub answers a rank map and an advancing step: every read of a
  pod changes its entry, so every sweep of a job writes its status.

Each run waits until every job is Running and the first reads are in, then measures the
operator's CPU seconds (utime + stime from /proc) and status writes over `--window` seconds, and
its resident memory at the end (VmRSS) and at its peak (VmHWM).
"""

from __future__ import annotations

import argparse
import http.server
import json
import re
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from localkube.testing import create_namespace
from torchrun_operator.api import names
from torchrun_operator.api.names import API_VERSION, GROUP, PLURAL, VERSION

from bench.scale.harness import create_raw, parallel, raw, wait
from bench.scale.operators import Ours, proc_cpu_seconds
from bench.scale.run import Bench
from bench.scale.workloads import OURS, Workload, ours_job

T0 = time.time()


@dataclass(frozen=True)
class PodId:
    """Who a read is for: what the operator checks an answer's binding against."""

    namespace: str
    job: str
    index: int
    rdzv_id: str


class Pods:
    """The benchmark's pods by IP (kube/rankmap.py sends the pod's IP as the Host of every
    read when TORCHRUN_OPERATOR_STATUS_ADDRESS is set), listed again when an IP is unknown,
    at most once a second."""

    def __init__(self) -> None:
        self.api: client.ApiClient | None = None
        self._by_ip: dict[str, PodId] = {}
        self._listed = 0.0
        self._lock = threading.Lock()

    def find(self, ip: str) -> PodId | None:
        got = self._by_ip.get(ip)
        if got is not None or self.api is None:
            return got
        with self._lock:
            if ip not in self._by_ip and time.monotonic() - self._listed > 1.0:
                self._by_ip = self._list()
                self._listed = time.monotonic()
            return self._by_ip.get(ip)

    def _list(self) -> dict[str, PodId]:
        assert self.api is not None
        query = [("labelSelector", names.LABEL_INDEX)]
        pods = json.loads(raw(self.api, "GET", "/api/v1/pods", query).data)["items"]
        out = {}
        for pod in pods:
            meta, ip = pod["metadata"], (pod.get("status") or {}).get("podIP")
            labels = meta.get("labels") or {}
            owner = [o for o in meta.get("ownerReferences") or [] if o.get("controller")]
            if not ip or not owner or names.LABEL_ATTEMPT not in labels:
                continue
            out[ip] = PodId(
                meta["namespace"],
                labels.get(names.LABEL_JOB_NAME, ""),
                int(labels[names.LABEL_INDEX]),
                names.rdzv_id(owner[0]["uid"], int(labels[names.LABEL_ATTEMPT])),
            )
        return out


PODS = Pods()


def well_formed(pod: PodId, now: float, progress: bool) -> dict[str, Any]:
    """A launcher's answer for `pod` (docs/pod-contract.md): its binding, a rank map and, with
    `progress`, a step that advances every second."""
    data: dict[str, Any] = {
        "v": 1,
        "rdzvId": pod.rdzv_id,
        "index": pod.index,
        "state": "Training",
        "round": 0,
        "groupRank": pod.index,
        "groupWorldSize": 8,
        "ranks": list(range(8 * pod.index, 8 * pod.index + 8)),
        "restarts": 0,
        "rendezvousAt": T0,
        "time": now,
    }
    if progress:
        step = int(now - T0)
        data["progress"] = {
            "step": step,
            "total": 100000,
            "stepsPerSecond": 1.0,
            "stepSeconds": 1.0,
            "lastStepAt": T0 + step,
            "windowSeconds": 60,
            "windowFull": True,
        }
    return data


class Stub(http.server.BaseHTTPRequestHandler):
    """Answers GET /status for the pod whose IP is the request's Host, as that pod's
    launcher does; `answer` may be replaced (bench/hostile_pods.py)."""

    progress = True
    reads = 0
    lock = threading.Lock()

    @staticmethod
    def answer(handler: Stub, pod: PodId, now: float) -> None:
        handler.send_body(json.dumps(well_formed(pod, now, Stub.progress)).encode())

    def do_GET(self) -> None:  # noqa: N802
        with Stub.lock:
            Stub.reads += 1
        pod = PODS.find(self.headers.get("Host", ""))
        if pod is None:  # not listed yet: the operator counts a failed read
            self.send_error(404)
            return
        type(self).answer(self, pod, time.time())

    def send_body(self, body: bytes) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class StubServer(http.server.ThreadingHTTPServer):
    # A pod's launcher gets one read at a time; this one stands for 800 of them, so its
    # listen backlog must take a burst of the reader's parallel connections (the default, 5,
    # makes connects wait for a SYN retransmit, past the reader's 1 s timeout).
    request_queue_size = 256
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a read the operator gave up on (its 1 s timeout): counted, not printed


class Measured(Ours):
    """Our operator with the live status reader configured by `extra_env`."""

    extra_env: dict[str, str] = {}

    def env(self) -> dict[str, str]:
        return {**super().env(), **self.extra_env}


def rss_mib(pid: int) -> tuple[float, float]:
    current = peak = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            current = int(line.split()[1]) / 1024
        elif line.startswith("VmHWM:"):
            peak = int(line.split()[1]) / 1024
    return current, peak


def status_patches(port: int) -> float:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    pattern = r'^torchrun_operator_api_requests_total\{[^}]*verb="patch"[^}]*\} (\S+)$'
    for m in re.finditer(pattern, text, re.M):
        total += float(m.group(1))
    return total


def one_run(bench: Bench, label: str, env: dict[str, str], w: Workload, window: float) -> dict:
    api = bench.api
    ns = f"cost-{label.replace(' ', '-')}"
    create_namespace(api, ns)
    op = Measured(bench.cluster, bench.workdir / "operators", bench.bins, bench.workers)
    op.extra_env = env
    op.start()
    assert op.proc is not None
    path = f"/apis/{API_VERSION}/namespaces/{ns}/{PLURAL}"
    jobs = [ours_job(w, n) for n in w.job_names()]
    parallel(jobs, lambda j: create_raw(api, path, j))
    custom = client.CustomObjectsApi(api)

    def running() -> bool:
        listed: Any = custom.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        items = listed["items"]
        return len(items) == w.jobs and all(
            (j.get("status") or {}).get("phase") == "Running" for j in items
        )

    started = time.monotonic()
    wait(f"{ns}: every job Running", running, 600, 1.0)
    to_running = time.monotonic() - started
    time.sleep(30)  # the first reads of every pod, and their status writes, settle
    cpu0, patches0, reads0 = proc_cpu_seconds(op.proc.pid), status_patches(op.port), Stub.reads
    time.sleep(window)
    cpu1, patches1, reads1 = proc_cpu_seconds(op.proc.pid), status_patches(op.port), Stub.reads
    rss, peak = rss_mib(op.proc.pid)
    op.stop()
    client.CoreV1Api(api).delete_namespace(ns)
    return {
        "run": label,
        "to_running_s": round(to_running, 1),
        "cpu_s": round(cpu1 - cpu0, 2),
        "cpu_pct": round(100 * (cpu1 - cpu0) / window, 1),
        "status_patches_per_s": round((patches1 - patches0) / window, 2),
        "reads_per_s": round((reads1 - reads0) / window, 1),
        "rss_mib": round(rss, 1),
        "peak_rss_mib": round(peak, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=100)
    p.add_argument("--nodes", type=int, default=8, help="pods per job")
    p.add_argument("--window", type=float, default=120.0, help="seconds measured per run")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--runs", default="off,rank map,progress")
    p.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = p.parse_args()

    server = StubServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stub = f"127.0.0.1:{server.server_address[1]}"
    envs = {
        "off": {"TORCHRUN_OPERATOR_LIVE_STATUS": "0"},
        "rank map": {"TORCHRUN_OPERATOR_STATUS_ADDRESS": stub},
        "progress": {"TORCHRUN_OPERATOR_STATUS_ADDRESS": stub},
    }
    # Pods stay Running for the whole benchmark.
    w = Workload("cost", jobs=args.jobs, nodes=args.nodes, run_seconds=3600)
    workdir = Path(tempfile.mkdtemp(prefix="progress-cost-"))
    bench = Bench(workdir, [OURS], args.workers, lambda m: print(m, file=sys.stderr))
    results = []
    try:
        bench.up(w.pods)  # one 8-GPU pod per fake node
        PODS.api = bench.api
        for label in args.runs.split(","):
            Stub.progress = label == "progress"
            results.append(one_run(bench, label, envs[label], w, args.window))
            print(json.dumps(results[-1]), file=sys.stderr)
            time.sleep(20)  # the namespace's pods go
    finally:
        bench.down()
        server.shutdown()
    header = list(results[0])
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for r in results:
        print("| " + " | ".join(str(r[k]) for k in header) + " |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
