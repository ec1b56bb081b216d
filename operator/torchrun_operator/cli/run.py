"""`kubectl dtj run`: torchrun's habits on a cluster. Ships a script (or a directory, as a tar)
in a ConfigMap owned by the job, submits the job, follows a rank's log with a live progress
line, and ends with the per-rank table and the root cause; exit 0 when the job Succeeded.
`kubectl dtj status --watch` (watch_status) redraws the status in place.

The pure parts (the objects it creates, the progress line) are functions here with unit tests;
`run` and `watch_status` are the I/O around them, through the SDK.
"""

from __future__ import annotations

import argparse
import base64
import io
import re
import secrets
import sys
import tarfile
import threading
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from torchrun_operator.api.bounds import GPU_RESOURCE
from torchrun_operator.api.names import API_VERSION, KIND, MAX_LABEL_LENGTH
from torchrun_operator.api.status_names import Phase
from torchrun_operator.cli import format as fmt
from torchrun_operator.cli.runtimeopts import add_runtime_options

if TYPE_CHECKING:  # the kubernetes client is imported when a command talks to a cluster
    from torchrun_operator.client import Client, Job

DEFAULT_IMAGE = "pytorch/pytorch:2.15.0-cuda12.8-cudnn9-runtime"
WORKSPACE = "/workspace"
# The code's ConfigMap: Kubernetes refuses one over 1 MiB (its data and binaryData together, and
# binaryData is base64 in the object); leave room for the metadata.
MAX_PAYLOAD_BYTES = 1024 * 1024 - 16 * 1024
TARBALL = "workspace.tar.gz"
# Where the directory's tar is mounted; an init container unpacks it into WORKSPACE.
TARBALL_DIR = "/var/run/dtj-code"
# For a directory, the script to run unless --script says otherwise: the first that exists.
DIR_ENTRY_POINTS = ("train.py", "main.py")


class RunError(ValueError):
    """A user-facing error: the message is printed as is."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "run",
        parents=[common],
        help="run a script (or a directory) as a job, follow its log, exit with its result",
        description="Ship SCRIPT.py (or DIR, as a tar) in a ConfigMap owned by the job, submit "
        "the job, follow a rank's log with a live progress line, print the per-rank table and "
        "the root cause; exit 0 when the job Succeeded, 1 when it Failed.",
    )
    p.add_argument("target", metavar="SCRIPT.py|DIR")
    p.add_argument("args", nargs=argparse.REMAINDER, metavar="-- ARGS", help="the script's")
    p.add_argument("--nodes", type=int, default=1, help="pods, one per node (default 1)")
    p.add_argument(
        "--nproc-per-node",
        default=None,
        help='worker processes per pod: a number, or "gpu" for one per GPU (default: the '
        "GPUs, else 1)",
    )
    p.add_argument(
        "--image",
        help=f"image with torch (default {DEFAULT_IMAGE}, or the runtime's with --runtime)",
    )
    add_runtime_options(
        p,
        "run on the training runtime NAME (docs/runtimes.md): its pod template, image and "
        "settings, with only the script, nodes and the flags given here from this command",
        "the runtime's kind (a DistributedTrainingRuntime is in the job's namespace)",
    )
    p.add_argument("--gpus", type=int, default=0, help="GPUs per pod (nvidia.com/gpu limit)")
    p.add_argument("--name", help="the job's name (default: the script's, and a random suffix)")
    entries = " or ".join(DIR_ENTRY_POINTS)
    p.add_argument("--script", help=f"for DIR: the script in it to run (default {entries})")
    p.add_argument("--rank", type=int, default=0, help="global rank whose log to follow (0)")
    p.add_argument("--detach", "-d", action="store_true", help="submit and exit")
    p.add_argument(
        "--rm", action="store_true", help="delete the job when done or interrupted (no question)"
    )


# ---- what it creates (pure) ----------------------------------------------------------------


def job_name(target: Path, suffix: str) -> str:
    """The script's (or directory's) name as a DNS-1035 label, with a suffix."""
    stem = re.sub(r"[^a-z0-9-]+", "-", target.stem.lower()).strip("-")
    stem = re.sub(r"^[^a-z]+", "", stem) or "job"
    # Room for "-<suffix>" and the pods' "-<index>-a<attempt>" within 63 characters.
    return f"{stem[: MAX_LABEL_LENGTH - len(suffix) - 16].rstrip('-')}-{suffix}"


def tar_directory(directory: Path) -> bytes:
    """The directory as a gzipped tar, its files relative to it (symlinks kept as links)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for path in sorted(directory.rglob("*")):
            if "__pycache__" in path.parts or path.name.endswith(".pyc"):
                continue
            tar.add(path, arcname=str(path.relative_to(directory)), recursive=False)
    return buf.getvalue()


def code_configmap(name: str, target: Path, script: str | None) -> tuple[dict[str, Any], str]:
    """The ConfigMap holding the code, and the script's path in the pod. RunError when the
    target is missing or over the size limit."""
    if target.is_file():
        data = target.read_bytes()
        if len(data) > MAX_PAYLOAD_BYTES:
            raise RunError(_too_big(target, len(data)))
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise RunError(f"{target} is not a UTF-8 text file") from None
        cm = {"data": {target.name: text}}
        return _cm(name, cm), f"{WORKSPACE}/{target.name}"
    if not target.is_dir():
        raise RunError(f"{target}: no such file or directory")
    entry = script or next((e for e in DIR_ENTRY_POINTS if (target / e).is_file()), None)
    if entry is None:
        raise RunError(
            f"{target} has no {' or '.join(DIR_ENTRY_POINTS)}: name the script with --script"
        )
    if not (target / entry).is_file():
        raise RunError(f"{target / entry}: no such file")
    tarball = tar_directory(target)
    # binaryData is base64 in the object: 4 bytes for every 3.
    size = (len(tarball) + 2) // 3 * 4
    if size > MAX_PAYLOAD_BYTES:
        raise RunError(_too_big(target, size))
    cm = {"binaryData": {TARBALL: base64.b64encode(tarball).decode()}}
    return _cm(name, cm), f"{WORKSPACE}/{entry}"


def _too_big(target: Path, size: int) -> str:
    return (
        f"{target} is {size // 1024} KiB in its ConfigMap (base64 for a directory), over the "
        f"{MAX_PAYLOAD_BYTES // 1024} KiB a ConfigMap can hold: leave data and checkpoints out "
        "of it, or build the code into an image (--image)"
    )


def _cm(name: str, content: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, **content}


def job_object(
    args: argparse.Namespace, name: str, configmap: Mapping[str, Any], script: str
) -> dict[str, Any]:
    """The DistributedTrainingJob: `nodes` pods run `python <script> ARGS` from the code's
    ConfigMap (a directory's tar is unpacked by an init container into an emptyDir)."""
    runtime = getattr(args, "runtime", None)
    image = args.image or (None if runtime else DEFAULT_IMAGE)
    trainer: dict[str, Any] = {
        "name": "trainer",
        "command": ["python", script, *script_args(args.args)],
        "volumeMounts": [{"name": "code", "mountPath": WORKSPACE}],
    }
    if image:  # else the runtime's trainer gives it
        trainer["image"] = image
    if args.gpus:
        trainer["resources"] = {"limits": {GPU_RESOURCE: args.gpus}}
    cm_name = configmap["metadata"]["name"]
    pod: dict[str, Any] = {"containers": [trainer]}
    if "binaryData" in configmap:
        if image is None:
            raise RunError(
                "a directory is unpacked by an init container, which needs an image: "
                "give --image with --runtime (or ship one script file)"
            )
        # filter='data' (no absolute paths, no links out) where the image's Python has it.
        unpack = (
            "import tarfile as t;"
            f"t.open('{TARBALL_DIR}/{TARBALL}').extractall('{WORKSPACE}',"
            "**({'filter':'data'} if hasattr(t,'data_filter') else {}))"
        )
        pod["initContainers"] = [
            {
                "name": "unpack",
                "image": image,
                "command": ["python", "-c", unpack],
                "volumeMounts": [
                    {"name": "code", "mountPath": WORKSPACE},
                    {"name": "code-tar", "mountPath": TARBALL_DIR, "readOnly": True},
                ],
            }
        ]
        pod["volumes"] = [
            {"name": "code", "emptyDir": {}},
            {"name": "code-tar", "configMap": {"name": cm_name}},
        ]
    else:
        trainer["volumeMounts"][0]["readOnly"] = True
        pod["volumes"] = [{"name": "code", "configMap": {"name": cm_name}}]
    spec: dict[str, Any] = {"nodes": args.nodes, "template": {"spec": pod}}
    if runtime:
        spec["runtimeRef"] = {"kind": args.runtime_kind, "name": runtime}
    nproc = args.nproc_per_node
    if nproc is not None:
        spec["nprocPerNode"] = nproc if nproc == "gpu" else _positive(nproc, "--nproc-per-node")
    return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}, "spec": spec}


def script_args(rest: list[str]) -> list[str]:
    """The script's arguments: what follows `--` (argparse keeps the `--` in REMAINDER)."""
    return rest[1:] if rest[:1] == ["--"] else rest


def _positive(value: str, flag: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise RunError(f'{flag} must be a positive number or "gpu", not {value!r}')
    return int(value)


def owner_reference(job: Job) -> dict[str, Any]:
    """The job owns the code's ConfigMap (by uid): deleting the job deletes it."""
    return {"apiVersion": API_VERSION, "kind": KIND, "name": job.name, "uid": job.uid}


def progress_line(job: Job, now: datetime) -> str:
    """One line: the phase, ready pods, and the step, rate and ETA when the script reports
    them, e.g. "Running 2/2 pods | step 120/1000, 2.5 steps/s, ETA ... (in 5m49s)"."""
    raw = job.raw.get("status") or {}
    nodes = raw.get("nodes") or {}
    text = f"{job.phase} {nodes.get('ready', 0)}/{nodes.get('desired', job.spec.nodes)} pods ready"
    if raw.get("attempt"):
        text += f", attempt {raw['attempt']}"
    progress = raw.get("progress")
    line = fmt.progress_line(progress, now) if isinstance(progress, Mapping) else None
    return text + (f" | {line}" if line else "")


# ---- I/O ------------------------------------------------------------------------------------


class Screen:
    """Log lines on stdout, the progress line on stderr: redrawn in place on a terminal (the
    log line clears it first), printed when it changes otherwise."""

    def __init__(self, out: TextIO, err: TextIO) -> None:
        self.out, self.err = out, err
        self.tty = err.isatty()
        self.line = ""
        self.lock = threading.Lock()

    def log(self, text: str) -> None:
        with self.lock:
            if self.tty and self.line:
                self.err.write("\r\033[K")
                self.err.flush()
            self.out.write(text + "\n")
            self.out.flush()
            if self.tty and self.line:
                self.err.write(self.line)
                self.err.flush()

    def status(self, line: str) -> None:
        with self.lock:
            if line == self.line:
                return
            self.line = line
            self.err.write(f"\r\033[K{line}" if self.tty else line + "\n")
            self.err.flush()

    def done(self) -> None:
        with self.lock:
            if self.tty and self.line:
                self.err.write("\n")
                self.err.flush()
            self.line = ""


def run(args: argparse.Namespace, sdk: Client, namespace: str) -> int:
    target = Path(args.target)
    name = args.name or job_name(target, secrets.token_hex(3))
    configmap, script = code_configmap(f"{name}-code", target, args.script)
    doc = job_object(args, name, configmap, script)
    from kubernetes import client

    core = client.CoreV1Api(sdk.api_client)
    core.create_namespaced_config_map(namespace, configmap)  # type: ignore[arg-type]
    try:
        job = sdk.submit(doc, namespace=namespace)
    except BaseException as e:
        core.delete_namespaced_config_map(configmap["metadata"]["name"], namespace)
        if isinstance(e, ValueError):  # the job, as the flags and the runtime make it, is invalid
            raise RunError(f"the job is not valid: {e}") from None
        raise
    # Owned once the job exists: its uid is known only now.
    core.patch_namespaced_config_map(
        configmap["metadata"]["name"],
        namespace,
        {"metadata": {"ownerReferences": [owner_reference(job)]}},
    )
    print(f"job {name} submitted in namespace {namespace}", file=sys.stderr)
    if args.detach:
        print(f"follow it: kubectl dtj status {name} --watch -n {namespace}", file=sys.stderr)
        return 0
    screen = Screen(sys.stdout, sys.stderr)
    try:
        final = follow(sdk, job, args.rank, namespace, screen)
    except KeyboardInterrupt:
        screen.done()
        if args.rm or ask(f"delete job {name}? [y/N] "):
            sdk.delete(name, namespace=namespace)
            print(f"job {name} deleted", file=sys.stderr)
        else:
            print(f"job {name} left running: kubectl dtj status {name}", file=sys.stderr)
        return 130
    screen.done()
    print(fmt.format_job_status(final.raw, datetime.now(UTC)))
    if args.rm:
        sdk.delete(name, namespace=namespace)
    return 0 if final.phase == Phase.SUCCEEDED else 1


def follow(sdk: Client, job: Job, rank: int, namespace: str, screen: Screen) -> Job:
    """Rank `rank`'s log (in a thread) and the progress line, until the job finished."""

    from torchrun_operator.client import ClientError

    def logs() -> None:
        try:
            for line in sdk.logs(job.name, rank, follow=True, namespace=namespace):
                screen.log(line)
        except ClientError as e:  # LogsUnavailable, RankNotFound: say so, keep following
            screen.log(f"(no log of rank {rank}: {e})")

    reader = threading.Thread(target=logs, daemon=True, name="logs")
    reader.start()
    last = job
    for last in sdk.watch(job.name, namespace=namespace):
        screen.status(progress_line(last, datetime.now(UTC)))
        if last.finished:
            break
    reader.join(timeout=10)  # the log's end, once the container ended
    return last


def ask(question: str) -> bool:
    if not sys.stdin.isatty():
        return False
    try:
        return input(question).strip().lower() in ("y", "yes")
    except (EOFError, KeyboardInterrupt):
        return False


def watch_status(sdk: Client, name: str, namespace: str, out: TextIO) -> int:
    """`kubectl dtj status --watch`: the status, redrawn in place on every change (printed
    anew, separated by a blank line, when not a terminal); exit 0 when it Succeeded, 1 when it
    Failed."""
    tty = out.isatty()
    job: Job | None = None
    for job in sdk.watch(name, namespace=namespace):
        text = fmt.format_job_status(job.raw, datetime.now(UTC))
        out.write(("\033[H\033[2J" if tty else "\n") + text + "\n")
        out.flush()
        if job.finished:
            break
    return 0 if job is not None and job.phase == Phase.SUCCEEDED else 1
