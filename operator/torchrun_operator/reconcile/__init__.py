"""Pure reconciliation: (job, observed pods, now) -> Plan."""

from ..render import children
from .core import reconcile
from .plan import Event, Plan

__all__ = ["Event", "Plan", "children", "reconcile"]
