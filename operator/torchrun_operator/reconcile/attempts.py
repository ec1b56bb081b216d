"""Gang attempts: which spec an attempt's pods come from, and which pods are stale.

Every pod of an attempt is rendered from one spec. The status records it as
`attemptSpecHash` (a hash of the spec fields that shape the pods) in the write that starts
the attempt; a later reconcile that finds the spec hashing otherwise while the attempt's
pods exist starts the next attempt instead of adding pods of the new shape to the old gang.
CEL lets these fields change only while the job is suspended or in the write that suspends or
resumes it, so this happens when the operator missed a suspend (it was down, or two writes
came in one reconcile) or when a field CEL leaves open (spec.torchrun) changes.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from ..api.spec import JobSpec
from ..api.status_names import ConditionType, Phase, Reason, RestartKind
from .context import Ctx
from .observe import PodView

# Where the status keeps the hash of the spec its current attempt started from.
FIELD = "attemptSpecHash"
# The hash's definition; a later definition must adopt a hash of an earlier one (as a status
# without any hash is adopted) rather than restart every running job.
VERSION = "v1"
DIGEST_CHARS = 16

# The spec fields every pod of an attempt is rendered from and that cannot follow a change
# while it runs: the pod template, torchrun's command line (nodes or the elastic bounds,
# processes per pod, rendezvous, torchrun's own options) and the attempt's gang and placement.
# Left out on purpose: runPolicy, failurePolicy, successPolicy, monitoring and networkPolicy
# may change while the job runs; the few of their values a pod carries (the progress timeout
# and window) reach whichever pods are created next. spec.checkpoint (the mounted storage)
# is pod-shaping: a job that sets none hashes as before.
POD_SHAPING = frozenset(
    {"template", "nproc_per_node", "elastic", "rendezvous", "torchrun", "scheduling", "checkpoint"}
)
# Phases in which pods of the current attempt exist (or are being created).
RUNNING_PHASES = (Phase.STARTING, Phase.WAITING, Phase.RUNNING)


def spec_hash(spec: JobSpec) -> str:
    """The hash of the fields in POD_SHAPING, and of `nodes` unless the job is elastic (an
    elastic job's pods run `--nnodes MIN:MAX` and it scales within its attempt). Defaults are
    left out, so a field the API or a newer model fills with its default hashes as unset."""
    fields = set(POD_SHAPING) if spec.is_elastic else {*POD_SHAPING, "nodes"}
    shaped = spec.model_dump(mode="json", by_alias=True, exclude_defaults=True, include=fields)
    text = json.dumps(shaped, sort_keys=True, separators=(",", ":"))
    return f"{VERSION}-{hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]}"


def stale_pods(pods: Iterable[PodView], attempt: int) -> list[PodView]:
    """The pods of attempts before `attempt`. One can appear while a later attempt runs (a
    deposed leader's create, a create the apiserver committed after the client gave up); it
    has the same hostname and subdomain as the current pod of its index, so it answers the
    same DNS name, the rendezvous host's included, and holds its node's GPUs."""
    return [p for p in pods if p.attempt is not None and p.attempt < attempt]


def record(ctx: Ctx) -> None:
    """The current attempt's pods come from the spec as it is now."""
    ctx.status[FIELD] = spec_hash(ctx.spec)


def follow_spec(ctx: Ctx) -> None:
    """While the current attempt's pods exist: a status without a hash (written by an operator
    before attemptSpecHash) adopts the spec's hash; a hash that differs from the spec's starts
    the next attempt (Pending: the old pods are deleted, and once they are gone the new ones
    are created from the spec) without spending the restart budget, as a resume would."""
    if ctx.phase not in RUNNING_PHASES:
        return
    recorded, current = ctx.status.get(FIELD), spec_hash(ctx.spec)
    if recorded is None:
        ctx.status[FIELD] = current
        return
    if recorded == current:
        return
    old = ctx.attempt
    ctx.status["attempt"] = old + 1
    ctx.record_restart({"reason": Reason.SPEC_CHANGED, "kind": RestartKind.SUSPEND})
    ctx.set_phase(Phase.PENDING)
    message = f"the spec changed while attempt {old} ran; starting attempt {old + 1} from it"
    ctx.set_cond(ConditionType.RUNNING, False, Reason.SPEC_CHANGED, message)
    ctx.set_cond(ConditionType.RENDEZVOUS_DONE, False, Reason.SPEC_CHANGED, message)
    ctx.event("Normal", Reason.SPEC_CHANGED, message[0].upper() + message[1:])
