"""The benchmark's loader-bound training script in the shape of the PyTorch MNIST tutorials:
a small ConvNet on 1 x 28 x 28 images, ``FakeData`` through ``ToTensor`` alone, a
``DataLoader`` with ``num_workers=0`` and ``pin_memory=True``, SGD, DDP.

Runs under bare torchrun or under the operator's launcher, exactly like a user's script:

    torchrun --nproc-per-node 2 gpu_ddp_mnist.py --epochs 2

Each image is tiny, so the time goes to Python in the training process's main thread: a PIL
image per sample, ``ToTensor``, the collate, the training loop and its kernel launches (the
GPU is nearly idle). Anything a launcher adds to that process's main thread, or lets compete
with it, shows here first. As in the tutorials, rank 0 prints the loss every
``--log-interval`` batches (``loss.item()``, a synchronisation, and a line on stdout).

Without torchvision (``--synthetic``, or torchvision not installed) the dataset is the same
shape made with torch ops: only for the CPU smoke test, never for a GPU figure.

Every rank prints the facts line of ``gpu_ddp_data.py`` (``{"bench": "gpu_ddp_facts", ...}``)
and rank 0 one ``{"bench": "gpu_ddp_mnist", ...}`` with the figures, the slowest rank's:
``epoch_s_mean``/``_median`` (wall seconds per timed epoch), ``data_share`` (waiting for the
next batch), ``batch_data_ms_median``, ``cpu_s_per_epoch`` (user + system),
``nvcsw_per_epoch``/``nivcsw_per_epoch`` (voluntary and involuntary context switches),
``other_threads_cpu_s_per_epoch`` and ``agent_cpu_s_per_epoch``, ``startup_first_batch_s``; per
rank also its threads' CPU seconds over the timed epochs by thread name (``threads_cpu``).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time
from typing import Any

T_SCRIPT = time.time()

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn.functional as F  # noqa: E402, N812
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402
from torch.utils.data import DataLoader, Dataset, DistributedSampler  # noqa: E402

# The facts line and the helpers that read /proc: one place, the data workload's script, beside
# this one (its directory is first on sys.path in every layout, as under `python script.py`;
# inserted again for a caller that imports this file).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpu_ddp_data import (  # type: ignore[import-not-found,unused-ignore]  # noqa: E402
    _cpu_ticks,
    emit,
    parent_cpu_s,
    pin_rank,
    process_facts,
)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="gloo on CPU even when CUDA is there")
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="the dataset in torch ops instead of torchvision (CPU smoke only)",
    )
    p.add_argument("--samples", type=int, default=60000, help="FakeData's size (all ranks)")
    p.add_argument("--batch", type=int, default=100, help="images per rank per step")
    p.add_argument("--epochs", type=int, default=2, help="timed epochs")
    p.add_argument("--warmup-batches", type=int, default=5, help="steps before the timing")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--log-interval", type=int, default=10, help="rank 0 prints the loss")
    return p.parse_args()


class Net(nn.Module):
    """pytorch/examples' MNIST ConvNet."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, 1)
        self.conv2 = nn.Conv2d(32, 64, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(9216, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


class SyntheticMnist(Dataset[tuple[torch.Tensor, int]]):
    """FakeData(image_size=(1, 28, 28)) + ToTensor in torch ops (no torchvision, no PIL): as
    FakeData does, each sample seeds torch's global generator with its index (which goes
    through ``torch.cuda.manual_seed_all`` too) and restores it after; the image is quantised
    to 8 bits and scaled to [0, 1] as ToPILImage + ToTensor do. For the CPU smoke test and
    bench/shim_cost.py only."""

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        state = torch.get_rng_state()
        torch.manual_seed(index)
        img = torch.randn(1, 28, 28)
        target = int(torch.randint(0, 10, (1,)))
        torch.set_rng_state(state)
        pixels = (img * 64 + 128).clamp(0, 255).to(torch.uint8)
        return pixels.float().div(255), target


def dataset(args: argparse.Namespace) -> tuple[Dataset[Any], str]:
    if not args.synthetic:
        try:
            # torchvision is on the GPU machines, not in the test environment (optional here).
            import torchvision  # type: ignore[import-not-found,unused-ignore]
            from torchvision import datasets, transforms  # type: ignore[import-not-found,unused-ignore]
        except ImportError:
            args.synthetic = True
        else:
            data = datasets.FakeData(
                size=args.samples,
                image_size=(1, 28, 28),
                num_classes=10,
                transform=transforms.ToTensor(),
            )
            return data, f"torchvision {torchvision.__version__} FakeData"
    return SyntheticMnist(args.samples), "synthetic (torch ops)"


def _threads_cpu(pid: str = "self") -> dict[str, float]:
    """CPU seconds (user + system) of each thread of a process, summed by thread name."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as fp:
                stat = fp.read()
        except OSError:
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat.rsplit(")", 1)[-1].split()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / tick
    return out


def start_profilers(rank: int) -> list[subprocess.Popen[bytes]]:
    """With ``BENCH_PYSPY`` (py-spy's path) and ``BENCH_PROFILE_OUT`` (a path prefix), set by
    the harness's ``--pyspy``: sample this rank's process (Python and native frames, every
    thread, idle samples too) and, from rank 0, its parent (the agent) with py-spy for
    ``BENCH_PROFILE_SECONDS`` from the start of the timed epochs. py-spy pauses the process
    for each sample: a profiled run's times are not figures."""
    pyspy, out = os.environ.get("BENCH_PYSPY"), os.environ.get("BENCH_PROFILE_OUT")
    if not pyspy or not out:
        return []
    seconds = os.environ.get("BENCH_PROFILE_SECONDS", "5")
    targets = [(str(os.getpid()), f"rank{rank}", ["--native"])]
    if rank == 0:
        targets.append((str(os.getppid()), "agent", []))
    procs = []
    for pid, name, extra in targets:
        cmd = [pyspy, "record", "--pid", pid, "--duration", seconds, "--rate", "100"]
        cmd += ["--threads", "--idle", "--format", "raw", "--output", f"{out}-{name}.txt"]
        procs.append(subprocess.Popen([*cmd, *extra], stdout=subprocess.DEVNULL))
    time.sleep(0.5)  # py-spy attached before the timed loop starts
    return procs


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

    data, source = dataset(args)
    sampler: DistributedSampler[Any] = DistributedSampler(data, num_replicas=world, rank=rank)
    loader = DataLoader(
        data,
        batch_size=args.batch,
        sampler=sampler,
        num_workers=0,
        pin_memory=device.type == "cuda",
    )
    torch.manual_seed(0)
    model = Net().to(device)
    params = sum(p.numel() for p in model.parameters())
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        opt.zero_grad()
        loss = F.nll_loss(ddp(x), y)
        loss.backward()
        opt.step()
        return loss

    # Warm-up: cuDNN's algorithm choice, NCCL's first buckets, the allocators.
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
    data_s = 0.0
    batch_s: list[float] = []
    profilers = start_profilers(rank)
    stat0, threads0, agent_threads0 = _cpu_ticks(), _threads_cpu(), _threads_cpu(str(os.getppid()))
    ru0 = resource.getrusage(resource.RUSAGE_SELF)
    main0, agent0 = time.thread_time(), parent_cpu_s()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        start = time.perf_counter()
        it = iter(loader)
        i = 0
        while True:
            s = time.perf_counter()
            try:
                x, y = next(it)
            except StopIteration:
                break
            batch_s.append(time.perf_counter() - s)
            data_s += batch_s[-1]
            loss = train_step(x, y)
            if rank == 0 and args.log_interval and i % args.log_interval == 0:
                print(
                    f"Train Epoch: {epoch} [{i * len(x)}/{len(sampler)}]\tLoss: {loss.item():.6f}"
                )
            i += 1
        sync()
        epochs.append(time.perf_counter() - start)
    ru1 = resource.getrusage(resource.RUSAGE_SELF)
    main1, agent1 = time.thread_time(), parent_cpu_s()
    stat1, threads1, agent_threads1 = _cpu_ticks(), _threads_cpu(), _threads_cpu(str(os.getppid()))
    for prof in profilers:
        prof.wait()
    n = max(args.epochs, 1)
    ticks = [b - a for a, b in zip(stat0, stat1, strict=True)]
    cpu = ru1.ru_utime - ru0.ru_utime + ru1.ru_stime - ru0.ru_stime
    mine = {
        "epoch_s_mean": statistics.fmean(epochs),
        "epoch_s_median": statistics.median(epochs),
        "epoch_s_min": min(epochs),
        "data_share": data_s / sum(epochs),
        "batch_data_ms_median": 1000 * statistics.median(batch_s) if batch_s else 0.0,
        "cpu_s_per_epoch": cpu / n,
        "user_s_per_epoch": (ru1.ru_utime - ru0.ru_utime) / n,
        "sys_s_per_epoch": (ru1.ru_stime - ru0.ru_stime) / n,
        "nvcsw_per_epoch": (ru1.ru_nvcsw - ru0.ru_nvcsw) / n,
        "nivcsw_per_epoch": (ru1.ru_nivcsw - ru0.ru_nivcsw) / n,
        "other_threads_cpu_s_per_epoch": (cpu - (main1 - main0)) / n,
        "agent_cpu_s_per_epoch": (agent1 - agent0) / n,
        "machine_busy_share": 1 - (ticks[3] + ticks[4]) / max(sum(ticks), 1),
        "startup_first_batch_s": t_first - t0,
    }

    def delta(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
        return {k: round(v - a.get(k, 0.0), 3) for k, v in sorted(b.items())}

    emit(
        {
            "bench": "gpu_ddp_threads",
            "rank": rank,
            "threads_cpu": delta(threads0, threads1),
            "agent_threads_cpu": delta(agent_threads0, agent_threads1),
        }
    )
    keys = sorted(mine)
    local = torch.tensor([mine[k] for k in keys], dtype=torch.float64, device=device)
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local)
    ranks = [dict(zip(keys, g.tolist(), strict=True)) for g in gathered]
    if rank == 0:
        worst = {k: max(r[k] for r in ranks) for k in keys}  # the slowest rank decides
        result: dict[str, Any] = dict(worst)
        result.update(
            bench="gpu_ddp_mnist",
            ranks=ranks,
            backend=backend,
            world_size=world,
            params=params,
            device=torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            source=source,
            samples_per_rank=len(sampler),
            batch=args.batch,
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
