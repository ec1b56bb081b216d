"""Container shim: `python -m localkube.node.shim SPEC.json`.

Runs as a child of the node process. It joins the pod's network namespace, creates a private
mount, UTS and PID namespace, then forks: the child becomes PID 1 of the new PID namespace
(so when it exits the kernel kills every process left in the container), does the bind
mounts and hostname, and execs the container command. The parent stays in the host PID
namespace, writes the child's host PID to `pidfile` (the node signals that PID directly, as
a kubelet signals a container's main process), waits, and writes the exit status as JSON to
`statusfile`. An exec failure is recorded in `starterror` and exits 128.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_PDEATHSIG = 1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(rc: int, what: str) -> None:
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def mount(source: str | None, target: str, fstype: str | None, flags: int, data: str = "") -> None:
    _check(
        _libc.mount(
            source.encode() if source else None,
            target.encode(),
            fstype.encode() if fstype else None,
            ctypes.c_ulong(flags),
            data.encode() if data else None,
        ),
        f"mount {source} -> {target}",
    )


def _write_json(path: str, data: dict[str, Any]) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


def _container(spec: dict[str, Any]) -> None:
    """In the child: PID 1 of the container. Never returns."""
    try:
        _libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        # A mount namespace of the container's own: its mounts (an emptyDir at /tmp, say)
        # must not hide the pod directory from the shim, which writes the exit status there.
        _check(_libc.unshare(CLONE_NEWNS), "unshare mount")
        # Every source is opened before anything is mounted, and mounted through its fd: a
        # volume mounted over an ancestor of the pod directory (/tmp again) would otherwise
        # hide the sources of the mounts after it (resolv.conf, hosts, termination log).
        sources = {
            m["source"]: os.open(m["source"], os.O_PATH | os.O_CLOEXEC)
            for m in spec.get("mounts", [])
        }
        mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
        for m in spec.get("mounts", []):
            if not os.path.lexists(m["target"]):  # e.g. a mount inside another volume
                if m.get("file"):
                    os.makedirs(os.path.dirname(m["target"]), exist_ok=True)
                    open(m["target"], "a").close()
                else:
                    os.makedirs(m["target"], exist_ok=True)
            mount(f"/proc/self/fd/{sources[m['source']]}", m["target"], None, MS_BIND | MS_REC)
            if m.get("readOnly"):
                mount(None, m["target"], None, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_REC)
        hostname = spec["hostname"].encode()
        _check(_libc.sethostname(hostname, len(hostname)), "sethostname")
        os.chdir(spec.get("cwd") or "/")
        env = spec["env"]
        argv = spec["argv"]
        path = env.get("PATH", os.defpath)
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        if "/" in argv[0]:
            os.execve(argv[0], argv, env)
        _execvp_path(argv, env, path)
    except BaseException as e:  # noqa: BLE001 - anything here is a start error
        msg = f"failed to start container: {e}"
        try:
            with open(spec["starterror"], "w") as f:
                f.write(msg)
        finally:
            print(msg, file=sys.stderr, flush=True)
            os._exit(128)


def _execvp_path(argv: list[str], env: dict[str, str], path: str) -> None:
    for d in path.split(os.pathsep):
        candidate = os.path.join(d or ".", argv[0])
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            os.execve(candidate, argv, env)
    raise FileNotFoundError(f'exec: "{argv[0]}": executable file not found in $PATH')


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    fd = os.open(spec["netns"], os.O_RDONLY)
    _check(_libc.setns(fd, CLONE_NEWNET), "setns net")
    os.close(fd)
    _check(_libc.unshare(CLONE_NEWNS | CLONE_NEWUTS | CLONE_NEWPID), "unshare")
    mount(None, "/", None, MS_REC | MS_PRIVATE)
    pid = os.fork()
    if pid == 0:
        _container(spec)
    _write_json(spec["pidfile"], {"pid": pid})

    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)
    while True:
        try:
            _, status = os.waitpid(pid, 0)
            break
        except InterruptedError:
            continue
    result: dict[str, int | None]
    if os.WIFSIGNALED(status):
        result = {"exitCode": 128 + os.WTERMSIG(status), "signal": os.WTERMSIG(status)}
    else:
        result = {"exitCode": os.WEXITSTATUS(status), "signal": None}
    _write_json(spec["statusfile"], result)
    return (result["exitCode"] or 0) & 0xFF


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
