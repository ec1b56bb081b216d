"""What the worker shim costs a script's main thread, without GPUs, torchrun or DDP: the
loader-bound MNIST pipeline (gpu_ddp_mnist.py's FakeData stand-in, which seeds torch's global
generator per sample as FakeData does; batches of 100, no loader workers) in processes started
three ways, one after the other, the order rotating every repeat:

* ``python``: ``python -u script`` (what bare torchrun starts);
* ``shim``: the launcher's worker entry (``shim.worker_entry_args``), as the agent in a
  pod starts it;
* ``base``: ``python -u <--base-launcher> --worker python script``, how the agent started
  workers before the fix (bench/README.md).

    PYTHONPATH=operator python bench/shim_cost.py --base-launcher old-launcher.py --repeats 6

The figure is the mean CPU time (of the main thread) of the fastest tenth of the batches: a busy
machine slows some batches down and none up, so the fastest are the code's own cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "operator"))
sys.path.insert(0, str(ROOT))
from torchrun_operator.launcher import contract, shim  # noqa: E402

from bench.gpu_bench import _ratio_line, ratio_stats  # noqa: E402

PROBE = """
import json, sys, time
sys.path.insert(0, {bench!r})
from gpu_ddp_mnist import SyntheticMnist
from torch.utils.data import DataLoader

def main():
    loader = DataLoader(SyntheticMnist({samples}), batch_size=100, num_workers=0)
    batches = []
    it = iter(loader)
    while True:
        s = time.thread_time()
        try:
            next(it)
        except StopIteration:
            break
        batches.append(time.thread_time() - s)
    best = sorted(batches)[: max(len(batches) // 10, 1)]
    print(json.dumps({{"best_batch_s": sum(best) / len(best)}}))

if __name__ == "__main__":
    main()
"""


def run(argv: list[str], workdir: Path) -> float:
    env = {**os.environ, "LOCAL_RANK": "0", contract.ENV_STATE_DIR: str(workdir / "state")}
    out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True, timeout=600)
    line = [x for x in out.stdout.splitlines() if x.startswith("{")][-1]
    return float(json.loads(line)["best_batch_s"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--repeats", type=int, default=6)
    p.add_argument("--base-launcher", type=Path, help="an old launcher.py to compare against")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shim-cost-"))
    script = work / "probe.py"
    script.write_text(PROBE.format(bench=str(ROOT / "bench"), samples=args.samples))
    py = sys.executable
    ways = {
        "python": [py, "-u", str(script)],
        "shim": [py, *shim.worker_entry_args(["python", str(script)])],
    }
    if args.base_launcher is not None:
        ways["base"] = [py, "-u", str(args.base_launcher), "--worker", "python", str(script)]
    names = list(ways)
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(args.repeats):
        order = names[r % len(names) :] + names[: r % len(names)]
        for n in order:
            times[n].append(run(ways[n], work))
        print(f"# repeat {r}: " + ", ".join(f"{n} {times[n][-1] * 1e3:.2f} ms" for n in names))
    base_median = statistics.median(times["python"]) * 1e3
    for n in names[1:]:
        st = ratio_stats([a / b for a, b in zip(times[n], times["python"], strict=True)])
        median = statistics.median(times[n]) * 1e3
        print(
            f"{n}/python, fastest batches' CPU time: {_ratio_line(st)}; "
            f"medians {median:.2f} / {base_median:.2f} ms"
        )


if __name__ == "__main__":
    main()
