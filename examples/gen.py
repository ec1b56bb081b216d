"""Generate the example manifests, embedding the scripts of examples/scripts/ in ConfigMaps.

    python examples/gen.py          # rewrite examples/*.yaml
    python examples/gen.py --check  # exit 1 if any manifest is stale (a unit test runs this)

Each manifest is self-contained: a ConfigMap carrying the training script and the module the
scripts share (torchrun_example.py), then the DistributedTrainingJob that mounts them at
/workspace, so the example runs on any image with torch.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
# What every script imports (process group set-up, the progress file); shipped with each.
SHARED = "torchrun_example.py"
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


def _policies(
    nproc: str,
    *,
    max_restarts: int,
    backoff: int | None = None,
    join_timeout: int | None = None,
    ttl: int | None = None,
    run_policy: str = "",
    nproc_note: str = "",
) -> str:
    """The spec's fields before `template`, for 2 nodes: the YAML the examples share, with
    `run_policy` (indented four spaces) before the TTL and `nproc_note` as a comment line."""
    out = "  nodes: 2\n"
    out += f"  # {nproc_note}\n" if nproc_note else ""
    out += f"  nprocPerNode: {nproc}\n"
    if join_timeout is not None:
        out += f"  rendezvous:\n    joinTimeoutSeconds: {join_timeout}\n"
    out += f"  failurePolicy:\n    maxRestarts: {max_restarts}\n"
    if backoff is not None:
        out += f"    backoffSeconds: {backoff}\n"
    if run_policy or ttl is not None:
        out += "  runPolicy:\n" + run_policy
        out += f"    ttlSecondsAfterFinished: {ttl}\n" if ttl is not None else ""
    return out


def _checkpoints(comment: str, source: str) -> dict[str, str]:
    """The trainer's /checkpoints mount and its volume (`comment` and `source` indented six
    spaces), as Example fields."""
    return {
        "mounts": "        - {name: checkpoints, mountPath: /checkpoints}\n",
        "volumes": f"{comment}      - name: checkpoints\n        {source}\n",
    }


EXAMPLES = [
    Example(
        file="cpu-ddp.yaml",
        name="cpu-ddp",
        script="train_ddp.py",
        about="DDP on CPU (gloo): 2 pods x 2 processes, checkpoints and resumes.",
        policies=_policies("2", join_timeout=300, max_restarts=2, backoff=5, ttl=3600),
        trainer="""\
        args: [--epochs, "4", --checkpoint-dir, /checkpoints, --step-sleep, "0.05"]
"""
        + CPU_RESOURCES,
        **_checkpoints(
            """\
      # Rank 0 may land in any pod (c10d orders nodes by address) and a gang restart replaces
      # every pod: to resume across restarts, use a ReadWriteMany PersistentVolumeClaim here.
""",
            "emptyDir: {}",
        ),
    ),
    Example(
        file="fail-rank3.yaml",
        name="fail-rank3",
        script="train_ddp.py",
        about="Global rank 3 raises after its second step: status.failure must name rank 3.",
        policies=_policies("2", join_timeout=300, max_restarts=0, ttl=3600),
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
        policies=_policies("1", max_restarts=0),
    ),
    Example(
        file="gpu-ddp.yaml",
        name="gpu-ddp",
        script="train_ddp.py",
        about="DDP on GPUs (nccl): 2 nodes, one pod per node with all 8 of its GPUs.",
        policies=_policies(
            "gpu",
            nproc_note="one process per GPU: the trainer's nvidia.com/gpu limit",
            join_timeout=600,
            max_restarts=3,
            backoff=30,
            ttl=86400,
        ),
        trainer="""\
        args: [--epochs, "20", --samples, "65536", --batch-size, "256",
               --checkpoint-dir, /checkpoints]
        env:
        - {name: NCCL_DEBUG, value: WARN}
        resources:
          limits: {nvidia.com/gpu: 8, memory: 64Gi}
          requests: {cpu: "16", memory: 64Gi}
""",
        **_checkpoints(
            """\
      # Shared by all pods (rank 0 writes, every pod resumes from it): a ReadWriteMany claim.
""",
            "persistentVolumeClaim: {claimName: gpu-ddp-checkpoints}",
        ),
    ),
    Example(
        file="checkpoint.yaml",
        name="checkpoint",
        script="train_checkpoint.py",
        about="Checkpoint contract: save to spec.checkpoint, report it, resume after restarts.",
        policies=_policies("2", join_timeout=300, max_restarts=3, backoff=5, ttl=3600)
        + """\
  # The same storage at /checkpoints in every pod of every attempt: rank 0 (in any pod)
  # saves, every pod resumes. A ReadWriteMany claim; see docs/progress.md, "Checkpoints".
  checkpoint:
    claimName: checkpoint-ckpt
    mountPath: /checkpoints
""",
        trainer="""\
        args: [--steps, "200", --save-every, "20", --step-sleep, "0.1"]
"""
        + CPU_RESOURCES,
    ),
    Example(
        file="progress.yaml",
        name="progress",
        script="train_progress.py",
        about="Hang detection: the script reports its step; 60 s without one restarts the gang.",
        policies=_policies(
            "2",
            join_timeout=300,
            max_restarts=2,
            backoff=5,
            run_policy="""\
    # The script writes its step to $TORCHRUN_OPERATOR_PROGRESS_FILE; unchanged for 60 s
    # after rendezvous, the pod turns NotReady and the attempt fails as ProgressStalled.
    # See docs/progress.md.
    progressTimeoutSeconds: 60
""",
            ttl=3600,
        ),
        trainer="""\
        args: [--steps, "200", --step-sleep, "0.05"]
"""
        + CPU_RESOURCES,
    ),
]


def _indent(text: str, spaces: int) -> str:
    pad = " " * spaces
    return "".join(pad + line if line.strip() else line for line in text.splitlines(True))


def _file(name: str) -> str:
    """A ConfigMap data entry: the file of examples/scripts/ as a YAML block."""
    text = (SCRIPTS / name).read_text()
    return f"  {name}: |\n" + _indent(text if text.endswith("\n") else text + "\n", 4)


def render(ex: Example) -> str:
    return f"""\
# {ex.about}
# Generated by examples/gen.py from examples/scripts/ ({ex.script}, {SHARED}): edit
# those, then rerun `python examples/gen.py`.
apiVersion: v1
kind: ConfigMap
metadata:
  name: {ex.name}-script
data:
{_file(ex.script)}{_file(SHARED)}---
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
