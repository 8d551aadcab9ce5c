"""What a failed attempt of a run leads to: end the run, or carry it on without the hosts at fault.

Pure: :func:`after_failure` reads the run record (its nodes' states and the diagnosed ``failure``)
and decides; the SSH backend's attempt loop acts on the decision (a spare in, or fewer nodes) and
keeps it in run.json. A failure of the user's code would fail on any machine, so it ends the run; a
machine's failure (a node lost) sets that machine aside.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .record import NodeState, RunRecord


@dataclass(frozen=True)
class Decision:
    """``carry_on``: the run goes on without ``hosts`` (each replaced by a spare, or fewer nodes);
    otherwise it ends. ``why``: one line, said on the terminal and kept in run.json."""

    carry_on: bool
    hosts: tuple[str, ...]
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"carry_on": self.carry_on, "hosts": list(self.hosts), "why": self.why}


def after_failure(rec: RunRecord) -> Decision:
    """The decision after an attempt of ``rec`` failed (its record as the attempt ended)."""
    lost = tuple(n.host for n in rec.nodes if n.state is NodeState.LOST)
    if lost:
        return Decision(True, lost, f"{', '.join(lost)} lost: the machine's failure, not the job's")
    kind = rec.failure.kind if rec.failure is not None else "unknown"
    return Decision(False, (), f"the job's own failure ({kind}): it would fail on another machine too")
