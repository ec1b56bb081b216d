"""The fault campaign's operators (tests/integration/faultrun.py): each a process of its own
with its log, its fault log and its metrics, none outliving its run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from dtj import REPO
from localkube.procs import free_port


class Operator:
    """One operator process, scoped to the run's namespace (so that its metrics count the
    reconciles of this run's job alone), with its log and its fault log."""

    def __init__(
        self,
        kubeconfig: Path,
        ns: str,
        log: Path,
        env: dict[str, str],
        rules: list[tuple[str, dict[str, Any]]],
        elect: bool = False,
        args: tuple[str, ...] = (),
    ) -> None:
        """`elect`: one of several replicas, electing a leader on the run's namespace's
        Lease. An empty `ns` watches every namespace (bench/restart_modes.py)."""
        self.log_path = log
        self.rules = rules  # (kind, rule) as given to its fault seam
        self.fault_log = log.with_suffix(".faults")
        self.metrics_port = free_port()
        env = dict(os.environ, KUBECONFIG=str(kubeconfig), **env)
        env["PYTHONPATH"] = os.pathsep.join([str(REPO / "operator"), env.get("PYTHONPATH", "")])
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "torchrun_operator.main",
                 *(["--namespace", ns] if ns else []),
                 "--liveness-port", "0", "--metrics-port", str(self.metrics_port),
                 *(["--leader-election-namespace", ns] if elect else []), *args],
                env=env, stdout=out, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.killed_by_us = False

    def stop(self) -> None:
        """SIGKILL from the campaign (not an exit of the operator's own)."""
        if self.proc.poll() is None:
            self.killed_by_us = True
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=30)

    def fired(self) -> list[dict[str, Any]]:
        if not self.fault_log.exists():
            return []
        return [json.loads(line) for line in self.fault_log.read_text().splitlines() if line]

    def reconciles(self) -> float:
        """How many reconciles this process finished (0 until its metrics answer)."""
        try:
            url = f"http://127.0.0.1:{self.metrics_port}/metrics"
            with urllib.request.urlopen(url, timeout=5) as r:
                text = r.read().decode()
        except OSError:
            return 0.0
        for line in text.splitlines():
            if line.startswith("torchrun_operator_reconcile_duration_seconds_count "):
                return float(line.split()[1])
        return 0.0


@contextmanager
def stopping(operators: list[Operator]) -> Iterator[None]:
    """However a run ends (an error, ^C), none of its operators outlives it."""
    try:
        yield
    finally:
        for o in operators:
            o.stop()
