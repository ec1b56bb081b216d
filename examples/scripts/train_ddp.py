"""Tiny, deterministic DDP training on synthetic data: the examples' training script.

Run under torchrun (or the operator's launcher), one process per device:

    torchrun --nproc-per-node 2 train_ddp.py --epochs 4 --checkpoint-dir /ckpt

* backend by device: nccl when CUDA is there (LOCAL_RANK picks the GPU), gloo on CPU;
* DistributedSampler with set_epoch every epoch;
* rank 0 alone logs and writes the checkpoint (after each epoch); the others wait at a barrier;
* resumes from the checkpoint when one exists; seeded, so a resumed run ends with the same
  weights as an uninterrupted one (compare the printed checksum);
* optional progress: the step counter goes to $TORCHRUN_OPERATOR_PROGRESS_FILE;
* --fail-rank R --fail-after-step S raises on global rank R (the fail-rank3 example).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
from torchrun_example import init, write_progress


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--samples", type=int, default=512, help="synthetic dataset size")
    p.add_argument("--batch-size", type=int, default=16, help="per rank")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--checkpoint-dir", default="", help="volume path; empty: no checkpoints")
    p.add_argument(
        "--stop-after-epoch",
        type=int,
        default=0,
        help="exit 0 after saving this epoch (simulates preemption; for tests)",
    )
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument("--fail-after-step", type=int, default=1)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds per step (demos)")
    return p.parse_args()


def synthetic_dataset(n: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    true_w = torch.randn(16, 1, generator=g)
    y = x @ true_w + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)  # same initial weights on every rank, every run
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))


def checksum(model: nn.Module) -> str:
    h = hashlib.sha256()
    for _, t in sorted(model.state_dict().items()):
        # exact bytes: equal checksums mean bit-identical weights (no numpy needed)
        h.update(bytes(t.detach().cpu().contiguous().flatten().view(torch.uint8).tolist()))
    return h.hexdigest()[:16]


def main() -> None:
    args = parse_args()
    device, backend, _ = init()
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.use_deterministic_algorithms(True, warn_only=True)

    model = make_model(args.seed).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start_epoch, step = 0, 0

    ckpt_path = os.path.join(args.checkpoint_dir, "checkpoint.pt") if args.checkpoint_dir else ""
    if ckpt_path and os.path.exists(ckpt_path):
        state = torch.load(ckpt_path, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start_epoch, step = int(state["epoch"]) + 1, int(state["step"])
        if rank == 0:
            print(f"resumed from {ckpt_path} at epoch {start_epoch} step {step}", flush=True)

    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    data = synthetic_dataset(args.samples, args.seed)
    sampler: DistributedSampler[tuple[torch.Tensor, ...]] = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
    loss_fn = nn.MSELoss()
    if rank == 0:
        print(
            f"training: world_size={world} backend={backend} epochs={args.epochs} "
            f"start_epoch={start_epoch}",
            flush=True,
        )

    for epoch in range(start_epoch, args.epochs):
        sampler.set_epoch(epoch)  # a different, but reproducible, shuffle every epoch
        total = torch.zeros(2, device=device)
        for x, y in loader:
            x, y = x.to(device), y.to(device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            step += 1
            total += torch.stack([loss.detach() * len(x), torch.tensor(len(x), device=device)])
            if rank == args.fail_rank and step >= args.fail_after_step:
                raise RuntimeError(f"rank {rank} failed on purpose")
            if args.step_sleep:
                time.sleep(args.step_sleep)
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch} step {step} loss {(total[0] / total[1]).item():.6f}", flush=True)
            write_progress(step)
            if ckpt_path:
                os.makedirs(args.checkpoint_dir, exist_ok=True)
                tmp = ckpt_path + ".tmp"
                torch.save(
                    {
                        "model": model.state_dict(),
                        "optimizer": opt.state_dict(),
                        "epoch": epoch,
                        "step": step,
                    },
                    tmp,
                )
                os.replace(tmp, ckpt_path)  # a crash mid-save never leaves a torn checkpoint
        dist.barrier()  # nobody races ahead of (or exits before) rank 0's checkpoint
        if args.stop_after_epoch and epoch + 1 >= args.stop_after_epoch:
            break

    if rank == 0:
        print(f"final checksum: {checksum(model)} step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
