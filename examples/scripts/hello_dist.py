"""Smallest useful distributed script: every rank says where it runs, then one all-reduce.

Shows how to ship your own script to a job through a ConfigMap (examples/configmap-script.yaml).
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
from torchrun_example import init


def main() -> None:
    device, _, local_rank = init()
    rank, world = dist.get_rank(), dist.get_world_size()
    print(
        f"rank {rank}/{world} local_rank {local_rank} group_rank "
        f"{os.environ.get('GROUP_RANK')} on {socket.gethostname()}",
        flush=True,
    )
    t = torch.tensor([float(rank)], device=device)
    dist.all_reduce(t)
    expected = world * (world - 1) / 2
    if t.item() != expected:
        raise RuntimeError(f"all_reduce gave {t.item()}, expected {expected}")
    if rank == 0:
        print(f"all_reduce ok: sum of ranks = {t.item():g}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
