"""The agent side: torchrun through its Python API, the patches to torch's internals that
report the rendezvous and dump stacks on a communication failure, signals, and the one
report this launcher writes.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import threading
import time
from typing import Any

from . import rdzvstore, recorded
from .contract import (
    ENV_PROGRESS_FILE,
    ENV_TERMINATION_LOG,
    FAILED,
    LIVE_FINISHED,
    LIVE_RENDEZVOUS,
    LIVE_TRAINING,
    RENDEZVOUS_TIMEOUT,
    SUCCEEDED,
    TERMINATION_LOG,
    FailureRecord,
    Summary,
    is_comm_error,
)
from .logline import log
from .progress import final_checkpoint, monitors, start_progress_monitor
from .progress_file import read_step
from .report import (
    build_summary,
    encode_summary,
    error_text_from_record,
    exit_code_for,
    failure_record,
    failure_sort_key,
    truncate_text,
)
from .shim import worker_entry_args
from .stacks import comm_stacks, dump_own_stacks, on_comm_failure
from .state import rank_info, read_rank_files, state_dir
from .status_server import LIVE
from .stderr import LOGS_DIR, read_stderr_tail, stderr_capture_flags, stderr_log_path
from .storecompat import choose_store_backend

_summary_lock = threading.Lock()
_summary_written = threading.Event()


def write_summary(summary: Summary) -> None:
    """The one way a report leaves the launcher, once: later calls (the signal watchdog racing
    the main thread) do nothing. Adds what only the launcher's state knows (the rendezvous
    round, why progress stalled), then writes it to the termination message and stdout."""
    with _summary_lock:
        if _summary_written.is_set():
            return
        _summary_written.set()
    LIVE.update(state=LIVE_FINISHED)
    round_ = LIVE.get("round")
    if summary.get("groupRank") is not None and round_ is not None:
        summary = {**summary, "round": round_}
    notes = [m.note for m in monitors if m.note]
    if notes and summary.get("state") != SUCCEEDED:
        message = "; ".join([*notes, summary.get("message") or ""]).rstrip("; ")
        summary = {**summary, "message": message}
    if summary.get("failures"):
        # How old each failure is when reported, on this node's clock (docs/pod-contract.md):
        # one recorded while the workers still ran is older than the pod's end says.
        summary = {**summary, "reportedAt": round(time.time(), 3)}
    data = encode_summary(summary)
    path = os.environ.get(ENV_TERMINATION_LOG) or TERMINATION_LOG
    try:
        # open("w") truncates in place: the kubelet bind-mounts this file, so never remove or
        # rename over it.
        with open(path, "wb") as fp:
            fp.write(data)
    except OSError as e:
        log("cannot write termination message", path=path, error=e)
    try:
        sys.stdout.write(data.decode("utf-8") + "\n")
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def _patch_rendezvous_reporting() -> None:
    """Wrap torch's agent rendezvous so LIVE learns this node's rank, its workers' global
    ranks and the rendezvous round the moment the agent completes a round."""
    try:
        from torch.distributed.elastic.agent.server import api as agent_api
    except ImportError:
        return
    cls = agent_api.SimpleElasticAgent
    original = cls._rendezvous
    if getattr(original, "_torchrun_operator", False):
        return

    def _rendezvous(self: Any, worker_group: Any) -> None:
        LIVE.update(state=LIVE_RENDEZVOUS)
        # A new round: the last round's stopped workers were torch's own restart's business.
        _stopped.clear()
        original(self, worker_group)
        try:
            spec = worker_group.spec
            handler = getattr(spec, "rdzv_handler", None)
            holder = getattr(handler, "_state_holder", None)
            rdzv_round = getattr(getattr(holder, "state", None), "round", None)
            remaining = getattr(self, "_remaining_restarts", None)
            restarts = spec.max_restarts - remaining if isinstance(remaining, int) else None
            ranks = sorted(int(w.global_rank) for w in worker_group.workers)
            LIVE.update(
                state=LIVE_TRAINING,
                groupRank=int(worker_group.group_rank),
                groupWorldSize=int(worker_group.group_world_size),
                ranks=ranks,
                round=rdzv_round if isinstance(rdzv_round, int) else None,
                restarts=restarts,
                rendezvousAt=round(time.time(), 3),
            )
            LIVE.set_stall(None)
            log(
                "rendezvous complete",
                round=rdzv_round,
                node_rank=worker_group.group_rank,
                ranks=",".join(map(str, ranks)),
            )
        except Exception as e:  # noqa: BLE001 - reporting must never break training
            log("cannot report rendezvous", error=f"{type(e).__name__}: {e}")

    _rendezvous._torchrun_operator = True  # type: ignore[attr-defined]
    cls._rendezvous = _rendezvous  # type: ignore[method-assign]


def _failure_text(pf: Any, log_dir: str | None) -> str:
    """What a failed worker said: its recorded error, else the tail of its stderr."""
    text = error_text_from_record(getattr(pf, "error_file_data", None))
    if text:
        return text
    local_rank = getattr(pf, "local_rank", None)
    if not isinstance(local_rank, int):
        return ""
    return read_stderr_tail(stderr_log_path(log_dir, local_rank) if log_dir else None) or ""


_handlers: list[Any] = []  # the agent's rendezvous handler, once its run loop started
_agents: list[Any] = []  # the agent, once its run loop started
# The last stop of the workers: the process context stopped and how each worker ended
# (launcher/recorded.py). Whatever ends the agent, its report holds what they recorded.
_stopped: list[tuple[Any, list[recorded.WorkerEnd]]] = []
_dirs: list[tuple[str, str | None]] = []  # (state dir, workers' log dir) once run_agent set them


def _global_ranks(sdir: str) -> dict[int, int]:
    """Global rank by local rank: the agent's worker group, else the workers' rank files."""
    group: Any = getattr(_agents[0], "_worker_group", None) if _agents else None
    try:
        ranks = {int(w.local_rank): int(w.global_rank) for w in group.workers}
    except (AttributeError, TypeError, ValueError):
        ranks = {}
    if ranks and all(r >= 0 for r in ranks.values()):
        return ranks
    out: dict[int, int] = {}
    for r in read_rank_files(sdir):
        try:
            if int(r["rank"]) >= 0:
                out[int(r["localRank"])] = int(r["rank"])
        except (KeyError, TypeError, ValueError):
            continue
    return out


def recorded_failures(log_dir: str | None) -> list[FailureRecord]:
    """What the stopped workers recorded (launcher/recorded.py), from the last stop."""
    return recorded.failures(_stopped[0][1], log_dir) if _stopped else []


def _look_after_kill(sdir: str) -> None:
    """The watchdog's stop (the main thread is stuck): the agent's workers as they are now."""
    if _stopped or not _agents:
        return
    pcontext = getattr(_agents[0], "_pcontext", None)
    if pcontext is None:
        return
    stop = recorded.Stop(pcontext)
    stop.before(bound=0.0)
    _stopped[:] = [(pcontext, stop.after(_global_ranks(sdir)))]


def _failed_key(handler: Any) -> str | None:
    """The store key an agent whose workers failed sets for the current rendezvous round,
    before torch closes the rendezvous: the other agents tell that closure from the one after
    every agent passed the exit barrier (success)."""
    run_id = getattr(getattr(handler, "_settings", None), "run_id", None)
    state = getattr(getattr(handler, "_state_holder", None), "state", None)
    round_ = getattr(state, "round", None)
    if run_id is None or not isinstance(round_, int):
        return None
    return f"torchrun-operator/{run_id}/{round_}/workers-failed"


RENDEZVOUS_CLOSED = (
    "the rendezvous was closed while this node's workers ran: another node's agent ended "
    "(its workers failed)"
)


def _patch_comm_failure_stacks(sdir: str, log_dir: str | None) -> None:
    """Wrap torchrun's process context, run loop and rendezvous handler: when a worker failed
    with an error that says communication, the run loop ended on a lost store, or another
    node's agent closed the rendezvous while this node's workers run, the workers still
    running dump their stacks before torchrun stops them (its process context stops them the
    moment it sees a failure, before the agent hears of it)."""
    try:
        from torch.distributed.elastic.agent.server import api as agent_api
        from torch.distributed.elastic.multiprocessing import api as mp_api
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as rdzv
        from torch.distributed.elastic.rendezvous.api import RendezvousClosedError
    except ImportError:
        return
    close = mp_api.PContext.close
    invoke = agent_api.SimpleElasticAgent._invoke_run
    waiting = rdzv.DynamicRendezvousHandler.num_nodes_waiting
    if getattr(close, "_torchrun_operator", False):
        return

    def _close(self: Any, *args: Any, **kwargs: Any) -> None:
        if _stopped and _stopped[0][0] is self:
            # Stopped already (torch closes again on its way out): the first look stands; a
            # second would take the workers the first stop ended for ones that exited first.
            close(self, *args, **kwargs)
            return
        try:
            failures = getattr(self, "_failures", None)
            key = _failed_key(_handlers[0]) if failures and _handlers else None
            if key is not None:
                _handlers[0]._store.set(key, "1")  # before torch closes the rendezvous
            for pf in failures.values() if isinstance(failures, dict) else []:
                text = _failure_text(pf, log_dir)
                if is_comm_error(text):
                    on_comm_failure(sdir, text.strip().splitlines()[-1])
                    break
        except Exception as e:  # noqa: BLE001 - the dump must never change the run
            log("cannot dump stacks", error=f"{type(e).__name__}: {e}")
        stop = recorded.Stop(self)
        try:
            stop.before()
        except Exception as e:  # noqa: BLE001 - looking must never keep the workers running
            log("cannot look at workers", error=f"{type(e).__name__}: {e}")
        try:
            close(self, *args, **kwargs)
        finally:
            try:
                _stopped[:] = [(self, stop.after(_global_ranks(sdir)))]
            except Exception as e:  # noqa: BLE001 - the report must still be written
                log("cannot look at workers", error=f"{type(e).__name__}: {e}")

    def _invoke_run(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            spec = getattr(getattr(self, "_worker_group", None), "spec", None)
            handler = getattr(spec, "rdzv_handler", None)
            if handler is not None:
                _handlers[:] = [handler]
            _agents[:] = [self]
            return invoke(self, *args, **kwargs)
        except Exception as e:
            text = f"{type(e).__name__}: {e}"
            if is_comm_error(text):
                try:
                    on_comm_failure(sdir, text)
                except Exception as dump_error:  # noqa: BLE001 - the error must propagate
                    log("cannot dump stacks", error=f"{dump_error}")
            raise

    def num_nodes_waiting(self: Any) -> int:
        # The agent asks this while its workers are healthy, having synced the rendezvous
        # state. A closed rendezvous whose round another agent marked failed (above) means
        # that agent gave up for good: this node's workers wait for a peer that is gone. The
        # one that is not inside a collective is the one the others waited for: dump, and
        # end like a lost store. (torch also closes the rendezvous after success, once every
        # agent passed the exit barrier or a late one's barrier timed out: no mark then.)
        count = waiting(self)
        state = getattr(getattr(self, "_state_holder", None), "state", None)
        if getattr(state, "closed", False) is True:
            key = _failed_key(self)
            try:
                failed = key is not None and bool(self._store.check([key]))
            except Exception:  # noqa: BLE001 - no store, no verdict: carry on as torch does
                failed = False
            if failed:
                on_comm_failure(sdir, RENDEZVOUS_CLOSED)
                raise RendezvousClosedError(RENDEZVOUS_CLOSED)
        return int(count)

    _close._torchrun_operator = True  # type: ignore[attr-defined]
    mp_api.PContext.close = _close  # type: ignore[method-assign]
    agent_api.SimpleElasticAgent._invoke_run = _invoke_run  # type: ignore[method-assign]
    rdzv.DynamicRendezvousHandler.num_nodes_waiting = num_nodes_waiting  # type: ignore[method-assign]


class Terminated(Exception):
    """SIGTERM/SIGINT before torch's agent took over signal handling."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"launcher got signal {signal.Signals(signum).name}")
        self.signum = signum


_python_handler_ran = threading.Event()


def early_signal_handler(signum: int, frame: Any) -> None:
    _python_handler_ran.set()
    raise Terminated(signum)


def _kill_children() -> None:
    """SIGKILL the process groups of our children (torchrun workers run in their own)."""
    me = os.getpid()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fp:
                stat = fp.read()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid != me:
            continue
        try:
            pgid = os.getpgid(pid)
            if pgid != os.getpgid(0):
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def start_signal_watchdog(grace: float) -> None:
    """Exit promptly on SIGTERM even when the main thread is stuck in C++ (a TCPStore call
    during rendezvous does not return to the interpreter, so no Python handler runs).

    The C-level handler writes the signal number to a wakeup fd even then; this thread reads
    it. If the Python handler ran, torch's agent is shutting its workers down: give it
    ``grace`` seconds. Otherwise force the exit after a short pause.
    """
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def watch() -> None:
        while True:
            try:
                data = os.read(r, 16)
            except OSError:
                return
            sigs = [b for b in data if b in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)]
            if not sigs:
                continue
            sig = signal.Signals(sigs[0]).name
            stuck = not _python_handler_ran.wait(3.0)
            if not stuck:
                time.sleep(grace)
            log(
                "forcing exit after signal",
                signal=sig,
                reason="main thread unresponsive" if stuck else f"shutdown exceeded {grace:g}s",
            )
            _kill_children()
            failures: list[FailureRecord] = []
            if _dirs:
                try:
                    _look_after_kill(_dirs[0][0])
                    failures = recorded_failures(_dirs[0][1])
                except Exception as e:  # noqa: BLE001 - the report must still be written
                    log("cannot look at workers", error=f"{type(e).__name__}: {e}")
            write_summary(
                build_summary(FAILED, message=f"launcher terminated by {sig}", failures=failures)
            )
            os._exit(1)

    threading.Thread(target=watch, daemon=True, name="signal-watchdog").start()


def _patch_torch_signal_handler() -> None:
    """torch's agent installs its own handler when workers start; wrap it so the watchdog knows
    the Python-level shutdown is under way."""
    try:
        from torch.distributed.elastic.multiprocessing import api as mp_api
    except ImportError:
        return
    original = getattr(mp_api, "_terminate_process_handler", None)
    if original is None or getattr(original, "_torchrun_operator", False):
        return

    def handler(signum: int, frame: Any) -> None:
        _python_handler_ran.set()
        original(signum, frame)

    handler._torchrun_operator = True  # type: ignore[attr-defined]
    mp_api._terminate_process_handler = handler
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)


def run_agent(flags: list[str], cmd: list[str], store_wait: float = 0.0) -> int:
    """Everything after the DNS wait: build torchrun's config, reach the rendezvous store
    where it is (rdzvstore: over loopback on its host, else once it answers, waiting at most
    `store_wait` seconds), run the agent, summarise."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import (
        RendezvousError,
        RendezvousTimeoutError,
    )
    from torch.distributed.launcher.api import launch_agent
    from torch.distributed.run import config_from_args, get_args_parser

    _patch_torch_signal_handler()
    _patch_rendezvous_reporting()

    sdir = state_dir()
    step_file = os.environ.get(ENV_PROGRESS_FILE)
    start_progress_monitor(sdir)
    parser = get_args_parser()
    own_log_dir = os.path.join(sdir, LOGS_DIR)
    flags, log_dir = stderr_capture_flags(flags, os.environ, own_log_dir)
    _patch_comm_failure_stacks(sdir, log_dir)
    _dirs[:] = [(sdir, log_dir)]
    if log_dir == own_log_dir:  # the emptyDir outlives the container: drop the last one's logs
        shutil.rmtree(own_log_dir, ignore_errors=True)
    # The placeholder script is replaced below: only the launch configuration is taken from
    # torchrun's parser, so the user's command never meets argparse.
    try:
        args = parser.parse_args([*flags, "--no-python", "__torchrun_operator_worker__"])
    except SystemExit as e:  # argparse already printed why
        raise ValueError(f"invalid torchrun flags (argparse exit {e.code}): {flags}") from None
    if args.standalone:
        raise ValueError("--standalone is not supported: the operator runs c10d rendezvous")
    if args.master_port is None:
        args.master_port = 29500
    config, _, _ = config_from_args(args)
    choose_store_backend(os.environ)
    if rdzvstore.hosts_store(config.rdzv_configs):
        config.rdzv_endpoint = rdzvstore.loopback_endpoint(config.rdzv_endpoint)
    elif config.rdzv_endpoint:
        rdzvstore.wait_for_store(config.rdzv_endpoint, store_wait)
    entrypoint = sys.executable
    entry_args = worker_entry_args(cmd)
    log(
        "starting torchrun agent",
        nnodes=args.nnodes,
        nproc_per_node=config.nproc_per_node,
        rdzv_endpoint=config.rdzv_endpoint,
        rdzv_id=config.run_id,
        max_restarts=config.max_restarts,
        command=" ".join(cmd),
    )

    # Every way the agent ends comes down to the same report: a state, the failures or a
    # message, the ranks this node ran (from the workers' rank files, else those torch names)
    # and the exit code; one place writes it.
    failures: list[FailureRecord] = []
    message: str | None = None
    known_ranks: list[int] = []
    try:
        results = launch_agent(config, entrypoint, entry_args)
        state, code, known_ranks = SUCCEEDED, 0, list(results or {})
    except ChildFailedError as e:
        failures = [
            failure_record(
                rank=grank,
                local_rank=pf.local_rank,
                exitcode=pf.exitcode,
                error_file_data=pf.error_file_data,
                fallback_message=pf.message if isinstance(pf.message, str) else "",
                timestamp=pf.timestamp,
                stderr=None
                if error_text_from_record(pf.error_file_data)
                else read_stderr_tail(stderr_log_path(log_dir, pf.local_rank)),
            )
            for grank, pf in e.failures.items()
        ]
        # torch names the workers that had exited when it looked; one that raised while it
        # stopped the others is in the launcher's look only.
        failures = recorded.merged(failures, recorded_failures(log_dir))
        state, code, known_ranks = FAILED, exit_code_for(failures), list(e.failures)
    except RendezvousTimeoutError as e:
        state, code = RENDEZVOUS_TIMEOUT, 1
        message = (
            f"rendezvous did not complete in time (join_timeout) at "
            f"{config.rdzv_endpoint}: not all nodes joined" + (f": {e}" if str(e) else "")
        )
        log("rendezvous timed out", endpoint=config.rdzv_endpoint)
        dump_own_stacks("rendezvous timed out")
    except (RendezvousError, SignalException, Terminated) as e:
        # Another node's agent ended, the store was lost, or we were told to stop: whatever
        # this node's workers recorded before they were stopped is still this report's.
        failures = recorded_failures(log_dir)
        state, code = FAILED, exit_code_for(failures)
        message = f"{type(e).__name__}: {e}"
        if isinstance(e, SignalException):
            message = f"launcher terminated by {e.sigval.name}; workers stopped ({message})"
        log("agent stopped", error=message)
    for f in sorted(failures, key=failure_sort_key):
        last_line = f["error"].strip().splitlines()[-1] if f["error"].strip() else ""
        log(
            "worker failed",
            rank=f["rank"],
            local_rank=f["localRank"],
            exit_code=f["exitCode"],
            kind=f["kind"],
            error=truncate_text(last_line, 300),
        )

    group_rank, ranks, restarts = rank_info(sdir, known_ranks)
    if state == SUCCEEDED:
        log(
            "training succeeded",
            group_rank=group_rank,
            ranks=",".join(map(str, ranks)),
            restarts=restarts,
        )
    write_summary(
        build_summary(
            state,
            group_rank=group_rank,
            ranks=ranks,
            restarts=restarts,
            failures=failures,
            message=message,
            step=read_step(step_file),
            checkpoint=final_checkpoint(step_file),
            stacks=comm_stacks,
        )
    )
    return code
