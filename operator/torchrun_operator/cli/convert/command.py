"""The command line of kubectl dtj convert: reads, converts, prints; one line per warning or
error on stderr, exit status 1 for any error."""

from __future__ import annotations

import argparse
import json
import shlex
import sys
from typing import Any

import yaml

from torchrun_operator.api import names
from torchrun_operator.api.runtimemerge import merge
from torchrun_operator.cli.runtimeopts import add_runtime_options

from .load import MAX_INPUT_BYTES, documents
from .mapping import convert
from .onruntime import onto_runtime
from .result import ConvertError, validate


def _say(kind: str, text: str) -> None:
    """One line on stderr: keys and values from the input may hold newlines or control
    characters, shown escaped."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    print(f"{kind}: {shown}", file=sys.stderr)


def _name(doc: dict[str, Any]) -> str:
    """The object's kind and name for messages, whatever their types."""
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    kind = doc.get("kind")
    return f"{kind if isinstance(kind, str) else '?'} {name if isinstance(name, str) else '?'}"


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser(
        "convert",
        parents=[common],
        help="print a Kubeflow PyTorchJob as a DistributedTrainingJob",
        description="Print the DistributedTrainingJob equivalent to a Kubeflow PyTorchJob "
        "(kubeflow.org/v1); what cannot be carried over is listed on stderr "
        "(docs/migrating.md).",
    )
    p.add_argument(
        "-f", "--filename", default="-", help="the PyTorchJob's YAML or JSON (default: stdin)"
    )
    p.add_argument(
        "--entrypoint",
        help="the command the image's ENTRYPOINT runs, for a container without one, e.g. "
        "'python /opt/mnist/src/mnist.py'",
    )
    p.add_argument("-o", "--output", choices=["yaml", "json"], default="yaml")
    add_runtime_options(
        p,
        "name the training runtime NAME (docs/runtimes.md) and keep only what differs "
        "from it; the runtime is read from the cluster unless --runtime-file gives it",
        "the runtime's kind (a DistributedTrainingRuntime is read from -n's namespace)",
    )
    p.add_argument("--runtime-file", help="the runtime's YAML, instead of reading the cluster")


def load_runtime(path: str) -> dict[str, Any]:
    """A runtime from a file: one ClusterDistributedTrainingRuntime or
    DistributedTrainingRuntime document."""
    with open(path) as f:
        docs = documents(f.read(MAX_INPUT_BYTES + 1))
    if len(docs) != 1 or docs[0].get("kind") not in (
        names.CLUSTER_RUNTIME_KIND,
        names.RUNTIME_KIND,
    ):
        raise ConvertError(
            f"{path}: expected one {names.CLUSTER_RUNTIME_KIND} or {names.RUNTIME_KIND}"
        )
    return docs[0]


def run(args: argparse.Namespace, runtime: dict[str, Any] | None = None) -> int:
    """`runtime`: the runtime --runtime names, as read from the cluster (main.py); else
    --runtime-file's."""
    try:
        if args.filename == "-":
            text = sys.stdin.read(MAX_INPUT_BYTES + 1)  # more is refused: read no further
        else:
            with open(args.filename) as f:
                text = f.read(MAX_INPUT_BYTES + 1)
        docs = documents(text)
    except (OSError, UnicodeDecodeError, ConvertError) as e:
        _say("error", str(e))
        return 1
    if not docs:
        _say("error", "no PyTorchJob in the input")
        return 1
    if getattr(args, "runtime_file", None):
        try:
            runtime = load_runtime(args.runtime_file)
        except (OSError, UnicodeDecodeError, ConvertError) as e:
            _say("error", str(e))
            return 1
    try:
        entrypoint = shlex.split(args.entrypoint) if args.entrypoint else None
    except ValueError as e:
        _say("error", f"--entrypoint {args.entrypoint!r}: {e}")
        return 1
    status = 0
    jobs = []
    for doc in docs:
        what = _name(doc)
        try:
            result = convert(doc, entrypoint)
        except ConvertError as e:
            _say("error", f"{what}: {e}")
            status = 1
            continue
        for w in result.warnings:
            _say("warning", f"{what}: {w}")
        for err in result.errors:
            _say("error", f"{what}: {err}")
            status = 1
        job = result.job
        merged = job
        if runtime is not None:
            job = onto_runtime(job, runtime)
            merged = {**job, "spec": merge(runtime.get("spec") or {}, job["spec"])}
        invalid = validate(merged)
        if invalid:
            _say("error", f"{what}: the result is not a valid {names.KIND} until edited: {invalid}")
            status = 1
        jobs.append(job)
    if not jobs:
        return status
    if args.output == "json":
        listed = {"apiVersion": "v1", "kind": "List", "items": jobs}
        print(json.dumps(jobs[0] if len(jobs) == 1 else listed, indent=2))
    else:
        print("---\n".join(yaml.safe_dump(j, sort_keys=False) for j in jobs), end="")
    return status
