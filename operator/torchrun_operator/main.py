"""`torchrun-operator`: runs the operator through kopf with our options."""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import logging

import kopf

from torchrun_operator import handlers
from torchrun_operator.kube import ratelimit

# glibc's malloc gives threads that allocate at the same moment arenas of their own, up to 8
# per core, and memory freed in one arena serves only that arena again. The operator runs
# some 40 threads (workers, parallel creates, watches, the rank map's readers) that take
# turns under the GIL; two arenas hold the same objects with less memory kept back.
MALLOC_ARENAS = 2
M_ARENA_MAX = -8  # mallopt's parameter number (malloc.h)


def limit_malloc_arenas() -> bool:
    """mallopt(M_ARENA_MAX) before any thread starts; False where libc is not glibc."""
    try:
        return bool(ctypes.CDLL("libc.so.6").mallopt(M_ARENA_MAX, MALLOC_ARENAS))
    except (OSError, AttributeError):
        return False


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"must be a number >= 0, not {text}")
    return value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, not {text}")
    return value


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="torchrun-operator", description=__doc__)
    scope = p.add_mutually_exclusive_group()
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace")
    scope.add_argument(
        "-n", "--namespace", action="append", default=[], help="watch this namespace (repeatable)"
    )
    p.add_argument("--liveness-port", type=int, default=8080, help="serves /healthz; 0 disables")
    p.add_argument("--metrics-port", type=int, default=9090, help="serves /metrics; 0 disables")
    p.add_argument("--leader-election-namespace", help="enable leader election on a Lease here")
    p.add_argument("--leader-election-id", default="torchrun-operator")
    p.add_argument("--workers", type=int, default=16, help="jobs reconciled at once")
    p.add_argument(
        "--network-policy",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="give each job a NetworkPolicy unless its spec.networkPolicy.enabled says not",
    )
    p.add_argument(
        "--kueue",
        action="store_true",
        help="admit jobs labelled kueue.x-k8s.io/queue-name through Kueue Workloads "
        "(docs/scheduling.md); needs Kueue's CRDs and the chart's kueue.enabled RBAC",
    )
    p.add_argument(
        "--kube-api-qps",
        type=_non_negative_float,
        default=ratelimit.DEFAULT_QPS,
        help="requests per second to the apiserver, after the burst (0: no limit)",
    )
    p.add_argument(
        "--kube-api-burst",
        type=_positive_int,
        default=ratelimit.DEFAULT_BURST,
        help="requests the operator may send at once before --kube-api-qps applies",
    )
    p.add_argument("--log-format", choices=["plain", "json"], default="plain")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    limit_malloc_arenas()
    handlers.Options.namespaces = args.namespace or None
    handlers.Options.leader_namespace = args.leader_election_namespace
    handlers.Options.leader_id = args.leader_election_id
    handlers.Options.workers = args.workers
    handlers.Options.network_policy = args.network_policy
    handlers.Options.kueue = args.kueue
    handlers.Options.kube_api_qps = args.kube_api_qps
    handlers.Options.kube_api_burst = args.kube_api_burst
    handlers.Options.metrics_port = args.metrics_port or None
    kopf.configure(
        verbose=args.verbose,
        log_format=kopf.LogFormat.JSON if args.log_format == "json" else kopf.LogFormat.PLAIN,
    )
    logging.getLogger("kubernetes").setLevel(logging.WARNING)
    if not args.verbose:
        # kopf logs every handled event at INFO; one per pod change is noise at scale.
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    liveness = f"http://0.0.0.0:{args.liveness_port}/healthz" if args.liveness_port else None
    asyncio.run(
        kopf.operator(
            standalone=True,
            clusterwide=not args.namespace,
            namespaces=args.namespace,
            liveness_endpoint=liveness,
        )
    )


if __name__ == "__main__":
    main()
