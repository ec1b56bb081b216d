"""Training that saves checkpoints and resumes from them (docs/progress.md, "Checkpoints").

With spec.checkpoint the operator mounts the same storage in every pod at
$TORCHRUN_OPERATOR_CHECKPOINT_DIR. Every --save-every steps, and when the pod is told to stop
(SIGTERM: suspension, preemption, deletion), global rank 0 saves there and reports the
checkpoint in $TORCHRUN_OPERATOR_PROGRESS_FILE; the job's status.lastCheckpoint shows it.
Every pod started after that (a gang restart, an elastic replacement, a resume after
suspension, torchrun's in-pod restart) has $TORCHRUN_OPERATOR_RESUME_FROM, and the script
loads it instead of starting from step 0.

Across attempts (docs/progress.md, "Checkpoints across attempts"): the pods of an earlier
attempt may still run on a partitioned node, writing to the same storage. So every file is
named with the attempt ($TORCHRUN_OPERATOR_ATTEMPT): step N of attempt A is `step-N.aA.pt`,
written under a temporary name of the attempt, rank and process, renamed into place, and then
completed by its marker `step-N.aA.pt.complete` (its size and sha256). Only a checkpoint with
its marker, matching the file, is resumed from; a torn one (no marker, or not the file the
marker describes) is skipped for the newest complete one at or before its step.

    torchrun --nproc-per-node 2 train_checkpoint.py --steps 100 --save-every 10
    ... --step-log /ckpt/steps.log   # rank 0 appends each step it trains (tests read it)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import signal
import socket
import sys
import time
from collections.abc import Callable
from typing import BinaryIO

import torch
import torch.distributed as dist
from torch import nn
from torchrun_example import init, write_progress


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--save-every", type=int, default=10)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (demos)")
    p.add_argument("--step-log", default="", help="file rank 0 appends each step to")
    return p.parse_args()


MARKER = ".complete"  # the suffix of a checkpoint's completion marker
_NAME = re.compile(r"step-(\d+)\.a(\d+)\.pt")


def _fsync_dir(directory: str) -> None:
    """Make a rename in `directory` durable (NFS and local filesystems alike)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(tmp: str, path: str, write: Callable[[BinaryIO], object]) -> None:
    """Write `tmp` with `write(fp)`, flush it to storage, rename it to `path`."""
    with open(tmp, "wb") as fp:
        write(fp)
        fp.flush()
        os.fsync(fp.fileno())
    os.replace(tmp, path)  # atomic: a reader sees the old name's file or the whole new one


def _digest(path: str) -> tuple[int, str]:
    h = hashlib.sha256()
    with open(path, "rb") as fp:
        for chunk in iter(lambda: fp.read(1 << 20), b""):
            h.update(chunk)
    return os.path.getsize(path), h.hexdigest()


def save(directory: str, step: int, attempt: int, rank: int, state: dict[str, object]) -> str:
    """The checkpoint of `step` by this attempt, written whole or not at all: the file under
    a name of this attempt, rank and process (no other writer ever opens it), renamed to the
    attempt's own name (another attempt's checkpoint of the same step is another file), then
    its completion marker. Returns the checkpoint's path."""
    path = os.path.join(directory, f"step-{step}.a{attempt}.pt")
    unique = f"a{attempt}.r{rank}.{socket.gethostname()}.{os.getpid()}.tmp"
    _write(f"{path}.{unique}", path, lambda fp: torch.save(state, fp))
    size, sha256 = _digest(path)
    marker = {"step": step, "attempt": attempt, "size": size, "sha256": sha256}
    _write(
        f"{path}{MARKER}.{unique}", path + MARKER, lambda fp: fp.write(json.dumps(marker).encode())
    )
    _fsync_dir(directory)
    return path


def complete(path: str) -> bool:
    """Whether `path` is a complete checkpoint: its marker is there and describes the file
    (its size and sha256), so a torn file, or one replaced after the marker, is not."""
    try:
        with open(path + MARKER, encoding="utf-8") as fp:
            marker = json.load(fp)
        return isinstance(marker, dict) and [marker.get("size"), marker.get("sha256")] == list(
            _digest(path)
        )
    except (OSError, ValueError):
        return False


def resume_path(directory: str, told: str) -> str | None:
    """The checkpoint to resume from when told `told` ($TORCHRUN_OPERATOR_RESUME_FROM): it,
    when complete; else the newest complete checkpoint in `directory` at or before its step
    (a later one was never reported); None: start from step 0."""
    if not told:
        return None
    if complete(told):
        return told
    found = _NAME.fullmatch(os.path.basename(told))
    limit = int(found.group(1)) if found else -1
    candidates = []
    for name in os.listdir(directory) if directory and os.path.isdir(directory) else []:
        m = _NAME.fullmatch(name)
        if m and int(m.group(1)) <= limit:
            candidates.append((int(m.group(1)), int(m.group(2)), os.path.join(directory, name)))
    for _, _, path in sorted(candidates, reverse=True):
        if complete(path):
            return path
    return None


def agreed(chosen: str | None, told: str, directory: str, device: torch.device) -> str | None:
    """Rank 0's `chosen` checkpoint on every rank, so that all of them load the same one
    (each rank's own look at the storage could differ while another writer is at work). Sent
    as numbers, [0] none, [1] `told`, [2, step, attempt] step-<step>.a<attempt>.pt:
    broadcast_object_list needs numpy, which an image with torch may lack."""
    found = _NAME.fullmatch(os.path.basename(chosen)) if chosen and chosen != told else None
    sent = [2, int(found.group(1)), int(found.group(2))] if found else [1 if chosen else 0, 0, 0]
    code = torch.tensor(sent, dtype=torch.int64, device=device)
    dist.broadcast(code, src=0)
    kind, step, attempt = (int(v) for v in code.tolist())
    if kind == 2:
        return os.path.join(directory, f"step-{step}.a{attempt}.pt")
    return told if kind == 1 else None


def main() -> None:
    args = parse_args()
    directory = os.environ.get("TORCHRUN_OPERATOR_CHECKPOINT_DIR", "")
    attempt = int(os.environ.get("TORCHRUN_OPERATOR_ATTEMPT", "0"))
    told = os.environ.get("TORCHRUN_OPERATOR_RESUME_FROM", "")
    # Save on SIGTERM: note it, finish the step, save, exit. The pod has the grace period
    # (terminationGracePeriodSeconds) before SIGKILL; a save must fit in it.
    stop = [False]
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.__setitem__(0, True))

    device, _, local_rank = init()
    rank = dist.get_rank()
    torch.manual_seed(1234)  # same initial weights everywhere
    model = nn.Linear(16, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start, checkpoint = 0, None
    resume = agreed(resume_path(directory, told) if rank == 0 else None, told, directory, device)
    if told and resume != told and rank == 0:
        print(f"{told} is incomplete: resuming from {resume or 'step 0'}", flush=True)
    if resume:
        state = torch.load(resume, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = int(state["step"])
        checkpoint = {"step": start, "path": resume}
        if rank == 0:
            print(f"resumed from {resume} at step {start}", flush=True)
    ddp = nn.parallel.DistributedDataParallel(model)
    g = torch.Generator().manual_seed(1234 + rank)
    true_w = torch.randn(16, 1, generator=torch.Generator().manual_seed(1234))
    log = open(args.step_log, "a") if args.step_log and rank == 0 else None  # noqa: SIM115
    if log is not None:
        log.write(f"start {start}\n")
        log.flush()
    for step in range(start + 1, args.steps + 1):
        x = torch.randn(32, 16, generator=g)
        opt.zero_grad(set_to_none=True)
        nn.functional.mse_loss(ddp(x.to(device)), (x @ true_w).to(device)).backward()
        opt.step()
        if log is not None:
            log.write(f"{step}\n")
            log.flush()
        # Every rank stops at the same step: any rank told to stop stops them all.
        stopping = torch.tensor([1.0 if stop[0] else 0.0])
        dist.all_reduce(stopping, op=dist.ReduceOp.MAX)
        if directory and (step % args.save_every == 0 or stopping.item()):
            if rank == 0:
                state = {"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}
                checkpoint = {"step": step, "path": save(directory, step, attempt, rank, state)}
            dist.barrier()  # nobody exits before rank 0's checkpoint is complete
        if local_rank == 0:
            write_progress(step, checkpoint if rank == 0 else None)
        if stopping.item():
            if rank == 0:
                print(f"SIGTERM: saved step {step}, exiting", flush=True)
            dist.destroy_process_group()
            sys.exit(143)  # stopped, not done: 128 + SIGTERM
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if rank == 0:
        print(f"done: {args.steps} steps", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
