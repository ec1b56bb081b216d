"""Summarises py-spy's collapsed stacks (`--profile`): where the operator's CPU went.

Each line of a `--format raw` file is `frame;frame;...;frame count`, outermost first (with
`--threads`, the thread comes first). A function's *own* share counts the samples where it
is the innermost frame; its *total* share the samples where it is anywhere on the stack
(once per sample, however often it recurses). Pure: reads text, returns rows.

    python -m bench.scale.profile FILE [--top N]
"""

from __future__ import annotations

import argparse
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

# py-spy writes a frame as "function (file:line)"; the line varies within one function.
_FRAME = re.compile(r"^(?P<fn>.*?) \((?P<file>[^():]+)(?::\d+)?\)$")
# Prefixes that make paths short enough for a table.
_SITE = re.compile(r"^.*/(site-packages|lib/python3\.\d+|operator)/")


@dataclass(frozen=True)
class Row:
    frame: str
    own: float  # share of all samples, 0..1
    total: float


def frame_name(frame: str) -> str:
    """`fn (path:line)` -> `fn (short/path)`: one name per function, whatever the line."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip()
    return f"{m['fn']} ({_SITE.sub('', m['file'])})"


def parse(text: str) -> list[tuple[list[str], int]]:
    stacks = []
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [frame_name(f) for f in stack.split(";")]
        stacks.append(([f for f in frames if not f.startswith("thread (")], int(count)))
    return stacks


def summarise(text: str) -> tuple[int, list[Row]]:
    """All samples, and one row per function with its own and total share."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    samples = 0
    for frames, count in parse(text):
        samples += count
        if frames:
            own[frames[-1]] += count
        for f in set(frames):
            total[f] += count
    n = max(samples, 1)
    rows = [Row(f, own[f] / n, total[f] / n) for f in total]
    return samples, rows


def top(rows: list[Row], n: int, by: str) -> list[Row]:
    return sorted(rows, key=lambda r: (-getattr(r, by), r.frame))[:n]


def markdown(samples: int, rows: list[Row], n: int = 12) -> str:
    lines = [f"{samples} samples.", "", "| own | total | function |", "| ---: | ---: | --- |"]
    for r in top(rows, n, "own"):
        lines.append(f"| {r.own:.1%} | {r.total:.1%} | `{r.frame}` |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale.profile", description=__doc__)
    p.add_argument("file", type=Path)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--by", choices=["own", "total"], default="own")
    args = p.parse_args(argv)
    samples, rows = summarise(args.file.read_text())
    print(f"{samples} samples")
    for r in top(rows, args.top, args.by):
        print(f"{r.own:6.1%} {r.total:6.1%}  {r.frame}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
