"""The process node's command line, in one place: `NodeOptions` is both what the control plane
writes (`argv`) and what the node reads (`parse`), so the two cannot drift. Standard library
only: the control plane imports it without the node's dependencies."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_type_hints

PROG = "python -m localkube.node"


@dataclass(frozen=True)
class NodeOptions:
    kubeconfig: str
    state_dir: Path
    nodes_json: str = field(
        metadata={"help": '[{"name":"node-0","cpu":"8","memory":"32Gi","gpus":0,...}]'}
    )
    dns_ip: str
    pod_cidr_base: int
    api_host: str
    api_port: int
    ca_file: str
    bridge: str
    serving_cert: str = field(
        default="", metadata={"help": "certificate of the log endpoint (none: no endpoint)"}
    )
    serving_key: str = ""
    backoff_base: float = field(
        default=10.0, metadata={"help": "first restart back-off in seconds (doubles, capped)"}
    )
    backoff_cap: float = 300.0
    log_level: str = "INFO"

    @staticmethod
    def flag(name: str) -> str:
        return "--" + name.replace("_", "-")

    def argv(self) -> list[str]:
        """The flags: every required one, and the others where they differ from the default."""
        out: list[str] = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.default is dataclasses.MISSING or value != f.default:
                out += [self.flag(f.name), str(value)]
        return out

    @classmethod
    def parser(cls, description: str | None = None) -> argparse.ArgumentParser:
        types = get_type_hints(cls)
        p = argparse.ArgumentParser(prog=PROG, description=description)
        for f in dataclasses.fields(cls):
            kw: dict[str, Any] = {"type": types[f.name], "help": f.metadata.get("help")}
            if f.default is dataclasses.MISSING:
                kw["required"] = True
            else:
                kw["default"] = f.default
            p.add_argument(cls.flag(f.name), **kw)
        return p

    @classmethod
    def parse(cls, argv: list[str] | None = None, description: str | None = None) -> NodeOptions:
        return cls(**vars(cls.parser(description).parse_args(argv)))
