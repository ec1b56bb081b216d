"""torchrun's flags and the launcher's own arguments, read without torch's parser."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence


def split_argv(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """Split ``<torchrun flags> -- <user command>`` at the first ``--``."""
    argv = list(argv)
    if "--" not in argv:
        raise ValueError("missing '--' between torchrun flags and the training command")
    i = argv.index("--")
    cmd = argv[i + 1 :]
    if not cmd:
        raise ValueError("no training command after '--'")
    return argv[:i], cmd


def endpoint_host(flags: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Host part of the rendezvous endpoint given by flags or PET_RDZV_ENDPOINT."""
    value: str | None = env.get("PET_RDZV_ENDPOINT") or None
    names = ("--rdzv-endpoint", "--rdzv_endpoint")
    for i, arg in enumerate(flags):
        if arg in names and i + 1 < len(flags):
            value = flags[i + 1]
        elif any(arg.startswith(n + "=") for n in names):
            value = arg.split("=", 1)[1]
    if not value:
        return None
    value = value.strip()
    if value.startswith("["):  # [v6addr]:port
        return value[1 : value.index("]")] if "]" in value else value[1:]
    if value.count(":") > 1:  # bare IPv6 address
        return value
    return value.rsplit(":", 1)[0] if ":" in value else value


def flag_value(flags: Sequence[str], names: Sequence[str]) -> str | None:
    """The value of the last of `names` in torchrun flags (``--x v`` or ``--x=v``)."""
    value = None
    for i, arg in enumerate(flags):
        if arg in names and i + 1 < len(flags):
            value = flags[i + 1]
        elif any(arg.startswith(n + "=") for n in names):
            value = arg.split("=", 1)[1]
    return value


def shutdown_timeout(flags: list[str]) -> float:
    for i, arg in enumerate(flags):
        if arg in ("--shutdown-timeout", "--shutdown_timeout") and i + 1 < len(flags):
            try:
                return float(flags[i + 1])
            except ValueError:
                pass
    for name in ("PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"):
        try:
            return float(os.environ[name])
        except (KeyError, ValueError):
            continue
    return 30.0
