"""The fault campaign's catalogue (tests/integration/faultrun.py): where a fault can strike
(the operator's own requests, by method and path), the fault kinds with the fault seam's rules
for them (operator/torchrun_operator/kube/faults.py), and which kinds fit which target."""

from __future__ import annotations

from typing import Any

WATCH = r"\?(.*&)?watch=(?i:true|1)"
# Where a fault can strike: the operator's own requests, by method and path.
TARGETS: dict[str, tuple[str, str]] = {
    "status-write": ("PATCH", r"/distributedtrainingjobs/[^/]+/status"),
    "pod-create": ("POST", r"/pods$"),
    "pod-delete": ("DELETE", r"/pods/[^/?]+"),
    "child-create": ("POST", r"/(services|configmaps|networkpolicies)$"),
    "job-read": ("GET", r"/distributedtrainingjobs/[^/?]+$"),
    "job-delete": ("DELETE", r"/distributedtrainingjobs/[^/?]+$"),
    "pod-watch": ("GET", r"/pods" + WATCH),
    "job-watch": ("GET", r"/distributedtrainingjobs" + WATCH),
    # The elected leader's renewals of its Lease (kube/leader.py replaces it: a PUT).
    "lease": ("PUT", r"/leases/[^/?]+$"),
}
# The Lease the replicas of a split-brain run elect their leader on (the operator's default
# --leader-election-id), in the run's namespace.
LEASE = "torchrun-operator"
# The fault kinds (the rows of the table) and the seam's rules for them.
KINDS: dict[str, dict[str, Any]] = {
    "500": {"action": "status", "status": 500},
    "409": {"action": "status", "status": 409},
    "429 + Retry-After": {"action": "status", "status": 429, "retry_after": 1},
    "connect timeout": {"action": "timeout"},
    "response lost": {"action": "lose_response"},
    # Held up 4.5 s (a slow apiserver: within a write's deadline, kube/leader.write_deadline),
    # then its answer lost: the client cannot know whether the write landed.
    "slow, then lost": {"action": "lose_response", "delay": 4.5},
    "committed late": {"action": "late", "delay": 6},
    "kill before": {"action": "kill_before"},
    "kill after": {"action": "kill_after"},
    "watch dropped": {"action": "lose_response", "times": 2},
    "410 Gone storm": {"action": "status", "status": 410, "times": 4},
    "503 storm": {"action": "status", "status": 503, "times": 4, "retry_after": 1},
    # Two replicas elect a leader (a standby joins once the Lease is held); the leader's
    # renewals fail for ~80 s (one every 4 s): its term ends (40 s), it fences its writes,
    # and the standby takes over (60 s) while the deposed leader may still be creating pods.
    # Fewer failures and the leader would renew again before the standby's wait ran out.
    "split brain": {"action": "status", "status": 500, "times": 20},
    # Not the seam's: the driver stops the apiserver (SIGSTOP) that long, then lets it go on;
    # or kills it (SIGKILL: connections break rather than hang) and starts it again after
    # that long. One such fault at a time in the whole campaign (Apiserver).
    "apiserver stopped 20 s": {"apiserver": "pause", "seconds": 20.0},
    "apiserver restarted": {"apiserver": "restart", "seconds": 15.0},
}
WRITE_KINDS = [
    "500", "409", "429 + Retry-After", "connect timeout", "response lost", "slow, then lost",
    "committed late", "kill before", "kill after",
]  # fmt: skip
READ_KINDS = ["500", "429 + Retry-After", "connect timeout", "response lost", "kill before"]
WATCH_KINDS = ["watch dropped", "410 Gone storm", "503 storm", "kill before"]
KINDS_OF = {
    "status-write": WRITE_KINDS,
    "pod-create": WRITE_KINDS,
    "pod-delete": WRITE_KINDS,
    "child-create": WRITE_KINDS,
    "job-delete": WRITE_KINDS,
    "job-read": READ_KINDS,
    "pod-watch": WATCH_KINDS,
    "job-watch": WATCH_KINDS,
    "lease": ["split brain"],
    "apiserver": ["apiserver stopped 20 s", "apiserver restarted"],
}
