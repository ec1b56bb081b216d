"""Hostile pods: what 1,000 pods answering hostile 64 KiB bodies cost the operator's memory, and
whether they slow another job's status.

    LOCALKUBE_BIN=$(cat /work/logs/bin.path) PYTHONPATH=operator:cluster:. \\
        .venv/bin/python -m bench.hostile_pods --jobs 125 --nodes 8 --window 120

On the KWOK cluster of bench/scale, `--jobs` hostile jobs of `--nodes` pods (namespace
`hostile`) and one victim job of `--victim-nodes` pods (namespace `victim`). As in
bench/progress_cost.py, every status read goes to a stub server in this process
(TORCHRUN_OPERATOR_STATUS_ADDRESS, benchmarks only), which answers for the pod whose IP is the
read's Host. Two runs on the same cluster and jobs, each with a fresh operator process:

* `hostile` (first: its operator also creates every pod): each hostile pod answers one of
  SHAPES, chosen by its name, every body 64 KiB (podinput.MAX_ANSWER_BYTES) and carrying the
  pod's true binding (rdzvId, index), so that nothing but its content refuses it; the victim's
  pods answer a well-formed rank map and a step that advances every second;
* `baseline`: every pod, hostile jobs' included, answers well-formed, as the victim does.

Each run waits until every job is Running, lets `--settle` seconds pass, then measures over
`--window` seconds: the operator's CPU, its RSS at the end and its peak (VmHWM, the whole
process life), the stub's reads, and the victim's status lag: for every second k of the window
(the victim's step becomes k at T0 + k), the time until the victim job's `status.progress.step`
is k or more, as the benchmark's own watch (bench/scale's Recorder, its clock on arrival) sees
it. The lag is mostly the read interval (every pod every 15 s or more, more with 1,000 pods:
kube/rankmap.py's rate budget), so what matters is the ratio hostile / baseline.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import zlib
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client
from localkube.testing import create_namespace
from torchrun_operator.api.names import API_VERSION, GROUP, PLURAL, VERSION
from torchrun_operator.api.status_names import ConditionType
from torchrun_operator.kube.statusread import READ_TIMEOUT_SECONDS
from torchrun_operator.reconcile.podinput import MAX_ANSWER_BYTES

from bench import progress_cost
from bench.progress_cost import PODS, Measured, PodId, Stub, StubServer, rss_mib, well_formed
from bench.scale.figures import percentile
from bench.scale.harness import Recorder, create_raw, parallel, wait
from bench.scale.operators import proc_cpu_seconds as cpu_seconds
from bench.scale.run import Bench, machine
from bench.scale.workloads import OURS, OURS_JOB_LABEL, Workload, ours_job

HOSTILE_NS, VICTIM_NS = "hostile", "victim"
SHAPES = ("wide", "deep", "sentinel", "nan", "slow")
# A slow answer holds the connection this long before its body: past the reader's timeout.
SLOW_SECONDS = 3 * READ_TIMEOUT_SECONDS
SENTINEL_STEP = 2**64 - 1  # 18446744073709551615


def shape_of(pod: PodId) -> str:
    return SHAPES[zlib.crc32(f"{pod.job}/{pod.index}".encode()) % len(SHAPES)]


def _fill(head: str, unit: str, tail: str) -> bytes:
    """head + unit * n + tail, n as large as fits in MAX_ANSWER_BYTES."""
    n = (MAX_ANSWER_BYTES - len(head) - len(tail)) // len(unit)
    return (head + unit * n + tail).encode()


def hostile_body(shape: str, pod: PodId, now: float) -> bytes:
    """A 64 KiB answer of `shape` carrying the pod's binding."""
    bind = f'{{"v":1,"rdzvId":{json.dumps(pod.rdzv_id)},"index":{pod.index},'
    if shape in ("wide", "slow"):  # 64 KiB of tiny objects: the most objects per byte
        return _fill(bind + '"x":[', "{},", "{}]}")
    if shape == "deep":
        n = (MAX_ANSWER_BYTES - len(bind) - len('"x":}')) // 2
        return (bind + '"x":' + "[" * n + "]" * n + "}").encode()
    data = well_formed(pod, now, progress=True)
    if shape == "sentinel":
        data["progress"]["step"] = SENTINEL_STEP
        text = json.dumps(data)
    else:  # nan: json.dumps writes NaN, as a careless launcher would
        data["progress"]["stepsPerSecond"] = float("nan")
        text = json.dumps(data)
    return _fill(text[:-1] + ',"pad":"', "x", '"}')


class Hostile:
    on = True
    answered: dict[str, int] = dict.fromkeys([*SHAPES, "well-formed"], 0)


def answer(handler: Stub, pod: PodId, now: float) -> None:
    if pod.namespace != HOSTILE_NS or not Hostile.on:
        with Stub.lock:
            Hostile.answered["well-formed"] += 1
        handler.send_body(json.dumps(well_formed(pod, now, progress=True)).encode())
        return
    shape = shape_of(pod)
    with Stub.lock:
        Hostile.answered[shape] += 1
    body = hostile_body(shape, pod, now)
    if shape != "slow":
        handler.send_body(body)
        return
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.flush()
    time.sleep(SLOW_SECONDS)
    handler.wfile.write(body)  # the reader gave up long ago: a broken pipe, not printed


class StepRecorder(Recorder):
    """bench/scale's watch of a namespace, keeping each job observation's progress step."""

    def __init__(self, api: client.ApiClient, ns: str) -> None:
        super().__init__(api, ns, OURS, OURS_JOB_LABEL)
        self.steps: list[tuple[float, int]] = []

    def _on_job(self, t: float, event: str, obj: dict[str, Any]) -> None:
        step = ((obj.get("status") or {}).get("progress") or {}).get("step")
        if isinstance(step, int):
            self.steps.append((t, step))


def step_lags(
    steps: list[tuple[float, int]], t0: float, start: float, end: float
) -> tuple[list[float], int]:
    """For each step k that the stub began answering within [start, end] (at t0 + k), how long
    until an observation of the job's status says k or more; and how many never did. Pure."""
    lags: list[float] = []
    missed = 0
    k = int(start - t0) + 1
    while t0 + k <= end:
        at = t0 + k
        hit = next((t for t, s in steps if t >= at and s >= k), None)
        if hit is None:
            missed += 1
        else:
            lags.append(hit - at)
        k += 1
    return lags, missed


def jobs_of(api: client.ApiClient, ns: str) -> list[dict[str, Any]]:
    listed: Any = client.CustomObjectsApi(api).list_namespaced_custom_object(
        GROUP, VERSION, ns, PLURAL
    )
    return list(listed["items"])


def refused_jobs(api: client.ApiClient, ns: str) -> int:
    """Jobs whose status says some pod's input was refused (PodInputRejected True)."""
    n = 0
    for j in jobs_of(api, ns):
        conds = (j.get("status") or {}).get("conditions") or []
        n += any(
            c.get("type") == ConditionType.POD_INPUT_REJECTED and c.get("status") == "True"
            for c in conds
        )
    return n


def one_run(
    bench: Bench, label: str, stub: str, jobs: dict[str, int], args: argparse.Namespace
) -> dict[str, Any]:
    api = bench.api
    Hostile.on = label == "hostile"
    rec = StepRecorder(api, VICTIM_NS)
    rec.start()
    op = Measured(bench.cluster, bench.workdir / "operators", bench.bins, bench.workers)
    op.extra_env = {"TORCHRUN_OPERATOR_STATUS_ADDRESS": stub}
    op.start()
    assert op.proc is not None
    started = time.monotonic()
    if label == "hostile":  # the first run creates the jobs; the second finds them
        for ns, w in ((VICTIM_NS, args.victim), (HOSTILE_NS, args.hostile)):
            path = f"/apis/{API_VERSION}/namespaces/{ns}/{PLURAL}"
            parallel(
                [(path, ours_job(w, n)) for n in w.job_names()], lambda pj: create_raw(api, *pj)
            )

    def running() -> bool:
        rec.check()
        for ns, count in jobs.items():
            items = jobs_of(api, ns)
            if len(items) != count or any(
                (j.get("status") or {}).get("phase") != "Running" for j in items
            ):
                return False
        return True

    wait(f"{label}: every job Running", running, args.timeout, 2.0)
    to_running = time.monotonic() - started
    time.sleep(args.settle)  # the first reads of every pod and their status writes
    reads0, answered0 = Stub.reads, dict(Hostile.answered)
    cpu0, start = cpu_seconds(op.proc.pid), time.time()
    time.sleep(args.window)
    end = time.time()
    cpu1, reads1 = cpu_seconds(op.proc.pid), Stub.reads
    rss, peak = rss_mib(op.proc.pid)
    # The last steps of the window reach the status within a read interval or two.
    last = int(end - progress_cost.T0)
    try:
        wait(
            f"{label}: the victim's status at step {last}",
            lambda: rec.check() and any(s >= last for _, s in rec.steps),
            args.timeout,
            1.0,
        )
    except Exception as e:  # noqa: BLE001 - the missed steps are counted, and said
        print(f"{label}: {e}", file=sys.stderr)
    refused = refused_jobs(api, HOSTILE_NS)
    rss_after, peak_after = rss_mib(op.proc.pid)
    op.stop()
    rec.stop()
    lags, missed = step_lags(list(rec.steps), progress_cost.T0, start, end)
    window = end - start
    return {
        "run": label,
        "pods": sum(w.pods for w in (args.victim, args.hostile)),
        "to_running_s": round(to_running, 1),
        "cpu_pct": round(100 * (cpu1 - cpu0) / window, 1),
        "reads_per_s": round((reads1 - reads0) / window, 1),
        "answers": {k: v - answered0[k] for k, v in Hostile.answered.items() if v > answered0[k]},
        "rss_mib": round(rss, 1),
        "peak_rss_mib": round(max(peak, peak_after), 1),
        "rss_end_mib": round(rss_after, 1),
        "victim_lag_p50_s": _round(percentile(lags, 50)),
        "victim_lag_p95_s": _round(percentile(lags, 95)),
        "victim_lag_max_s": _round(max(lags) if lags else None),
        "victim_lag_samples": len(lags),
        "victim_lag_missed": missed,
        "hostile_jobs_refused": refused,
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def summary(runs: dict[str, dict[str, Any]], limit: float) -> dict[str, Any]:
    h, b = runs["hostile"], runs["baseline"]

    def ratio(key: str) -> float | None:
        return round(h[key] / b[key], 2) if h[key] is not None and b[key] else None

    return {
        "peak_rss_mib": h["peak_rss_mib"],
        "peak_rss_limit_mib": limit,
        "peak_rss_under_limit": h["peak_rss_mib"] < limit,
        "victim_lag_p50_ratio": ratio("victim_lag_p50_s"),
        "victim_lag_p95_ratio": ratio("victim_lag_p95_s"),
    }


FIELDS = [
    ("pods", "pods"),
    ("to_running_s", "create/adopt -> every job Running (s)"),
    ("cpu_pct", "operator CPU over the window (% of a core)"),
    ("reads_per_s", "pod reads/s"),
    ("rss_mib", "RSS at the window's end (MiB)"),
    ("peak_rss_mib", "peak RSS, VmHWM (MiB)"),
    ("victim_lag_p50_s", "victim step -> status, p50 (s)"),
    ("victim_lag_p95_s", "victim step -> status, p95 (s)"),
    ("victim_lag_max_s", "victim step -> status, max (s)"),
    ("victim_lag_samples", "victim lag samples"),
    ("victim_lag_missed", "victim steps never in status"),
    ("hostile_jobs_refused", "hostile jobs saying PodInputRejected"),
]


def markdown(runs: dict[str, dict[str, Any]]) -> str:
    lines = ["| figure | hostile | baseline |", "| --- | --- | --- |"]
    for key, text in FIELDS:
        lines.append(f"| {text} | {runs['hostile'][key]} | {runs['baseline'][key]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.hostile_pods", description=__doc__)
    p.add_argument("--jobs", type=int, default=125, help="hostile jobs")
    p.add_argument("--nodes", type=int, default=8, help="pods per hostile job")
    p.add_argument("--victim-nodes", type=int, default=8)
    p.add_argument("--window", type=float, default=120.0, help="seconds measured per run")
    p.add_argument("--settle", type=float, default=30.0, help="seconds before the window")
    p.add_argument("--timeout", type=float, default=900.0, help="for each wait")
    p.add_argument("--workers", type=int, default=16)
    p.add_argument("--rss-limit", type=float, default=200.0, help="MiB; exit 1 above it")
    p.add_argument("--out", type=Path, help="also write the results as JSON here")
    args = p.parse_args(argv)
    # Pods stay Running for the whole benchmark.
    args.hostile = Workload(HOSTILE_NS, jobs=args.jobs, nodes=args.nodes, run_seconds=36000)
    args.victim = Workload(VICTIM_NS, jobs=1, nodes=args.victim_nodes, run_seconds=36000)
    Stub.answer = staticmethod(answer)  # type: ignore[method-assign]
    server = StubServer(("127.0.0.1", 0), Stub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stub = f"127.0.0.1:{server.server_address[1]}"
    workdir = Path(tempfile.mkdtemp(prefix="hostile-pods-"))
    bench = Bench(workdir, [OURS], args.workers, lambda m: print(m, file=sys.stderr))
    started = time.time()
    runs: dict[str, dict[str, Any]] = {}
    try:
        bench.up(args.hostile.pods + args.victim.pods)  # one 8-GPU pod per fake node
        PODS.api = bench.api
        for ns in (HOSTILE_NS, VICTIM_NS):
            create_namespace(bench.api, ns)
        jobs = {HOSTILE_NS: args.jobs, VICTIM_NS: 1}
        for label in ("hostile", "baseline"):
            runs[label] = one_run(bench, label, stub, jobs, args)
            print(json.dumps(runs[label]), file=sys.stderr, flush=True)
    finally:
        bench.down()
        server.shutdown()
    result: dict[str, Any] = {
        "meta": {
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": machine(),
            "total_s": round(time.time() - started),
            "argv": sys.argv[1:] if argv is None else argv,
        },
        "runs": runs,
        "summary": summary(runs, args.rss_limit),
    }
    print(markdown(runs))
    print(json.dumps(result["summary"]))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["summary"]["peak_rss_under_limit"] else 1


if __name__ == "__main__":
    sys.exit(main())
