"""RFC 3339 timestamps as Kubernetes writes them: `torchrun_operator.api.timefmt`.

Defined in `api` (the lowest layer) so that kubectl-dtj and the metrics share the one parser
without importing the reconciler; re-exported here for the reconciler's modules.
"""

from __future__ import annotations

from ..api.timefmt import fmt, parse, seconds

__all__ = ["fmt", "parse", "seconds"]
