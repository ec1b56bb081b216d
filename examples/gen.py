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
    policies: str  # YAML of the spec's fields before `template`, indented two spaces
    trainer: str = ""  # the trainer's fields after `command`, indented eight spaces
    mounts: str = ""  # volumeMounts after the script's, indented eight spaces
    volumes: str = ""  # volumes after the script's, indented six spaces

    @property
    def job_spec(self) -> str:
        """The job's spec, indented two spaces (under `spec:`): the policies, then a template
        whose trainer runs the script from the ConfigMap `render` puts before the job."""
        return f"""\
{self.policies}\
  template:
    spec:
      containers:
      - name: trainer
        image: {IMAGE}
        command: [python, /workspace/{self.script}]
{self.trainer}\
        volumeMounts:
        - {{name: script, mountPath: /workspace, readOnly: true}}
{self.mounts}\
      volumes:
      - name: script
        configMap: {{name: {self.name}-script}}
{self.volumes}"""


CPU_RESOURCES = """\
        resources:
          requests: {cpu: 500m, memory: 1Gi}
          limits: {memory: 2Gi}
"""


def _cpu_ddp_policies(failure_policy: str) -> str:
    """cpu-ddp and fail-rank3: 2 pods x 2 processes of train_ddp.py, on CPU."""
    return f"""\
  nodes: 2
  nprocPerNode: 2
  rendezvous:
    joinTimeoutSeconds: 300
  failurePolicy:
{failure_policy}
  runPolicy:
    ttlSecondsAfterFinished: 3600
"""


EXAMPLES = [
    Example(
        file="cpu-ddp.yaml",
        name="cpu-ddp",
        script="train_ddp.py",
        about="DDP on CPU (gloo): 2 pods x 2 processes, checkpoints and resumes.",
        policies=_cpu_ddp_policies("    maxRestarts: 2\n    backoffSeconds: 5"),
        trainer="""\
        args: [--epochs, "4", --checkpoint-dir, /checkpoints, --step-sleep, "0.05"]
"""
        + CPU_RESOURCES,
        mounts="""\
        - {name: checkpoints, mountPath: /checkpoints}
""",
        volumes="""\
      # Rank 0 may land in any pod (c10d orders nodes by address) and a gang restart replaces
      # every pod: to resume across restarts, use a ReadWriteMany PersistentVolumeClaim here.
      - name: checkpoints
        emptyDir: {}
""",
    ),
    Example(
        file="fail-rank3.yaml",
        name="fail-rank3",
        script="train_ddp.py",
        about="Global rank 3 raises after its second step: status.failure must name rank 3.",
        policies=_cpu_ddp_policies("    maxRestarts: 0"),
        trainer="""\
        args: [--epochs, "4", --fail-rank, "3", --fail-after-step, "2"]
"""
        + CPU_RESOURCES,
    ),
    Example(
        file="configmap-script.yaml",
        name="hello-dist",
        script="hello_dist.py",
        about="Ship your own script in a ConfigMap: every rank reports in, one all-reduce.",
        policies="""\
  nodes: 2
  nprocPerNode: 1
  failurePolicy:
    maxRestarts: 0
""",
    ),
    Example(
        file="gpu-ddp.yaml",
        name="gpu-ddp",
        script="train_ddp.py",
        about="DDP on GPUs (nccl): 2 nodes, one pod per node with all 8 of its GPUs.",
        policies="""\
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
""",
        trainer="""\
        args: [--epochs, "20", --samples, "65536", --batch-size, "256",
               --checkpoint-dir, /checkpoints]
        env:
        - {name: NCCL_DEBUG, value: WARN}
        resources:
          limits: {nvidia.com/gpu: 8, memory: 64Gi}
          requests: {cpu: "16", memory: 64Gi}
""",
        mounts="""\
        - {name: checkpoints, mountPath: /checkpoints}
""",
        volumes="""\
      # Shared by all pods (rank 0 writes, every pod resumes from it): a ReadWriteMany claim.
      - name: checkpoints
        persistentVolumeClaim: {claimName: gpu-ddp-checkpoints}
""",
    ),
    Example(
        file="progress.yaml",
        name="progress",
        script="train_progress.py",
        about="Hang detection: the script reports its step; 60 s without one restarts the gang.",
        policies="""\
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
""",
        trainer="""\
        args: [--steps, "200", --step-sleep, "0.05"]
"""
        + CPU_RESOURCES,
    ),
]


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
