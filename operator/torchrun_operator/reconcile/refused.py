"""Says, once per pod, that what a pod said was refused (reconcile/podinput.py): its launcher's
status answer or its termination report broke the pod contract. The refusal itself costs the
job nothing (the answer is dropped, the pod ends on its exit code); this is for people, so a
sidecar that answers on the status port, or a script that writes a sentinel step, is found.

The PodInputRejected condition names the refused pods (at most MAX_NAMED); it is the memory
of what was said: a Warning event comes only with a pod the condition does not name yet.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..api.status_names import ConditionType, Reason
from . import conditions as cond
from .context import Ctx

MAX_NAMED = 10


def say_refused(ctx: Ctx, answers: Mapping[str, str]) -> None:
    """`answers`: per pod uid, why its status answer was refused (by the status reader, or by
    the reconciler: a checkpoint outside the job's storage); a refused report is the pod's
    `report_rejected`."""
    found: dict[str, str] = {}
    for pod in ctx.pods:
        answer = answers.get(pod.uid or "")
        if pod.report_rejected:
            found[pod.name] = f"its report: {pod.report_rejected}"
        elif answer is not None:
            found[pod.name] = f"its status answer: {answer}"
    if not found:
        return
    old = cond.get(ctx.conds, ConditionType.POD_INPUT_REJECTED)
    said = str((old or {}).get("message", ""))
    kept = [part for part in said.split("\n") if part.startswith("pod ")]
    new = [n for n in sorted(found) if f"pod {n}:" not in said][: MAX_NAMED - len(kept)]
    if not new:
        return
    kept += [f"pod {n}: {found[n]}" for n in new]
    ctx.set_cond(
        ConditionType.POD_INPUT_REJECTED, True, Reason.POD_ANSWER_REJECTED, "\n".join(kept)
    )
    for n in new:
        ctx.event(
            "Warning",
            Reason.POD_ANSWER_REJECTED,
            f"pod {n}: {found[n]} (dropped; docs/pod-contract.md says what is accepted)",
        )
