"""What the worker shim costs a script's main thread, without GPUs, torchrun or DDP: the
loader-bound MNIST pipeline (gpu_ddp_mnist.py's FakeData stand-in, batches of 100, no loader
workers) timed in CPU seconds of the main thread, in processes started three ways, one after
the other, the order rotating every repeat:

* ``python``: ``python -u script`` (what bare torchrun starts);
* ``shim``: the launcher's worker entry (``launcher.worker_entry_args``), as the agent in a
  pod starts it;
* ``base``: ``python -u <--base-launcher> --worker python script``, the worker entry before
  the fix (bench/README.md).

    PYTHONPATH=operator python bench/shim_cost.py --base-launcher old-launcher.py --repeats 8

CPU time of the main thread, not wall time: it leaves out the time a busy machine runs other
processes, which on a shared machine is most of the noise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
from torchrun_operator.launcher import launcher as L  # noqa: E402

PROBE = """
import json, os, sys, time
sys.path.insert(0, {bench!r})
from gpu_ddp_mnist import SyntheticMnist
from torch.utils.data import DataLoader

def main():
    loader = DataLoader(SyntheticMnist({samples}), batch_size=100, num_workers=0)
    for _ in loader:  # warm-up
        break
    t = time.thread_time()
    for _ in loader:
        pass
    print(json.dumps({{"cpu_s": time.thread_time() - t}}))

if __name__ == "__main__":
    main()
"""


def run(argv: list[str], workdir: Path) -> float:
    env = {**os.environ, "LOCAL_RANK": "0", L.ENV_STATE_DIR: str(workdir / "state")}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=600)
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    return float(json.loads(line)["cpu_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=5000)
    p.add_argument("--repeats", type=int, default=8)
    p.add_argument("--base-launcher", type=Path, help="the launcher.py to compare against")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shim-cost-"))
    script = work / "probe.py"
    script.write_text(PROBE.format(bench=str(ROOT / "bench"), samples=args.samples))
    py = sys.executable
    ways = {
        "python": [py, "-u", str(script)],
        "shim": [py, *L.worker_entry_args(["python", str(script)])],
    }
    if args.base_launcher is not None:
        ways["base"] = [py, "-u", str(args.base_launcher), "--worker", "python", str(script)]
    names = list(ways)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            times[n].append(run(ways[n], work))
        print(f"# repeat {r}: " + ", ".join(f"{n} {times[n][-1]:.3f}" for n in names))
    for n in names[1:]:
        logs = [math.log(a / b) for a, b in zip(times[n], times["python"], strict=True)]
        m, sd = statistics.fmean(logs), statistics.stdev(logs)
        half = 1.96 if len(logs) > 30 else [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365,
                                             2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
                                             2.131][min(len(logs) - 2, 14)]  # fmt: skip
        half *= sd / math.sqrt(len(logs))
        print(
            f"{n}/python, main thread CPU s: geometric mean {math.exp(m):.4f}, 95% interval "
            f"{math.exp(m - half):.4f}-{math.exp(m + half):.4f} ({len(logs)} pairs; medians "
            f"{statistics.median(times[n]):.3f} / {statistics.median(times['python']):.3f} s)"
        )


if __name__ == "__main__":
    main()
