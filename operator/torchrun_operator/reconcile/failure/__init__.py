"""What the reconciler does when pods of the running attempt fail or hang: one module per
policy.

- `handle`: pods failed: find the root cause and pick the policy.
- `settle`: when a failure is acted on (the settle window, node clocks put on the operator's).
- `restart`: fail the job on a user error or a spent budget, else restart the whole gang.
- `replace`: elastic jobs replace only the pods they lost.
- `crashloop_policy`: stop restarting an attempt that failed like the one before it.
- `hang_policy`: hangs no launcher reports (a rendezvous that never completes, stalled progress).
- `cause`: the root cause as the status and messages show it.
- `avoid`: after a failure that was the node's, the next pods keep off that node.

`on_failures` and `hung` are the entry points. A gang restart they decide leaves the job
Restarting; the caller then starts the next attempt (reconcile/running.py).
"""

from __future__ import annotations

from .handle import on_failures
from .hang_policy import hung
from .restart import backoff
from .settle import REPORT_LAG, SETTLE_SECONDS

__all__ = ["REPORT_LAG", "SETTLE_SECONDS", "backoff", "hung", "on_failures"]
