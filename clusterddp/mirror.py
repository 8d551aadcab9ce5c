"""Checkpoints that survive the loss of any one node: while an attached run goes on, the newest
complete checkpoint of its rank 0 is brought back to the launching machine, verified; a new attempt
on other hosts gets it (:func:`seed`) before its job starts. (Interface placeholder: the mirror
itself is being built; until then nothing is mirrored and :func:`seed` sends nothing.)"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .fleet import Fleet
    from .plan import LaunchPlan, NodeLaunch
    from .store import RunStore


class Mirror:
    """Brings rank 0's newest complete checkpoint back while the run goes on (``start``/``stop``)."""

    def __init__(self, fleet: Fleet, plan: LaunchPlan, store: RunStore) -> None:
        self.fleet, self.plan, self.store = fleet, plan, store

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


def seed(fleet: Fleet, node: NodeLaunch, store: RunStore, run_id: str) -> str | None:
    """Put the newest mirrored checkpoint on ``node`` (same path under its run folder) before an
    attempt starts; a one-line description of what was sent, or None when nothing was mirrored."""
    return None
