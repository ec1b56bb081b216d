"""Pods whose deletion no kubelet finishes.

A pod that is deleted stays in the API, Terminating, until its kubelet confirms that its
containers stopped. When the node is gone (powered off, its kubelet dead, cut off from the
apiserver), nobody ever confirms: the pod stays for ever. For this operator that is not only
clutter: the next attempt's pods reuse the hostnames of the last attempt's, so a gang restart
waits until those are gone, and a finished job's Kueue quota is released only once its pods
are. So a pod of the job still Terminating FORCE_DELETE_AFTER_SECONDS past the end of its
grace period is deleted again with a grace period of 0 (as `kubectl delete --force` does and
as kube-controller-manager's pod GC does for pods on nodes marked out of service), named in
an event. Should the node come back, its kubelet stops the containers of a pod the API no
longer has.

The deletionTimestamp is the apiserver's (the deletion's time plus its grace period), not a
node's: the margin covers any skew between the apiserver's clock and the operator's, and a
kubelet that is merely slow to stop a big process.
"""

from __future__ import annotations

from ..api.status_names import Reason
from ..api.timefmt import seconds
from .context import Ctx
from .observe import PodView

# Past the grace period a live kubelet sends SIGKILL at once and confirms within seconds.
FORCE_DELETE_AFTER_SECONDS = 120.0


def due_at(pod: PodView) -> float | None:
    """When a deleting pod counts as abandoned by its kubelet; None if it is not deleting.
    A pod that ended after it was deleted waits for its kubelet's last word too (a pod that
    had ended when it was deleted is gone at once: the apiserver gives it no grace)."""
    if not pod.terminating:
        return None
    deleted = seconds(pod.deletion_time)
    return None if deleted is None else deleted + FORCE_DELETE_AFTER_SECONDS


def force(ctx: Ctx) -> None:
    """Plans a forced delete of every pod of the job whose deletion is overdue, and a
    reconcile for when the next one will be (no pod event comes from a node that is gone)."""
    for pod in ctx.pods:
        due = due_at(pod)
        if due is None:
            continue
        if ctx.now < due:
            ctx.requeue.append(due - ctx.now)
        elif pod.name not in ctx.force_delete:
            ctx.force_delete.append(pod.name)
            ctx.event(
                "Warning",
                Reason.POD_FORCE_DELETED,
                f"pod {pod.name} (node {pod.node or 'none'}) was still Terminating "
                f"{FORCE_DELETE_AFTER_SECONDS:.0f}s after its grace period: no kubelet "
                "confirmed its end, deleted with a grace period of 0",
            )
