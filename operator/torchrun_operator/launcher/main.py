"""torchrun-operator in-pod launcher: argument parsing and the top-level run.

Usage (as the operator renders it, see docs/pod-contract.md):

    python /opt/torchrun-operator/launcher.pyz <torchrun flags> -- <user command...>

The launcher is PID 1 of the trainer container. It waits (bounded) until the rendezvous host name
resolves, runs torchrun through its Python API with the worker shim as the worker entrypoint
(shim.worker_entry_args), and writes a compact JSON summary of this node's ranks to the
termination-message file, where the operator reads it. While it runs, it serves what it knows
(its node rank and global ranks once rendezvous completed, the script's progress, the stacks of
a stalled rank) read-only at ``GET /status`` on the status port, where the operator reads it.

The launcher ships as a zipapp in a ConfigMap (render/configmap.py) into arbitrary images: its
modules depend on nothing but the standard library and torch, import each other relatively,
and import torch lazily so ``--help`` and the pure helpers work without it.
"""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback

from .agent import (
    Terminated,
    early_signal_handler,
    run_agent,
    start_signal_watchdog,
    write_summary,
)
from .contract import (
    DNS_TIMEOUT,
    ENV_DNS_TIMEOUT,
    ENV_INDEX,
    ENV_LOCAL_RANK_ARG,
    ENV_NODE_RANK,
    ENV_PROGRESS_FILE,
    ENV_PROGRESS_TIMEOUT,
    ENV_PROGRESS_WINDOW,
    ENV_STATE_DIR,
    ENV_STATUS_PORT,
    ENV_TERMINATION_LOG,
    ERROR,
    FAILED,
    STATE_DIR,
    STATUS_PATH,
    STATUS_PORT,
    TERMINATION_LOG,
)
from .logline import log
from .progress import DEFAULT_PROGRESS_WINDOW
from .rdzvstore import conf_hosts_store, wait_for_dns
from .report import build_summary
from .shim import worker_main
from .state import reset_state_dir, state_dir
from .status_server import LIVE, start_status_server
from .torchrun_flags import endpoint_host, flag_value, shutdown_timeout, split_argv

DEFAULT_DNS_TIMEOUT = 300.0

USAGE = f"""\
usage: python launcher.pyz <torchrun flags> -- <command> [args...]
       python launcher.pyz --worker <command> [args...]   (internal: torchrun's entrypoint)

Runs torchrun (torch.distributed.run flags, PET_* env also accepted) with <command> as the
program of every worker, and writes a JSON summary to the termination-message file.

environment:
  {ENV_STATE_DIR}: state dir, holds 'ready' and 'rank-<local rank>.json'
      (default {STATE_DIR})
  {ENV_DNS_TIMEOUT}: seconds a pod that does not host the store waits for the rendezvous
      host to resolve, and for the store to answer at an address it resolves to
      (default {DEFAULT_DNS_TIMEOUT:g})
  {ENV_TERMINATION_LOG}: where the JSON summary goes (default {TERMINATION_LOG})
  {ENV_PROGRESS_FILE}: optional file a training script writes its step number to
  {ENV_PROGRESS_TIMEOUT}: optional seconds; when the progress file has not changed for this
      long after rendezvous, 'ready' is removed (the pod turns NotReady) and 'stalled' written
  {ENV_LOCAL_RANK_ARG}: optional --local-rank or --local_rank; each worker's script then gets
      <that>=<LOCAL_RANK> right after it, as torch.distributed.launch passed it
  {ENV_STATUS_PORT}: port of the read-only GET {STATUS_PATH} endpoint (default
      {STATUS_PORT}; 0: none)
  {ENV_PROGRESS_WINDOW}: seconds steps per second and step time are averaged over
      (default {DEFAULT_PROGRESS_WINDOW:g})
"""


def _dns_timeout() -> float:
    raw = os.environ.get(ENV_DNS_TIMEOUT, "")
    try:
        return float(raw) if raw else DEFAULT_DNS_TIMEOUT
    except ValueError:
        log("ignoring invalid DNS timeout", value=raw)
        return DEFAULT_DNS_TIMEOUT


def launcher_main(argv: list[str]) -> int:
    try:
        flags, cmd = split_argv(argv)
    except ValueError as e:
        sys.stderr.write(USAGE)
        log("bad arguments", error=e)
        write_summary(build_summary(ERROR, message=f"launcher: {e}"))
        return 2

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, early_signal_handler)
    start_signal_watchdog(shutdown_timeout(flags) + 5.0)

    index = os.environ.get(ENV_INDEX) or os.environ.get(ENV_NODE_RANK)
    log("launcher starting", pid=os.getpid(), index=index or "?", state_dir=state_dir())
    reset_state_dir(state_dir())
    LIVE.update(
        index=int(index) if index and index.isdigit() else None,
        rdzvId=flag_value(flags, ("--rdzv-id", "--rdzv_id")) or os.environ.get("PET_RDZV_ID"),
    )
    start_status_server()
    progress_file = os.environ.get(ENV_PROGRESS_FILE)
    if progress_file and os.path.exists(progress_file):
        try:  # a previous container's step is not this one's progress
            os.remove(progress_file)
        except OSError as e:
            log("cannot remove old progress file", path=progress_file, error=e)
    try:
        host = endpoint_host(flags, os.environ)
        conf = flag_value(flags, ("--rdzv-conf", "--rdzv_conf")) or os.environ.get("PET_RDZV_CONF")
        if conf_hosts_store(conf):
            host = None  # it reaches its own store over loopback (rdzvstore), never by name
        timeout = _dns_timeout()
        started = time.monotonic()
        if host and not wait_for_dns(host, timeout):
            message = (
                f"rendezvous host {host!r} did not resolve within {timeout:g}s "
                f"({ENV_DNS_TIMEOUT}); is the headless Service there and does it "
                f"publish not-ready addresses?"
            )
            log("DNS wait timed out", host=host, timeout=f"{timeout:g}s")
            write_summary(build_summary(DNS_TIMEOUT, message=message))
            return 1
        # The store's wait shares the bound: a name that resolves to a stale address is no
        # better than one that does not resolve (rdzvstore).
        return run_agent(flags, cmd, store_wait=timeout - (time.monotonic() - started))
    except Terminated as e:
        log("terminated before training started", signal=signal.Signals(e.signum).name)
        write_summary(build_summary(FAILED, message=str(e)))
        return 1
    except Exception as e:  # noqa: BLE001 - a launcher bug must still leave a summary
        tb = traceback.format_exc()
        sys.stderr.write(tb)
        log("launcher error", error=f"{type(e).__name__}: {e}")
        message = f"launcher error: {type(e).__name__}: {e}\n{tb}"
        write_summary(build_summary(ERROR, message=message))
        return 1


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "--worker":
        return worker_main(argv[2:] if argv[1:2] == ["--"] else argv[1:])
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    return launcher_main(argv)
