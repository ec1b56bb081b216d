"""A DDP-style worker that fails on purpose, one way per ``--mode`` (bench/gpu_failures.py).

* ``oom``: rank ``--rank`` asks its GPU for far more memory than it has (a CUDA out-of-memory);
* ``nccl-timeout``: rank ``--rank`` sleeps outside the all-reduce the others wait in, longer
  than the process group's ``--timeout`` (NCCL's watchdog times out); with ``--backend gloo``
  on CPU the same for gloo;
* ``sigkill``: rank ``--rank`` kills itself with SIGKILL between two all-reduces.
"""

from __future__ import annotations

import argparse
import datetime
import os
import signal
import time

import torch
import torch.distributed as dist


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=("oom", "nccl-timeout", "sigkill"), required=True)
    p.add_argument("--rank", type=int, default=1, help="the rank that fails")
    p.add_argument(
        "--index",
        type=int,
        default=None,
        help="instead of --rank: local rank 0 of the pod of this index fails "
        "(TORCHRUN_OPERATOR_INDEX; index 0 holds the rendezvous store)",
    )
    p.add_argument("--timeout", type=float, default=20.0, help="process group timeout (s)")
    p.add_argument("--sleep", type=float, default=300.0, help="how long the late rank sleeps")
    p.add_argument("--backend", default="nccl")
    args = p.parse_args()
    cuda = args.backend == "nccl"
    local = int(os.environ.get("LOCAL_RANK", "0"))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group(args.backend, timeout=datetime.timedelta(seconds=args.timeout))
    rank = dist.get_rank()
    t = torch.ones(1024, device=device)
    for _ in range(3):
        dist.all_reduce(t)
    if cuda:
        torch.cuda.synchronize()
    print(f"rank {rank}: 3 all-reduces done", flush=True)
    index = os.environ.get("TORCHRUN_OPERATOR_INDEX")
    if args.index is not None:  # noqa: SIM108 - the two ways to pick it, side by side
        late = index == str(args.index) and local == 0
    else:
        late = rank == args.rank
    if late:
        print(f"rank {rank} (pod index {index}): failing ({args.mode})", flush=True)
        if args.mode == "oom":
            torch.empty(1 << 50, dtype=torch.uint8, device=device)  # 1 PiB
        elif args.mode == "nccl-timeout":
            time.sleep(args.sleep)  # outside the collective the others wait in
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(t)
    if cuda:
        torch.cuda.synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
