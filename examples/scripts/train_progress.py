"""Training that reports its progress, so the operator can tell a hung job from a slow one.

Every step, local rank 0 of each pod writes the step counter to
$TORCHRUN_OPERATOR_PROGRESS_FILE (set by the operator; see docs/progress.md). With
`runPolicy.progressTimeoutSeconds`, a pod whose counter stops changing for that long turns
NotReady and the operator restarts the gang (reason ProgressStalled).

The training itself is local SGD on synthetic data: each rank takes local steps and the
ranks average their weights every --sync-every steps (1: every step, like DDP).

    torchrun --nproc-per-node 2 train_progress.py --steps 200
    ... --stall-rank 1 --stall-after-step 3   # global rank 1 hangs after step 3
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch import nn
from torchrun_example import init, write_progress


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--sync-every", type=int, default=1, help="average weights every N steps")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (demos)")
    p.add_argument("--stall-rank", type=int, default=-1, help="this global rank hangs ...")
    p.add_argument("--stall-after-step", type=int, default=0, help="... after this step")
    return p.parse_args()


def average(model: nn.Module, world: int) -> None:
    for p in model.parameters():
        dist.all_reduce(p.data)
        p.data /= world


def main() -> None:
    args = parse_args()
    device, _, local_rank = init()
    rank, world = dist.get_rank(), dist.get_world_size()

    g = torch.Generator().manual_seed(1234 + rank)
    true_w = torch.randn(16, 1, generator=torch.Generator().manual_seed(1234))
    torch.manual_seed(1234)  # same initial weights everywhere
    model = nn.Linear(16, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss = torch.zeros(())
    for step in range(1, args.steps + 1):
        if rank == args.stall_rank and step > args.stall_after_step:
            print(f"rank {rank}: hanging after step {step - 1} (simulated)", flush=True)
            while True:
                time.sleep(3600)
        x = torch.randn(32, 16, generator=g)
        y = x @ true_w
        opt.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
        loss.backward()
        opt.step()
        if args.sync_every > 0 and step % args.sync_every == 0:
            average(model, world)
        if local_rank == 0:
            write_progress(step)
        if rank == 0 and step % 50 == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if args.step_sleep:
            time.sleep(args.step_sleep)
    average(model, world)
    if rank == 0:
        print(f"done: {args.steps} steps, loss {loss.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
