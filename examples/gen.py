"""Generate the example manifests, embedding the scripts of examples/scripts/ in ConfigMaps.

    python examples/gen.py          # rewrite examples/*.yaml
    python examples/gen.py --check  # exit 1 if any manifest is stale (a unit test runs this)

Each manifest is self-contained: a ConfigMap carrying the training script, then the
DistributedTrainingJob that mounts it at /workspace, so the example runs on any image with torch.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
IMAGE = "pytorch/pytorch:2.15.0-cuda12.8-cudnn9-runtime"


@dataclass(frozen=True)
class Example:
    file: str
    name: str
    script: str
    about: str
    job_spec: str  # YAML of the job's spec, indented two spaces (under `spec:`)


def _cpu_spec(
    name: str, args: str, failure_policy: str, extra_mounts: str = "", extra_volumes: str = ""
) -> str:
    return f"""\
  nodes: 2
  nprocPerNode: 2
  rendezvous:
    joinTimeoutSeconds: 300
  failurePolicy:
{failure_policy}
  runPolicy:
    ttlSecondsAfterFinished: 3600
  template:
    spec:
      containers:
      - name: trainer
        image: {IMAGE}
        command: [python, /workspace/train_ddp.py]
        args: {args}
        resources:
          requests: {{cpu: 500m, memory: 1Gi}}
          limits: {{memory: 2Gi}}
        volumeMounts:
        - {{name: script, mountPath: /workspace, readOnly: true}}{extra_mounts}
      volumes:
      - name: script
        configMap: {{name: {name}-script}}{extra_volumes}
"""


CHECKPOINT_MOUNT = "\n        - {name: checkpoints, mountPath: /checkpoints}"
CHECKPOINT_VOLUME = """
      # Rank 0 may land in any pod (c10d orders nodes by address) and a gang restart replaces
      # every pod: to resume across restarts, use a ReadWriteMany PersistentVolumeClaim here.
      - name: checkpoints
        emptyDir: {}"""

EXAMPLES = [
    Example(
        file="cpu-ddp.yaml",
        name="cpu-ddp",
        script="train_ddp.py",
        about="DDP on CPU (gloo): 2 pods x 2 processes, checkpoints and resumes.",
        job_spec=_cpu_spec(
            "cpu-ddp",
            '[--epochs, "4", --checkpoint-dir, /checkpoints, --step-sleep, "0.05"]',
            "    maxRestarts: 2\n    backoffSeconds: 5",
            CHECKPOINT_MOUNT,
            CHECKPOINT_VOLUME,
        ),
    ),
    Example(
        file="fail-rank3.yaml",
        name="fail-rank3",
        script="train_ddp.py",
        about="Global rank 3 raises after its second step: status.failure must name rank 3.",
        job_spec=_cpu_spec(
            "fail-rank3",
            '[--epochs, "4", --fail-rank, "3", --fail-after-step, "2"]',
            "    maxRestarts: 0",
        ),
    ),
    Example(
        file="configmap-script.yaml",
        name="hello-dist",
        script="hello_dist.py",
        about="Ship your own script in a ConfigMap: every rank reports in, one all-reduce.",
        job_spec=f"""\
  nodes: 2
  nprocPerNode: 1
  failurePolicy:
    maxRestarts: 0
  template:
    spec:
      containers:
      - name: trainer
        image: {IMAGE}
        command: [python, /workspace/hello_dist.py]
        volumeMounts:
        - {{name: script, mountPath: /workspace, readOnly: true}}
      volumes:
      - name: script
        configMap: {{name: hello-dist-script}}
""",
    ),
    Example(
        file="gpu-ddp.yaml",
        name="gpu-ddp",
        script="train_ddp.py",
        about="DDP on GPUs (nccl): 2 nodes, one pod per node with all 8 of its GPUs.",
        job_spec=f"""\
  nodes: 2
  # one process per GPU: the trainer's nvidia.com/gpu limit
  nprocPerNode: gpu
  rendezvous:
    joinTimeoutSeconds: 600
  failurePolicy:
    maxRestarts: 3
    backoffSeconds: 30
  runPolicy:
    ttlSecondsAfterFinished: 86400
  template:
    spec:
      containers:
      - name: trainer
        image: {IMAGE}
        command: [python, /workspace/train_ddp.py]
        args: [--epochs, "20", --samples, "65536", --batch-size, "256",
               --checkpoint-dir, /checkpoints]
        env:
        - {{name: NCCL_DEBUG, value: WARN}}
        resources:
          limits: {{nvidia.com/gpu: 8, memory: 64Gi}}
          requests: {{cpu: "16", memory: 64Gi}}
        volumeMounts:
        - {{name: script, mountPath: /workspace, readOnly: true}}
        - {{name: checkpoints, mountPath: /checkpoints}}
      volumes:
      - name: script
        configMap: {{name: gpu-ddp-script}}
      # Shared by all pods (rank 0 writes, every pod resumes from it): a ReadWriteMany claim.
      - name: checkpoints
        persistentVolumeClaim: {{claimName: gpu-ddp-checkpoints}}
""",
    ),
]

EXAMPLES.append(
    Example(
        file="progress.yaml",
        name="progress",
        script="train_progress.py",
        about="Hang detection: the script reports its step; 60 s without one restarts the gang.",
        job_spec=f"""\
  nodes: 2
  nprocPerNode: 2
  rendezvous:
    joinTimeoutSeconds: 300
  failurePolicy:
    maxRestarts: 2
    backoffSeconds: 5
  runPolicy:
    # The script writes its step to $TORCHRUN_OPERATOR_PROGRESS_FILE; unchanged for 60 s
    # after rendezvous, the pod turns NotReady and the attempt fails as ProgressStalled.
    # See docs/progress.md.
    progressTimeoutSeconds: 60
    ttlSecondsAfterFinished: 3600
  template:
    spec:
      containers:
      - name: trainer
        image: {IMAGE}
        command: [python, /workspace/train_progress.py]
        args: [--steps, "200", --step-sleep, "0.05"]
        resources:
          requests: {{cpu: 500m, memory: 1Gi}}
          limits: {{memory: 2Gi}}
        volumeMounts:
        - {{name: script, mountPath: /workspace, readOnly: true}}
      volumes:
      - name: script
        configMap: {{name: progress-script}}
""",
    )
)


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


def render(ex: Example) -> str:
    script = (SCRIPTS / ex.script).read_text()
    if not script.endswith("\n"):
        script += "\n"
    return f"""\
# {ex.about}
# Generated by examples/gen.py from examples/scripts/{ex.script}: edit those, then rerun
# `python examples/gen.py`.
apiVersion: v1
kind: ConfigMap
metadata:
  name: {ex.name}-script
data:
  {ex.script}: |
{_indent(script, 4)}---
apiVersion: torchrun.dev/v1alpha1
kind: DistributedTrainingJob
metadata:
  name: {ex.name}
spec:
{ex.job_spec}"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="only report stale manifests")
    args = p.parse_args(argv)
    stale = []
    for ex in EXAMPLES:
        path = HERE / ex.file
        text = render(ex)
        if path.exists() and path.read_text() == text:
            continue
        stale.append(ex.file)
        if not args.check:
            path.write_text(text)
    if args.check and stale:
        print(f"stale: {', '.join(stale)}; run python examples/gen.py", file=sys.stderr)
        return 1
    if not args.check:
        print(f"wrote {', '.join(stale) or 'nothing (all current)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
