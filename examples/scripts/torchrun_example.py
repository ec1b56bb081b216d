"""What the example scripts share: joining the process group on the right device, and
reporting the step counter to the operator (docs/progress.md). Shipped next to each script in
its ConfigMap; a script imports it from its own directory."""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist


def init() -> tuple[torch.device, str, int]:
    """Join the process group: nccl on this rank's GPU (LOCAL_RANK picks it) when CUDA is
    there, else gloo on the CPU. Returns (device, backend, local rank)."""
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
    # device_id binds the process group to this rank's GPU (eager NCCL init, no guessing).
    dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    return device, backend, local_rank


def write_progress(step: int, checkpoint: dict[str, object] | None = None) -> None:
    """The step counter, to $TORCHRUN_OPERATOR_PROGRESS_FILE when the operator set it; with
    the latest checkpoint saved ({"step": n, "path": p}), as JSON. Pass the checkpoint with
    every step after it: the launcher reads the file about once a second and might miss a
    line that the next step replaces sooner."""
    path = os.environ.get("TORCHRUN_OPERATOR_PROGRESS_FILE")
    if not path:
        return
    line = json.dumps({"step": step, "checkpoint": checkpoint}) if checkpoint else str(step)
    tmp = f"{path}.tmp"
    with open(tmp, "w") as fp:
        fp.write(f"{line}\n")
    os.replace(tmp, path)  # readers never see a half-written number
