"""A run the idle policy ended (``idle_policy: {stop: true}``): what each node's sampler left, read back and
told as the run's failure, ``failure.kind: idle``, not as the signal that ended its ranks.

The node side is ``clusterddp/node/sampler.py`` (:class:`~clusterddp.node.sampler.RunIdle`: the nodes decide
together, through the run's store). Each node that acted leaves ``idle.json`` in its control folder (the policy:
``below`` %, ``seconds``, ``stop``; ``decided_by``, ``nnodes``). :func:`read_command` prints it, bounded;
:func:`parse_node` checks it and never raises (a node is not trusted); :func:`idle_of` makes the failure from
the nodes that stopped: its summary says ``idle: every GPU below X% for T min``. ``clusterddp.hang`` reads it
in the same command as the node's hang.json (``records_command``), for SSH (``hang.explain``) and the Slurm
backend's diagnosis, which ask here when no stall watchdog ended the run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import plan as ssh_plan
from ..failure import Failure, clip
from ..node.reply import ReplyError, loads
from ..nodescript import qpath
from ..record import RunRecord

IDLE = "idle.json"       # in a node's control folder: the sampler found the run idle
IDLE_MOST = 16 << 10     # bytes of idle.json read (the sampler writes a couple of hundred)
KIND = "idle"


@dataclass(frozen=True)
class NodeIdle:
    """One node's idle.json, checked."""

    host: str              # the node it came from (the run's name for it, not what the node says)
    below: float           # GPU utilisation %
    seconds: float
    stop: bool
    decided_by: str | None


def read_command(node: ssh_plan.NodeLaunch) -> str:
    """Print the node's idle.json (nothing when there is none), bounded."""
    return f"cd {qpath(node.control_dir)} 2>/dev/null || exit 0; [ -f {IDLE} ] || exit 0; head -c {IDLE_MOST} {IDLE}"


def _number(v: Any, lo: float, hi: float) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
    return float(v) if ok else None


def parse_node(host: str, stdout: bytes) -> NodeIdle | None:
    """:func:`read_command`'s answer: None when there is none, or it is not the sampler's record."""
    text = stdout[:IDLE_MOST].decode("utf-8", "replace").strip()
    if not text:
        return None
    try:
        data = loads(text)
    except (ReplyError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    below, seconds = _number(data.get("below"), 0, 100), _number(data.get("seconds"), 0, 1e9)
    if below is None or seconds is None:
        return None
    by = data.get("decided_by")
    by = clip(by, 255) if isinstance(by, str) and by else None
    return NodeIdle(host, below, seconds, data.get("stop") is True, by)


def minutes(seconds: float) -> str:
    """``30 min``, ``0.05 min``: the policy's time as the inventory gives it."""
    return f"{round(seconds / 60.0, 4):g} min"


def idle_of(rec: RunRecord, idles: Mapping[str, NodeIdle]) -> Failure | None:
    """The run's failure when the idle policy stopped it (a node's record with ``stop``), else None."""
    stopped = {h: v for h, v in idles.items() if v.stop}
    if not stopped:
        return None
    lead = next((v for v in stopped.values() if v.decided_by == v.host), None) or next(iter(stopped.values()))
    host = lead.decided_by if lead.decided_by in rec.hosts else lead.host
    summary = (f"idle: every GPU below {lead.below:g}% for {minutes(lead.seconds)} "
               "(idle_policy stop ended the run)")
    others = tuple((h, "ended by the idle policy" if h in stopped else "no idle record")
                   for h in rec.hosts if h != host)
    return Failure(host=host, kind=KIND, summary=clip(summary, 2000), others=others)

