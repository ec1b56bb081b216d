"""The launcher's state dir (an emptyDir) and the small files in it: the workers' rank
files, `ready`, `stalled`; compact JSON and atomic writes.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

from .contract import ENV_STATE_DIR, READY_FILE, STALLED_FILE, STATE_DIR
from .logline import log


def compact_json(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


def json_size(obj: Any) -> int:
    return len(compact_json(obj).encode("utf-8"))


def state_dir() -> str:
    return os.environ.get(ENV_STATE_DIR) or STATE_DIR


def write_atomic(path: str, data: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fp:
        fp.write(data)
    os.replace(tmp, path)


def reset_state_dir(path: str) -> None:
    """Forget a previous container's state: the emptyDir survives container restarts."""
    try:
        os.makedirs(path, exist_ok=True)
        for name in os.listdir(path):
            if name in (READY_FILE, STALLED_FILE) or (
                name.startswith(("rank-", "stacks-")) and name.endswith((".json", ".txt"))
            ):
                os.remove(os.path.join(path, name))
    except OSError as e:
        log("cannot prepare state dir", path=path, error=e)


def read_rank_files(path: str) -> list[dict[str, Any]]:
    """Rank files of the last round this node ran (highest restart count)."""
    records: list[dict[str, Any]] = []
    try:
        names = os.listdir(path)
    except OSError:
        return records
    for name in names:
        if name.startswith("rank-") and name.endswith(".json"):
            try:
                with open(os.path.join(path, name)) as fp:
                    records.append(json.load(fp))
            except (OSError, ValueError):
                continue
    if not records:
        return records
    last = max(int(r.get("restartCount", 0)) for r in records)
    return [r for r in records if int(r.get("restartCount", 0)) == last]


def read_text(path: str) -> str | None:
    try:
        with open(path) as fp:
            return fp.read()
    except OSError:
        return None


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def rank_info(sdir: str, fallback_ranks: Sequence[int]) -> tuple[int | None, list[int], int]:
    records = read_rank_files(sdir)
    group_ranks = {int(r.get("groupRank", -1)) for r in records} - {-1}
    group_rank = group_ranks.pop() if len(group_ranks) == 1 else None
    ranks = sorted({int(r["rank"]) for r in records if int(r.get("rank", -1)) >= 0})
    if not ranks:
        ranks = sorted(int(r) for r in fallback_ranks)
    restarts = max((int(r.get("restartCount", 0)) for r in records), default=0)
    return group_rank, ranks, restarts
