"""`python -m localkube up|down|status|kubeconfig`: a local Kubernetes cluster from processes.

export KUBECONFIG=$(python -m localkube kubeconfig)
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

from localkube.components import default_nodes
from localkube.controlplane import Cluster
from localkube.realnode import NODE_KIND_LABEL, REAL, default_real_nodes


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m localkube", description=__doc__)
    p.add_argument("--dir", type=Path, default=Path(".cluster"), help="cluster directory")
    p.add_argument("--name", default="local", help="cluster name (bridge lk-<name>)")
    p.add_argument("--base", type=int, default=244, help="pod network 10.<base>.0.0/16")
    sub = p.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start the cluster (a no-op when it is already healthy)")
    up.add_argument("--nodes", type=int, default=2)
    up.add_argument("--gpus-per-node", type=int, default=0)
    up.add_argument(
        "--real-nodes",
        type=int,
        default=0,
        help="kubelets with containerd beside the process nodes (`--nodes 0` for none of those); "
        f"labelled {NODE_KIND_LABEL}={REAL}; needs `cluster/build.sh kubelet`",
    )
    up.add_argument(
        "--image",
        action="append",
        default=[],
        help="an image of the local Docker engine to load onto the real nodes (repeatable)",
    )
    up.add_argument(
        "--network-policies",
        action="store_true",
        help="enforce NetworkPolicies on the process nodes' pods (kube-network-policies fed by "
        "an iptables NFQUEUE rule); needs `cluster/build.sh netpol` and iptables",
    )
    up.add_argument("--cpu", default="8")
    up.add_argument("--memory", default="32Gi")
    up.add_argument("--timeout", type=float, default=180.0)
    up.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="print only the end (the time it took and the KUBECONFIG line), not each step's time",
    )
    sub.add_parser("down", help="stop everything and remove the pod network")
    sub.add_parser("status", help="print component state as JSON")
    sub.add_parser("kubeconfig", help="print the admin kubeconfig path")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    quiet = args.cmd == "up" and args.quiet
    level = logging.WARNING if quiet else logging.INFO
    logging.basicConfig(level=level, format="%(message)s", stream=sys.stderr)
    nodes = None
    real_nodes = None
    images = None
    network_policies = False
    if args.cmd == "up":
        network_policies = args.network_policies
        nodes = default_nodes(args.nodes, args.cpu, args.memory, args.gpus_per_node)
        real_nodes = default_real_nodes(args.real_nodes)
        images = args.image
    cluster = Cluster(
        args.dir,
        name=args.name,
        base=args.base,
        nodes=nodes,
        real_nodes=real_nodes,
        images=images,
        network_policies=network_policies,
    )
    if args.cmd == "up":
        t0 = time.monotonic()
        cluster.up(timeout=args.timeout)
        print(f"cluster {args.name} up in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        print(f"export KUBECONFIG={cluster.kubeconfig}", file=sys.stderr)
    elif args.cmd == "down":
        t0 = time.monotonic()
        cluster.down()
        print(f"cluster {args.name} down in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    elif args.cmd == "status":
        st = cluster.status()
        print(json.dumps(st, indent=2))
        return 0 if st["healthy"] else 1
    elif args.cmd == "kubeconfig":
        print(cluster.kubeconfig.resolve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
