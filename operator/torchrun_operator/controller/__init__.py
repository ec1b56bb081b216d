"""The controller: caches fed by watches, a work queue of jobs, and workers that apply plans
(loop.py's `Controller`, joined from one class per concern: see state.py)."""

from torchrun_operator.controller.children import controller_uid, describe_conflict
from torchrun_operator.controller.loop import STOP_GRACE_SECONDS, Controller

__all__ = ["STOP_GRACE_SECONDS", "Controller", "controller_uid", "describe_conflict"]
