"""The benchmark's data-loading-bound training script: DDP epoch time with a CPU-heavy input
pipeline, and what each worker process sees of its CPU (thread counts, affinity, environment).

Runs under bare torchrun or under the operator's launcher, exactly like a user's script:

    torchrun --nproc-per-node 2 gpu_ddp_data.py --samples 2560

The input pipeline is torchvision's ``FakeData`` (a random PIL image per sample) through
``RandomResizedCrop``, ``RandomHorizontalFlip``, ``ToTensor`` and ``Normalize``, loaded by a
``DataLoader`` with no worker processes: every image is decoded and transformed in the training
process, between steps, so the epoch time is the CPU's and a launcher that changed the workers'
threads, affinity or environment would show in it. The model is a small CNN on the GPU, wrapped
in DDP. Without torchvision (``--synthetic``, or torchvision not installed) the same pipeline is
written with torch ops: only for the CPU smoke test, never for a GPU figure.

Every rank prints one JSON line ``{"bench": "gpu_ddp_facts", ...}`` (what its process sees:
``OMP_NUM_THREADS``, ``torch.get_num_threads()``, CPU affinity, its command line, environment)
and rank 0 one ``{"bench": "gpu_ddp_data", ...}`` with the figures, the slowest rank's:

* ``epoch_s_mean``/``_median``: wall seconds per timed epoch (after warm-up batches);
* ``data_share``: the part of the epoch spent waiting for the next batch (the input pipeline);
* ``cpu_s_per_epoch``, ``nivcsw_per_epoch``: the process's CPU seconds (user + system) and
  involuntary context switches per epoch (contention for CPUs shows here);
* ``startup_first_batch_s``: from ``BENCH_T0`` to the end of the first training step;
* ``batch_data_ms_median``/``_p10``: one batch's loading time, median and 10th percentile over
  the timed batches (robust to short bursts of a slow CPU, which the epoch time is not);
* ``user_s``/``sys_s``/``minflt``/``other_threads_cpu_s``/``agent_cpu_s`` ``_per_epoch``: the
  process's user and system CPU, minor page faults, the CPU of its threads other than the main
  one, and of its parent (torchrun's agent or the launcher).

With ``BENCH_RANK_CPUS`` (a comma-separated CPU list, set by the harness's ``--pin-ranks``) rank
i pins its main thread to the i-th CPU of the list (modulo its length) once the process group is
up; threads started before (NCCL's, the store's) keep the process's set.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import resource
import statistics
import sys
import time
from typing import Any

T_SCRIPT = time.time()
# What this process may run on as it starts: the layout's, inherited from torchrun or the
# launcher (before any pin of the main thread below).
AFFINITY_AT_START = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
# Environment whose values matter to threading, placement or the launch; other names are
# reported without their values.
VALUE_PREFIXES = (
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "TORCH",
    "PET_",
    "NCCL_",
    "CUDA_",
    "PYTHON",
    "LOCAL_",
    "RANK",
    "WORLD_",
    "GROUP_",
    "ROLE_",
    "MASTER_",
    "LD_PRELOAD",
    "MALLOC",
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="gloo on CPU even when CUDA is there")
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="the pipeline in torch ops instead of torchvision (CPU smoke only)",
    )
    p.add_argument("--samples", type=int, default=2560, help="images per rank per epoch")
    p.add_argument("--batch", type=int, default=64, help="images per rank per step")
    p.add_argument("--image-size", type=int, default=256, help="FakeData's square images")
    p.add_argument("--crop", type=int, default=224, help="RandomResizedCrop's output")
    p.add_argument("--classes", type=int, default=1000)
    p.add_argument("--width", type=int, default=64, help="channels of the CNN's first conv")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs")
    p.add_argument("--warmup-batches", type=int, default=5, help="steps before the timing")
    return p.parse_args()


# ------------------------------------------------------------------------------------------
# what this process sees


def _cpu_list(cpus: set[int]) -> str:
    """0-3,8 style."""
    out: list[str] = []
    for c in sorted(cpus):
        if out and "-" in out[-1] and int(out[-1].split("-")[1]) == c - 1:
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        elif out and "-" not in out[-1] and int(out[-1]) == c - 1:
            out[-1] = f"{out[-1]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out)


def _read(path: str) -> str | None:
    try:
        with open(path) as fp:
            return fp.read().strip()
    except OSError:
        return None


def _parent_cmdline() -> list[str]:
    raw = _read(f"/proc/{os.getppid()}/cmdline") or ""
    return [a for a in raw.split("\0") if a][:8]


def _parent_affinity() -> str | None:
    for line in (_read(f"/proc/{os.getppid()}/status") or "").splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    return None


def pin_rank(rank: int) -> int | None:
    """The main thread onto one CPU of ``BENCH_RANK_CPUS`` (rank i: the i-th), if set."""
    listed = [int(c) for c in os.environ.get("BENCH_RANK_CPUS", "").split(",") if c.strip()]
    if not listed:
        return None
    cpu = listed[rank % len(listed)]
    os.sched_setaffinity(0, {cpu})  # pid 0: the calling thread; threads it starts inherit it
    return cpu


def process_facts(rank_cpu: int | None = None) -> dict[str, Any]:
    env = os.environ
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
    return {
        "bench": "gpu_ddp_facts",
        "rank": int(env.get("RANK", "0")),
        "local_rank": int(env.get("LOCAL_RANK", "0")),
        "pid": os.getpid(),
        "orig_argv": list(getattr(sys, "orig_argv", sys.argv))[:8],
        "parent_cmdline": _parent_cmdline(),
        "OMP_NUM_THREADS": env.get("OMP_NUM_THREADS"),
        "MKL_NUM_THREADS": env.get("MKL_NUM_THREADS"),
        "torch_num_threads": torch.get_num_threads(),
        "torch_num_interop_threads": torch.get_num_interop_threads(),
        "affinity_at_start": _cpu_list(AFFINITY_AT_START),
        "affinity": _cpu_list(affinity),
        "affinity_cpus": len(affinity),
        "parent_affinity": _parent_affinity(),
        "rank_cpu": rank_cpu,
        "cpu_count": os.cpu_count(),
        "nice": os.getpriority(os.PRIO_PROCESS, 0),
        "cgroup_cpu_max": _read("/sys/fs/cgroup/cpu.max"),
        "os_threads": len(os.listdir("/proc/self/task")),
        "os_thread_names": sorted(
            _read(f"/proc/self/task/{t}/comm") or "?" for t in os.listdir("/proc/self/task")
        ),
        "faulthandler": faulthandler.is_enabled(),
        "env_names": sorted(env),
        "env": {k: v for k, v in sorted(env.items()) if k.startswith(VALUE_PREFIXES)},
    }


def _cpu_ticks() -> list[int]:
    """The machine's CPU time by state (user nice system idle iowait irq softirq steal)."""
    line = (_read("/proc/stat") or "cpu").splitlines()[0].split()
    return [int(v) for v in line[1:9]] or [0] * 8


def current_cpu() -> int:
    """The CPU this process last ran on (/proc/self/stat's "processor"), -1 if unknown."""
    stat = _read("/proc/self/stat") or ""
    fields = stat.rsplit(")", 1)[-1].split()
    return int(fields[36]) if len(fields) > 36 else -1


def parent_cpu_s() -> float:
    """CPU seconds (user + system) the parent process has used: torchrun's agent, or the
    launcher with the agent inside it."""
    stat = _read(f"/proc/{os.getppid()}/stat") or ""
    fields = stat.rsplit(")", 1)[-1].split()
    if len(fields) < 13:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def emit(obj: dict[str, Any]) -> None:
    """One line in one write: ranks of a node share the same stdout file."""
    os.write(1, (json.dumps(obj, sort_keys=True) + "\n").encode())


# ------------------------------------------------------------------------------------------
# data and model


class SyntheticImages(Dataset[tuple[torch.Tensor, int]]):
    """FakeData + RandomResizedCrop + flip + Normalize written with torch ops (no torchvision):
    for the CPU smoke test only."""

    def __init__(self, size: int, image_size: int, crop: int, classes: int) -> None:
        self.size, self.image_size, self.crop, self.classes = size, image_size, crop, classes

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        g = torch.Generator().manual_seed(index)
        img = torch.rand(3, self.image_size, self.image_size, generator=g)
        side = int(torch.randint(self.crop // 2, self.image_size + 1, (1,)))
        top, left = (int(v) for v in torch.randint(0, self.image_size - side + 1, (2,)))
        patch = img[:, top : top + side, left : left + side].unsqueeze(0)
        out = nn.functional.interpolate(
            patch, size=(self.crop, self.crop), mode="bilinear", align_corners=False
        )[0]
        if torch.rand(1) < 0.5:
            out = out.flip(-1)
        mean = torch.tensor(MEAN).view(3, 1, 1)
        std = torch.tensor(STD).view(3, 1, 1)
        return (out - mean) / std, int(torch.randint(0, self.classes, (1,), generator=g))


def dataset(args: argparse.Namespace, world: int) -> tuple[Dataset[Any], str]:
    size = args.samples * world
    if not args.synthetic:
        try:
            # torchvision is on the GPU machines, not in the test environment (optional here).
            from torchvision import datasets, transforms  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            args.synthetic = True
        else:
            tf = transforms.Compose(
                [
                    transforms.RandomResizedCrop(args.crop),
                    transforms.RandomHorizontalFlip(),
                    transforms.ToTensor(),
                    transforms.Normalize(MEAN, STD),
                ]
            )
            shape = (3, args.image_size, args.image_size)
            data = datasets.FakeData(size, shape, args.classes, transform=tf)
            import torchvision

            return data, f"torchvision {torchvision.__version__} FakeData"
    return SyntheticImages(size, args.image_size, args.crop, args.classes), "synthetic (torch ops)"


def small_cnn(width: int, classes: int) -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, stride=2, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]

    return nn.Sequential(
        *block(3, width),
        *block(width, width * 2),
        *block(width * 2, width * 4),
        *block(width * 4, width * 4),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width * 4, classes),
    )


# ------------------------------------------------------------------------------------------
# main


def main() -> None:
    args = parse_args()
    t0 = float(os.environ.get("BENCH_T0") or T_SCRIPT)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available() and not args.cpu:
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend, device_id=device if device.type == "cuda" else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    emit(process_facts(pin_rank(rank)))

    data, source = dataset(args, world)
    sampler: DistributedSampler[Any] = DistributedSampler(
        data, num_replicas=world, rank=rank, shuffle=True, seed=0
    )
    loader = DataLoader(data, batch_size=args.batch, sampler=sampler, num_workers=0)
    torch.manual_seed(0)
    model = small_cnn(args.width, args.classes).to(device)
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def train_step(x: torch.Tensor, y: torch.Tensor) -> None:
        x, y = x.to(device), y.to(device)
        loss = loss_fn(ddp(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    # Warm-up: cuDNN's algorithm choice, NCCL's first buckets, the allocator.
    sampler.set_epoch(10_000)
    t_first = 0.0
    for i, (x, y) in enumerate(loader):
        if i >= max(args.warmup_batches, 1):
            break
        train_step(x, y)
        sync()
        if i == 0:
            t_first = time.time()
    dist.barrier()

    epochs: list[float] = []
    cpus_seen: dict[int, int] = {}  # CPU -> batches it loaded: where the scheduler put us
    data_s = 0.0
    batch_s: list[float] = []  # each batch's loading time: robust to bursts of slowness
    stat0 = _cpu_ticks()
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    main0, agent0 = time.thread_time(), parent_cpu_s()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        it = iter(loader)
        while True:
            s = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            batch_s.append(time.perf_counter() - s)
            data_s += batch_s[-1]
            cpu = current_cpu()
            cpus_seen[cpu] = cpus_seen.get(cpu, 0) + 1
            train_step(x, y)
        sync()
        epochs.append(time.perf_counter() - start)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    main1, agent1 = time.thread_time(), parent_cpu_s()
    stat1 = _cpu_ticks()
    n = max(args.epochs, 1)
    ticks = [b - a for a, b in zip(stat0, stat1, strict=True)]

    mine = {
        "epoch_s_mean": statistics.fmean(epochs),
        "epoch_s_median": statistics.median(epochs),
        "epoch_s_min": min(epochs),
        "data_share": data_s / sum(epochs),
        "cpu_s_per_epoch": (ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime) / n,
        "nivcsw_per_epoch": (ru1.ru_nivcsw - ru0.ru_nivcsw) / n,
        "user_s_per_epoch": (ru1.ru_utime - ru0.ru_utime) / n,
        "sys_s_per_epoch": (ru1.ru_stime - ru0.ru_stime) / n,
        "minflt_per_epoch": (ru1.ru_minflt - ru0.ru_minflt) / n,
        # CPU of this process's other threads (NCCL's, CUDA's, the store's), and of the
        # parent (the agent), while this rank trained
        "other_threads_cpu_s_per_epoch": (
            ru1.ru_utime + ru1.ru_stime - ru0.ru_utime - ru0.ru_stime - (main1 - main0)
        )
        / n,
        "agent_cpu_s_per_epoch": (agent1 - agent0) / n,
        "batch_data_ms_median": 1000 * statistics.median(batch_s) if batch_s else 0.0,
        "batch_data_ms_p10": 1000 * sorted(batch_s)[len(batch_s) // 10] if batch_s else 0.0,
        # The whole machine's, from /proc/stat: how busy it was while this rank trained, and
        # the time its virtual CPUs were runnable but the hypervisor ran something else.
        "machine_busy_share": 1 - (ticks[3] + ticks[4]) / max(sum(ticks), 1),
        "machine_steal_share": (ticks[7] if len(ticks) > 7 else 0) / max(sum(ticks), 1),
        "startup_import_s": T_SCRIPT - t0,
        "startup_first_batch_s": t_first - t0,
    }
    emit({"bench": "gpu_ddp_cpus", "rank": rank, "cpus_seen": cpus_seen})
    keys = sorted(mine)
    local = torch.tensor([mine[k] for k in keys], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    ranks = [dict(zip(keys, g.tolist(), strict=True)) for g in gathered]
    if rank == 0:
        worst = {k: max(r[k] for r in ranks) for k in keys}  # the slowest rank decides
        result: dict[str, Any] = dict(worst)
        result.update(
            bench="gpu_ddp_data",
            ranks=ranks,
            backend=backend,
            world_size=world,
            params=params,
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            source=source,
            samples_per_rank=len(sampler),
            batch=args.batch,
            image_size=args.image_size,
            crop=args.crop,
            epochs=args.epochs,
            images_per_s=len(sampler) * world / worst["epoch_s_mean"],
            torch=torch.__version__,
            nccl=".".join(map(str, torch.cuda.nccl.version())) if backend == "nccl" else None,
        )
        emit(result)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
