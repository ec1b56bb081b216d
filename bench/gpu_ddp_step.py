"""The benchmark's training script: DDP step time, all-reduce bandwidth and startup times.

Runs under bare torchrun or under the operator's launcher (one process per device), exactly like
a user's training script:

    torchrun --nproc-per-node 2 gpu_ddp_step.py --steps 200

Rank 0 prints one JSON line, ``{"bench": "gpu_ddp_step", ...}``, which bench/gpu_bench.py
reads. Figures:

* ``step_ms_*``: a DDP training step (forward, backward with DDP's bucketed all-reduce
  overlapping it, optimizer step) of a stack of Linear layers on synthetic data, timed per step
  after warm-up; the slowest rank's mean (DDP steps are in lockstep, so ranks agree closely);
* ``busbw_gbps``: all-reduce bus bandwidth, nccl-tests' definition: algbw * 2(n-1)/n;
* ``startup_*_s``: seconds from ``BENCH_T0`` (unix time, set by the orchestrator just before it
  started the pod or torchrun process) to the process group being up, and to the end of the
  first training step, on the slowest rank.

``--cpu`` (or no CUDA) uses gloo on CPU, for the smoke test that keeps this script from rotting.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

# Taken before importing torch: the import is part of what a pod pays at startup.
T_SCRIPT = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="gloo on CPU even when CUDA is there")
    p.add_argument("--width", type=int, default=4096, help="features of each Linear layer")
    p.add_argument("--layers", type=int, default=6, help="6 x 4096^2 is about 100M parameters")
    p.add_argument("--batch", type=int, default=8192, help="rows per rank per step")
    p.add_argument(
        "--dtype",
        choices=["bf16", "fp32"],
        default="bf16",
        help="autocast compute dtype on CUDA; parameters and gradients stay fp32",
    )
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--allreduce-mb", type=float, default=256.0, help="MiB per all-reduce")
    p.add_argument("--allreduce-warmup", type=int, default=5)
    p.add_argument("--allreduce-iters", type=int, default=20)
    p.add_argument("--label", default="", help="echoed in the result line")
    return p.parse_args()


def setup(force_cpu: bool) -> tuple[torch.device, str]:
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available() and not force_cpu:
        # With one GPU per pod the device plugin leaves one visible device: LOCAL_RANK is 0.
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    # device_id binds the communicator eagerly with nccl, so its setup counts as "process group
    # up" rather than landing in the first step.
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    return device, backend


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def build(args: argparse.Namespace, device: torch.device) -> tuple[nn.Module, int]:
    torch.manual_seed(0)  # same initial weights everywhere; DDP broadcasts rank 0's anyway
    layers: list[nn.Module] = []
    for _ in range(args.layers):
        layers += [nn.Linear(args.width, args.width), nn.GELU()]
    model = nn.Sequential(*layers).to(device)
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    return ddp, params


def main() -> None:
    args = parse_args()
    t0 = float(os.environ.get("BENCH_T0") or T_SCRIPT)
    device, backend = setup(args.cpu)
    t_pg = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()

    model, params = build(args, device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
    gen = torch.Generator(device=device).manual_seed(1000 + rank)
    x = torch.randn(args.batch, args.width, device=device, generator=gen)
    y = torch.randn(args.batch, args.width, device=device, generator=gen)
    amp_dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    use_amp = device.type == "cuda" and args.dtype == "bf16"

    def step() -> None:
        with torch.autocast(device.type, dtype=amp_dtype, enabled=use_amp):
            loss = nn.functional.mse_loss(model(x).float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    step()
    sync(device)
    t_first = time.time()

    for _ in range(max(args.warmup - 1, 0)):
        step()
    sync(device)
    times: list[float] = []
    for _ in range(args.steps):
        # Synchronising every step costs a few microseconds of launch bubble, the same in
        # every layout, and gives a distribution instead of a bare mean.
        s = time.perf_counter()
        step()
        sync(device)
        times.append(time.perf_counter() - s)

    # All-reduce bus bandwidth, measured separately from the training step.
    numel = int(args.allreduce_mb * 2**20) // 4
    buf = torch.ones(numel, dtype=torch.float32, device=device)
    for _ in range(args.allreduce_warmup):
        dist.all_reduce(buf)
    sync(device)
    s = time.perf_counter()
    for _ in range(args.allreduce_iters):
        dist.all_reduce(buf)
    sync(device)
    ar = (time.perf_counter() - s) / max(args.allreduce_iters, 1)
    algbw = numel * 4 / ar / 1e9
    busbw = algbw * 2 * (world - 1) / world

    mine = {
        "step_ms_mean": statistics.fmean(times) * 1e3,
        "step_ms_median": statistics.median(times) * 1e3,
        "step_ms_stdev": (statistics.stdev(times) if len(times) > 1 else 0.0) * 1e3,
        "step_ms_min": min(times) * 1e3,
        "busbw_gbps": busbw,
        "allreduce_ms": ar * 1e3,
        "startup_import_s": T_SCRIPT - t0,
        "startup_pg_s": t_pg - t0,
        "startup_first_step_s": t_first - t0,
    }
    # A tensor gather rather than all_gather_object, which needs numpy (absent in some images).
    keys = sorted(mine)
    local = torch.tensor([mine[k] for k in keys], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    ranks = [dict(zip(keys, g.tolist(), strict=True)) for g in gathered]
    if rank == 0:
        # The slowest rank decides: a job is as fast as its slowest member.
        worst = {k: (min if k == "busbw_gbps" else max)(r[k] for r in ranks) for k in keys}
        result: dict[str, object] = dict(worst)
        result.update(
            bench="gpu_ddp_step",
            label=args.label,
            backend=backend,
            world_size=world,
            params=params,
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            dtype=args.dtype if device.type == "cuda" else "fp32",
            batch=args.batch,
            steps=args.steps,
            allreduce_mb=args.allreduce_mb,
            torch=torch.__version__,
            nccl=".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None,
        )
        print(json.dumps(result, sort_keys=True), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
