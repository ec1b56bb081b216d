"""Starting, probing and stopping the component processes; the I/O half of the control plane."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path


class ComponentError(RuntimeError):
    """A component failed to start or become healthy; the message carries its log's tail."""


# Ports handed out for a process to bind later come from below the kernel's ephemeral range
# (ip_local_port_range): a port that bind(0) found free is one the kernel may give the next
# outgoing connection (a kubectl, a watch, a torch store client) before the process binds it,
# which is how a busy machine turned a test's torchrun store into "address already in use".
# Outside that range only another listener can take it, and those are ours.
EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
LISTEN_PORTS = (10000, 32768)  # Linux's default ephemeral range starts at 32768


def listen_range(path: str = EPHEMERAL_RANGE_FILE) -> range:
    """Ports to listen on that the kernel does not hand out to outgoing connections."""
    low, high = LISTEN_PORTS
    try:
        ephemeral_low, ephemeral_high = map(int, Path(path).read_text().split())
    except (OSError, ValueError):
        return range(low, high)
    if ephemeral_low - low >= 1000:  # room below the ephemeral range
        return range(low, min(high, ephemeral_low))
    return range(ephemeral_high + 1, 65536)  # a range moved low: take what is above it


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(n: int, ports: range | None = None) -> list[int]:
    """n distinct ports free on 127.0.0.1 now, outside the ephemeral range (see above)."""
    candidates = ports or listen_range()
    # Held open together so the n ports are distinct and each was free.
    socks: list[socket.socket] = []
    try:
        for port in random.sample(candidates, min(len(candidates), 64 * n)):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                s.close()
                continue
            socks.append(s)
            if len(socks) == n:
                return [int(s.getsockname()[1]) for s in socks]
        raise OSError(f"no {n} free ports in {candidates}")
    finally:
        for s in socks:
            s.close()


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        data = path.read_bytes()[-16384:].decode(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(data.splitlines()[-lines:])


PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: the kernel sends SIGTERM when the thread that
    # started it exits, so a killed test session leaves no control plane running.
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)


def start(
    argv: list[str],
    log: Path,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
    die_with_parent: bool = False,
) -> subprocess.Popen[bytes]:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        # A session of its own: the components outlive the CLI that started them, and a
        # Ctrl-C in the caller's terminal does not reach them.
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent if die_with_parent else None,
        )


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers kill(0); it is dead for our purposes.
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def is_ours(pid: int, marker: str) -> bool:
    """Whether a recorded PID still names our process (PIDs are reused): its command line
    mentions our cluster directory or our binary."""
    return pid_alive(pid) and any(marker in a for a in cmdline(pid))


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)


def stop(pid: int, grace: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds."""
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        _reap(pid)
        if not pid_alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    for _ in range(100):
        _reap(pid)
        if not pid_alive(pid):
            return
        time.sleep(0.05)


def http_ok(url: str, ctx: ssl.SSLContext | None = None, timeout: float = 2.0) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=ctx) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError, ValueError):
        return False


def insecure_context() -> ssl.SSLContext:
    """For loopback health endpoints of components that serve self-signed certificates."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def client_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(ca))
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key) if key else None)
    return ctx


def wait_until(
    name: str,
    check: Callable[[], bool],
    proc: subprocess.Popen[bytes] | None,
    log: Path,
    timeout: float,
    interval: float = 0.2,
) -> None:
    """Polls `check` until it is true; fails fast when the process exits, and always with the
    tail of the component's log."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return
        if proc is not None and proc.poll() is not None:
            raise ComponentError(
                f"{name} exited with code {proc.returncode} before it was healthy; "
                f"last lines of {log}:\n{log_tail(log)}"
            )
        if time.monotonic() > deadline:
            raise ComponentError(
                f"{name} not healthy after {timeout:.0f}s; last lines of {log}:\n{log_tail(log)}"
            )
        time.sleep(interval)


def mounts_under(dir: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> list[str]:
    """Mount points at or below `dir` in a mount namespace (by default ours), deepest first."""
    root = str(dir.resolve())
    found = []
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return []
    for line in lines:
        parts = line.split()
        if len(parts) < 5:
            continue
        # mountinfo escapes spaces and the like as octal
        point = parts[4].encode().decode("unicode_escape")
        if point == root or point.startswith(root + "/"):
            found.append(point)
    return sorted(set(found), key=len, reverse=True)


def mounted_in_any_namespace(path: Path, proc: Path = Path("/proc")) -> bool:
    """Whether `path`, or anything below it, is a mount point in any process's mount
    namespace (each namespace read once). Removing such a directory on the host detaches
    those mounts in the other namespaces: the pods of another cluster on this host, using a
    mountpoint this one created, would lose their volume."""
    seen: set[str] = set()
    for pid in proc.iterdir():
        if not pid.name.isdigit():
            continue
        try:
            ns = os.readlink(pid / "ns" / "mnt")
        except OSError:
            continue  # gone, or not ours to read
        if ns in seen:
            continue
        seen.add(ns)
        if mounts_under(path, pid / "mountinfo"):
            return True
    return False


def unmount_under(dir: Path) -> list[str]:
    done = []
    for point in mounts_under(dir):
        r = subprocess.run(["umount", "-l", point], capture_output=True, text=True)
        if r.returncode == 0:
            done.append(point)
    return done


def processes_mentioning(marker: str) -> list[int]:
    """PIDs whose command line mentions `marker` (our cluster directory)."""
    me = os.getpid()
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        if pid_alive(pid) and any(marker in a for a in cmdline(pid)):
            pids.append(pid)
    return pids
