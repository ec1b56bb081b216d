"""The options that name a training runtime (docs/runtimes.md), shared by `kubectl dtj run`
and `kubectl dtj convert`: both take --runtime NAME and --runtime-kind, with the same choices
and default; only what each command does with the runtime, and so its help, differs."""

from __future__ import annotations

import argparse

from torchrun_operator.api.names import CLUSTER_RUNTIME_KIND, RUNTIME_KIND


def add_runtime_options(p: argparse.ArgumentParser, runtime_help: str, kind_help: str) -> None:
    """--runtime NAME (unset: no runtime) and --runtime-kind (default the cluster-wide kind)."""
    p.add_argument("--runtime", metavar="NAME", help=runtime_help)
    p.add_argument(
        "--runtime-kind",
        choices=[CLUSTER_RUNTIME_KIND, RUNTIME_KIND],
        default=CLUSTER_RUNTIME_KIND,
        help=kind_help,
    )
