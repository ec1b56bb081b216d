"""kubectl-dtj: list DistributedTrainingJobs, show per-rank status, fetch a rank's logs;
convert a Kubeflow PyTorchJob (cli/convert/).

On PATH as `kubectl-dtj`, kubectl runs it for `kubectl dtj ...`. This module is the thin I/O
part: argument parsing and API calls; everything it prints comes from `format`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from torchrun_operator.api import names
from torchrun_operator.api.names import GROUP, PLURAL, VERSION
from torchrun_operator.cli import convert
from torchrun_operator.cli import format as fmt
from torchrun_operator.cli import run as run_cmd


def _common_options(default: Any) -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--kubeconfig",
        default=default,
        help="path to the kubeconfig (default: $KUBECONFIG, then ~/.kube/config, then in-cluster)",
    )
    common.add_argument("--context", default=default, help="kubeconfig context to use")
    common.add_argument(
        "-n", "--namespace", default=default, help="namespace (default: the context's)"
    )
    return common


def build_parser() -> argparse.ArgumentParser:
    # The options are accepted before and after the command (`kubectl dtj -n ns list` and
    # `kubectl dtj list -n ns`); the command's copy must not reset a value given before it,
    # hence SUPPRESS as its default.
    common = _common_options(argparse.SUPPRESS)
    parser = argparse.ArgumentParser(
        prog="kubectl dtj",
        description="Inspect torchrun-operator DistributedTrainingJobs.",
        parents=[_common_options(None)],
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("list", aliases=["ls", "get"], parents=[common], help="list jobs")
    p.add_argument("-A", "--all-namespaces", action="store_true")
    p.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")

    p = sub.add_parser(
        "status", parents=[common], help="summary, per-rank table and root cause of one job"
    )
    p.add_argument("job")
    p.add_argument("-o", "--output", choices=["table", "json", "yaml"], default="table")
    p.add_argument(
        "-w", "--watch", action="store_true", help="redraw on every change until the job ends"
    )

    p = sub.add_parser("logs", parents=[common], help="logs of the pod that runs a rank")
    p.add_argument("job")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--rank", type=int, help="global rank (as in RANK of the worker)")
    which.add_argument(
        "--node-rank", type=int, help="torchrun's node rank (GROUP_RANK of the workers)"
    )
    which.add_argument(
        "--index", type=int, help="the pod's index (its name <job>-<index>[-a<attempt>])"
    )
    p.add_argument("-f", "--follow", action="store_true")
    p.add_argument(
        "-p", "--previous", action="store_true", help="logs of the previous container instance"
    )
    p.add_argument("-c", "--container", help="container (default: the pod's only one)")
    p.add_argument("--tail", type=int, help="lines from the end to show")

    run_cmd.add_parser(sub, common)
    convert.add_parser(sub, common)
    return parser


class _Kube:
    """The few API calls the CLI makes, with the client imported only when needed."""

    def __init__(self, kubeconfig: str | None, context: str | None) -> None:
        from kubernetes import client

        from torchrun_operator.client.connect import connect

        api, self.namespace = connect(kubeconfig, context)
        self.api = api
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)

    def list_jobs(self, namespace: str | None) -> list[dict[str, Any]]:
        res: dict[str, Any]
        if namespace is None:
            res = self.custom.list_cluster_custom_object(GROUP, VERSION, PLURAL)  # type: ignore[assignment]
        else:
            res = self.custom.list_namespaced_custom_object(  # type: ignore[assignment]
                GROUP, VERSION, namespace, PLURAL
            )
        return list(res.get("items", []))

    def get_job(self, namespace: str, name: str) -> dict[str, Any]:
        obj: dict[str, Any] = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]
            GROUP, VERSION, namespace, PLURAL, name
        )
        return obj

    def get_runtime(self, args: argparse.Namespace) -> dict[str, Any]:
        """The runtime `convert --runtime` names."""
        obj: dict[str, Any]
        if args.runtime_kind == names.CLUSTER_RUNTIME_KIND:
            obj = self.custom.get_cluster_custom_object(  # type: ignore[assignment]
                GROUP, VERSION, names.CLUSTER_RUNTIME_PLURAL, args.runtime
            )
        else:
            obj = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]
                GROUP, VERSION, args.namespace or self.namespace, names.RUNTIME_PLURAL, args.runtime
            )
        return obj

    def stream_logs(self, namespace: str, pod: str, args: argparse.Namespace) -> None:
        kwargs: dict[str, Any] = {"follow": args.follow, "previous": args.previous}
        if args.container:
            kwargs["container"] = args.container
        if args.tail is not None:
            kwargs["tail_lines"] = args.tail
        # Unpreloaded: with -f the body never ends, so print chunks as they arrive.
        resp: Any = self.core.read_namespaced_pod_log(
            pod, namespace, _preload_content=False, **kwargs
        )
        try:
            for chunk in resp.stream(4096):
                sys.stdout.buffer.write(chunk)
                sys.stdout.buffer.flush()
        finally:
            resp.release_conn()


def run(args: argparse.Namespace, kube: _Kube, now: datetime) -> str:
    """Execute one command and return what to print (logs stream instead, returning "")."""
    namespace = args.namespace or kube.namespace
    if args.command in ("list", "ls", "get"):
        jobs = kube.list_jobs(None if args.all_namespaces else namespace)
        if args.output != "table":
            return fmt.format_objects(jobs, args.output)
        return fmt.format_job_list(jobs, now, all_namespaces=args.all_namespaces)
    try:
        job = kube.get_job(namespace, args.job)
    except Exception as e:
        if getattr(e, "status", None) == 404:
            raise fmt.FormatError(
                f"distributedtrainingjob {args.job!r} not found in namespace {namespace!r}"
            ) from e
        raise
    if args.command == "status":
        if args.output != "table":
            return fmt.format_objects(job, args.output)
        return fmt.format_job_status(job, now)
    entry = fmt.find_rank_entry(job, rank=args.rank, node_rank=args.node_rank, index=args.index)
    pod = entry.get("pod")
    if not pod:
        raise fmt.FormatError(f"index {fmt.entry_index(entry)} has no pod yet")
    try:
        kube.stream_logs(namespace, str(pod), args)
    except Exception as e:
        status = getattr(e, "status", None)
        if status is None:
            raise
        raise fmt.FormatError(fmt.log_fetch_error(status, getattr(e, "body", None), entry)) from e
    return ""


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "convert" and not (args.runtime and not args.runtime_file):
        return convert.run(args)  # reads a file, talks to no cluster
    from kubernetes.client.exceptions import ApiException
    from kubernetes.config import ConfigException

    from torchrun_operator.client import Client, ClientError

    try:
        kube = _Kube(args.kubeconfig, args.context)
        if args.command == "convert":  # --runtime NAME: read the runtime, then convert
            return convert.run(args, kube.get_runtime(args))
        namespace = args.namespace or kube.namespace
        if args.command == "run":
            return run_cmd.run(args, Client(kube.api, namespace=namespace), namespace)
        if args.command == "status" and args.watch:
            sdk = Client(kube.api, namespace=namespace)
            return run_cmd.watch_status(sdk, args.job, namespace, sys.stdout)
        text = run(args, kube, datetime.now(UTC))
    except (fmt.FormatError, run_cmd.RunError, ClientError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except ConfigException as e:
        print(f"error: no usable kubeconfig: {e}", file=sys.stderr)
        return 1
    except ApiException as e:
        print(f"error: {_api_error(e, args)}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    if text:
        print(text)
    return 0


def _api_error(e: Any, args: argparse.Namespace) -> str:
    if e.status == 404 and args.command == "convert":
        return f"{args.runtime_kind} {args.runtime} not found"
    if e.status == 404:
        return "the DistributedTrainingJob CRD is not installed in this cluster"
    if e.status == 403:
        return f"forbidden: {e.reason}"
    return f"{e.status} {e.reason}: {e.body}"


if __name__ == "__main__":
    sys.exit(main())
