"""CLI: `python -m localkube.node --kubeconfig K --state-dir DIR --nodes-json JSON
--dns-ip IP --pod-cidr-base N --api-host IP --api-port P --ca-file CA --bridge lk-NAME
[--serving-cert CRT --serving-key KEY] [--backoff-base SECONDS]`.

Serves the pods' logs to the apiserver (localkube.node.logserver; with --serving-cert),
registers the Nodes, then runs their pods until SIGTERM/SIGINT, on which it kills every pod
it runs and removes their network namespaces, veths, mounts and created mountpoints.
"""

from __future__ import annotations

import json
import logging
import signal
import sys
import threading
from pathlib import Path

from . import kapi, runtime
from .hostpaths import CreatedPaths
from .logserver import LogServer
from .nodes import NodeAgent, NodeConfig
from .options import NodeOptions
from .pods import Ipam, NodeContext, PodManager

log = logging.getLogger("localkube.node")


def parse_args(argv: list[str] | None = None) -> NodeOptions:
    return NodeOptions.parse(argv, description=__doc__)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(threadName)s %(message)s"
    )
    state_dir: Path = args.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())

    removed = runtime.cleanup_stale(args.bridge)
    if removed:
        log.info("removed stale network namespaces: %s", removed)
    created = CreatedPaths(state_dir / "created-paths.json")
    api = kapi.load(args.kubeconfig)
    nodes = [NodeConfig.from_json(i, d) for i, d in enumerate(json.loads(args.nodes_json))]
    gateway = f"10.{args.pod_cidr_base}.0.1"
    ctx = NodeContext(
        api=api,
        state_dir=state_dir,
        bridge=args.bridge,
        base=args.pod_cidr_base,
        dns_ip=args.dns_ip,
        api_host=args.api_host,
        api_port=args.api_port,
        backoff_base=args.backoff_base,
        backoff_cap=args.backoff_cap,
        created=created,
        stop=stop,
        ipam=Ipam(args.pod_cidr_base),
    )
    manager = PodManager(ctx, nodes)
    logs = None
    if args.serving_cert:
        # Before the Nodes are registered: their status names its port.
        logs = LogServer(gateway, args.serving_cert, args.serving_key, args.ca_file, manager)
        logs.serve()
    port = logs.port if logs is not None else 0
    agents = [NodeAgent(api, n, gateway, state_dir, stop, port) for n in nodes]
    for a in agents:
        a.register()
        a.thread.start()
    manager.start()
    log.info("nodes %s registered; running pods", [n.name for n in nodes])
    (state_dir / "ready").write_text("1")
    stop.wait()
    log.info("shutting down: killing pods")
    if logs is not None:
        logs.close()
    manager.shutdown()
    runtime.cleanup_stale(args.bridge)
    created.remove_all()
    (state_dir / "ready").unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
