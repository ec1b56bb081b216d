"""Summarise py-spy ``--format raw`` profiles (as ``gpu_bench.py --pyspy`` writes them) side by
side: per file, the samples of each thread, and for the main thread the share of samples in
which each function is on the stack (inclusive), the functions with the largest shares first.

    python bench/pyspy_summary.py PROFILE.txt ... [--top 40]

Comparing a bare torchrun rank with a pod's shows where the pod's extra time goes.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from pathlib import Path

_LINE = re.compile(r"^(?P<stack>.*) (?P<count>\d+)$")
_THREAD = re.compile(r"^thread \((?P<tid>\w+)\)(?:: (?P<name>.*))?$")
_FRAME = re.compile(r"^(?P<func>.*?) \((?P<where>[^()]*)(?::\d+)?\)$")


def _function(frame: str) -> str:
    """``f (path/file.py:12)`` -> ``f (file.py)``; native ``0x... (lib.so)`` -> ``(lib.so)``."""
    m = _FRAME.match(frame)
    if m is None:
        return frame
    where = m["where"].rsplit(":", 1)[0].rsplit("/", 1)[-1]
    func = m["func"]
    return f"({where})" if func.startswith("0x") else f"{func} ({where})"


def summarise(path: Path, top: int) -> list[str]:
    threads: Counter[str] = Counter()
    main_total = 0
    inclusive: Counter[str] = Counter()
    leaf: Counter[str] = Counter()
    for line in path.read_text(errors="replace").splitlines():
        m = _LINE.match(line.strip())
        if m is None:
            continue
        frames, count = m["stack"].split(";"), int(m["count"])
        t = _THREAD.match(frames[0])
        name = (t["name"] or t["tid"]) if t else "?"
        threads[name] += count
        if name != "MainThread":
            continue
        main_total += count
        funcs = [_function(f) for f in frames[1:]]
        for f in set(funcs):
            inclusive[f] += count
        if funcs:
            leaf[funcs[-1]] += count
    out = [f"== {path.name}: {sum(threads.values())} samples"]
    out.append("  threads: " + ", ".join(f"{n} {c}" for n, c in threads.most_common()))
    if main_total:
        out.append(f"  MainThread, inclusive share of {main_total} samples:")
        out += [f"    {c / main_total:6.1%}  {f}" for f, c in inclusive.most_common(top)]
        out.append("  MainThread, leaf share:")
        out += [f"    {c / main_total:6.1%}  {f}" for f, c in leaf.most_common(top // 2)]
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("profiles", nargs="+", type=Path)
    p.add_argument("--top", type=int, default=40)
    args = p.parse_args()
    for path in args.profiles:
        print("\n".join(summarise(path, args.top)))


if __name__ == "__main__":
    main()
