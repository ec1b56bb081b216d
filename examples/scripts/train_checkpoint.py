"""Training that saves checkpoints and resumes from them (docs/progress.md, "Checkpoints").

With spec.checkpoint the operator mounts the same storage in every pod at
$TORCHRUN_OPERATOR_CHECKPOINT_DIR. Every --save-every steps, and when the pod is told to stop
(SIGTERM: suspension, preemption, deletion), global rank 0 saves there and reports the
checkpoint in $TORCHRUN_OPERATOR_PROGRESS_FILE; the job's status.lastCheckpoint shows it.
Every pod started after that (a gang restart, an elastic replacement, a resume after
suspension, torchrun's in-pod restart) has $TORCHRUN_OPERATOR_RESUME_FROM, and the script
loads it instead of starting from step 0.

    torchrun --nproc-per-node 2 train_checkpoint.py --steps 100 --save-every 10
    ... --step-log /ckpt/steps.log   # rank 0 appends each step it trains (tests read it)
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

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


def save(directory: str, step: int, model: nn.Module, opt: torch.optim.Optimizer) -> str:
    """Rank 0's checkpoint of `step`, written whole or not at all."""
    path = os.path.join(directory, f"step-{step}.pt")
    tmp = f"{path}.tmp"
    torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, tmp)
    os.replace(tmp, path)  # a crash mid-save never leaves a torn checkpoint
    return path


def main() -> None:
    args = parse_args()
    directory = os.environ.get("TORCHRUN_OPERATOR_CHECKPOINT_DIR", "")
    resume = os.environ.get("TORCHRUN_OPERATOR_RESUME_FROM", "")
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
                checkpoint = {"step": step, "path": save(directory, step, model, opt)}
            dist.barrier()  # nobody exits before rank 0's checkpoint is whole
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
