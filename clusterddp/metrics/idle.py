"""A run the idle policy ended (``idle_policy: {stop: true}``): what each node's sampler left, read back and
told as the run's failure, ``failure.kind: idle``, not as the signal that ended its ranks.

The node side is ``clusterddp/node/sampler.py`` (:class:`~clusterddp.node.sampler.RunIdle`: the nodes decide
together, through the run's store). Each node that acted leaves ``idle.json`` in its control folder (the policy:
``below`` %, ``seconds``, ``stop``; ``decided_by``, ``nnodes``). :func:`read_command` prints it, bounded;
:func:`parse_node` checks it and never raises (a node is not trusted); :func:`idle_of` makes the failure from
the nodes that stopped: its summary says ``idle: every GPU below X% for T min``. ``clusterddp.hang`` reads it
in the same command as the node's hang.json (``records_command``), for SSH (``hang.explain``) and the Slurm
backend's diagnosis, which ask here when no stall watchdog ended the run.

An attached SSH run whose policy has no ``stop`` goes on when found idle: :class:`Watch` looks for the nodes'
idle.json while it runs (and once more at its end) and tells it once, so that the run's ``on: [idle]``
notification targets hear of it.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .. import plan as ssh_plan
from ..failure import Failure, clip
from ..fleet import Fleet
from ..node.reply import ReplyError, loads
from ..nodeops import each
from ..nodescript import qpath
from ..record import RunRecord

IDLE = "idle.json"       # in a node's control folder: the sampler found the run idle
IDLE_MOST = 16 << 10     # bytes of idle.json read (the sampler writes a couple of hundred)
READ_TIMEOUT = 60.0      # seconds for a look at the nodes' idle.json (the attached run's Watch)
KIND = "idle"


@dataclass(frozen=True)
class NodeIdle:
    """One node's idle.json, checked."""

    host: str              # the node it came from (the run's name for it, not what the node says)
    below: float           # GPU utilisation %
    seconds: float
    stop: bool
    decided_by: str | None
    nnodes: int = 1

    def to_json(self) -> dict:
        return {"host": self.host, "below": self.below, "seconds": self.seconds, "stop": self.stop,
                "decided_by": self.decided_by, "nnodes": self.nnodes}


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
    n = data.get("nnodes")
    nnodes = n if isinstance(n, int) and not isinstance(n, bool) and 1 <= n < 1 << 20 else 1
    return NodeIdle(host, below, seconds, data.get("stop") is True, by, nnodes)


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


# ---- an attached run found idle, going on (idle_policy without stop) ----

WATCH_EVERY = 30.0  # seconds between two looks, at most


def watch_every(seconds: float) -> float:
    """Seconds between two looks for a policy of ``seconds``: :data:`WATCH_EVERY`, sooner for a short policy."""
    return min(WATCH_EVERY, max(2.0, seconds / 2))


class Watch:
    """An attached run whose idle policy has no ``stop``: every ``every`` seconds, each node's idle.json (one
    command a node, through the run's fleet), and ``tell`` called once, with the first record found; one last
    look when it stops (``final``), so a run found idle shortly before its end is told too. Never raises into
    the run: a look that fails is skipped."""

    def __init__(self, fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], tell: Callable[[NodeIdle], None],
                 every: float = WATCH_EVERY) -> None:
        self.fleet, self.nodes, self.tell, self.every = fleet, list(nodes), tell, every
        self.told = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def look(self) -> NodeIdle | None:
        """One look: the record found (told the first time), or None."""
        if self.told:
            return None
        res = each(self.fleet, self.nodes,
                   lambda n, t: parse_node(n.host.name, t.run(read_command(n), timeout=READ_TIMEOUT).stdout))
        found = next((res.succeeded[n.host.name] for n in self.nodes if res.succeeded.get(n.host.name)), None)
        if found is not None:
            self.told = True
            self.tell(found)
        return found

    def _look(self) -> None:
        try:
            self.look()
        except Exception:  # noqa: BLE001 - a look that fails never changes the run; the next one may do
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.every) and not self.told:
            self._look()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="idle", daemon=True)
        self._thread.start()

    def stop(self, final: bool = True) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
            if self._thread.is_alive():
                return  # a look still under way (a node slow to answer): it tells what it finds
        if final:
            self._look()
