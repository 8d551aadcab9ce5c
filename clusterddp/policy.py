"""What a failed attempt of a run leads to: end the run, or carry it on without the hosts at fault.

Pure: :func:`after_failure` reads the run record (its nodes' states and the diagnosed ``failure``,
:mod:`clusterddp.failure`'s kinds) and decides; the SSH backend's attempt loop acts on the decision (a
spare in, or fewer nodes) and keeps it in run.json. :func:`machine_faults` says which machines a failure
sets aside (:mod:`clusterddp.quarantine` keeps them).

- The machine's failures (:data:`MACHINE`): a node lost (link, power, kernel panic) and a GPU error of
  the machine's kind (an Xid such as 79, "fallen off the bus", or 48, a double-bit ECC error, during the
  job; nvidia-smi unable to read a GPU). The run carries on without that host. A GPU error sets the host
  aside at once (it needs a reset or a repair); a loss gives it a strike, and a second machine's failure
  in its next run (within a day) sets it aside: one loss alone can be a passing network fault.
- The same machine failing twice in a row: a host with a strike (lost in its previous run) whose rank now
  dies for a reason not known to be the job's (:data:`UNCLEAR`: a signal, a node that never joined, no
  exit code) is taken as the machine failing again: the run carries on without it, and it is set aside.
- The job's own (:data:`JOB`): a Python exception, a non-zero exit, a signal, an OOM kill (the job's
  size: a spare of the same kind runs out of memory too), a collective timeout (some rank never reached
  it: a hang in the job or a slow peer, and the rank that timed out is not the one at fault), a hang,
  the idle policy's stop (every GPU of the run idle: ``idle_policy: {stop: true}``),
  a node that never joined. Any machine would fail the same way, so the run ends as without spares,
  unless the inventory says ``retry_job_failures: true``: then the failing rank's host is replaced too.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from .failure import clip
from .record import NodeState, RunRecord

MACHINE = ("lost", "gpu")
UNCLEAR = ("signal", "never_joined", "unknown")  # the machine's when it is the machine's second failure in a row
JOB = ("exception", "exit", "signal", "oom", "timeout", "hang", "never_joined", "unknown", "diverged", "idle")
MAX_WHY = 400      # characters of a decision's line
MAX_WHAT = 160     # of the failure's own line in it


@dataclass(frozen=True)
class Decision:
    """``carry_on``: the run goes on without ``hosts`` (each replaced by a spare, or fewer nodes);
    otherwise it ends. ``why``: one line, said on the terminal and kept in run.json."""

    carry_on: bool
    hosts: tuple[str, ...]
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"carry_on": self.carry_on, "hosts": list(self.hosts), "why": self.why}


@dataclass(frozen=True)
class Fault:
    """A machine's failure in a run: ``kind`` ``lost``, ``gpu`` or ``again`` (its second failure in a
    row); ``why`` in a few words."""

    kind: str
    why: str

    @property
    def at_once(self) -> bool:
        """Set aside now, not only on a second failure in a row."""
        return self.kind == "gpu"


def _line(text: str | None, limit: int = MAX_WHAT) -> str:
    """The first line of ``text``, short, as a decision's line may hold it."""
    return clip(" ".join((text or "").splitlines()[:1]).strip(), limit)


def machine_faults(rec: RunRecord, struck: Collection[str] = ()) -> dict[str, Fault]:
    """The run's machines that failed as machines (by host name): every node lost, the host of a GPU
    error, and the root cause's host when it holds a strike (``struck``: the hosts lost in their
    previous run, :meth:`clusterddp.quarantine.Quarantine.struck`) and failed for an :data:`UNCLEAR`
    reason. A record without nodes at fault gives {}."""
    out = {n.host: Fault("lost", "lost") for n in rec.nodes if n.state is NodeState.LOST}
    f = rec.failure
    if f is not None and f.kind == "gpu" and f.host in rec.hosts:
        out[f.host] = Fault("gpu", _line(f.summary))
    elif f is not None and f.kind in UNCLEAR and f.host in struck and f.host not in out:
        out[f.host] = Fault("again", _line(f.summary, 80))
    return out


def _whose(rec: RunRecord) -> str:
    f = rec.failure
    if f is None:
        return "the run failed without a diagnosis"
    where = f.host + (f", rank {f.rank}" if f.rank is not None else "")
    return f"{where}: {_line(f.summary)}"


_ENDS = {
    "exception": "the job's own exception, which another machine would raise too",
    "exit": "the job's own exit, which another machine would make too",
    "signal": "a signal to the job's process, not known to be the machine's",
    "oom": "the job's size: a spare of the same kind runs out of memory too",
    "timeout": "a collective timed out: some rank never reached it (a hang in the job or a slow peer), "
               "no machine is known at fault",
    "hang": "the job stalled, which another machine would do too",
    "never_joined": "a node never joined the rendezvous, not known to be the machine's",
    "idle": "the idle policy stopped it (every GPU idle), which another machine's GPUs would be too",
    "diverged": "the nodes' ranks did not run the same steps (they resumed from different points)",
}


def after_failure(rec: RunRecord, *, retry_job_failures: bool = False, struck: Collection[str] = ()) -> Decision:
    """The decision after an attempt of ``rec`` failed (its record as the attempt ended).
    ``retry_job_failures``: the inventory's ``retry_job_failures:``, the user's word that a failure of
    the job is worth retrying on another machine (a flaky node that leaves no trace, say). ``struck``: the
    run's hosts lost in their previous run (``Quarantine().struck(rec)``), whose unclear failure now is
    the machine's second."""
    faults = machine_faults(rec, struck)
    if faults:
        parts = []
        for host, fault in faults.items():
            if fault.kind == "lost":
                parts.append(f"{host} lost")
            elif fault.kind == "again":
                parts.append(f"{host}: failed again after a loss in its previous run ({fault.why})")
            else:
                parts.append(f"{host}: {fault.why}")
        # what failed, not what comes of it: the caller says that (a new attempt, or the end when none can start)
        return Decision(True, tuple(faults), clip(f"{'; '.join(parts)}: the machine's failure, not the job's", MAX_WHY))
    f = rec.failure
    kind = f.kind if f is not None else "unknown"
    if retry_job_failures and f is not None and f.host in rec.hosts:
        return Decision(True, (f.host,), clip(f"{_whose(rec)}: the job's own failure ({kind}), which "
                                              "retry_job_failures: true moves to another machine", MAX_WHY))
    reason = _ENDS.get(kind, "not known to be the machine's")
    hint = " (retry_job_failures: true in the inventory retries it elsewhere)" if f is not None else ""
    return Decision(False, (), clip(f"{_whose(rec)}: {reason}, so not moved to another machine{hint}", MAX_WHY))


def ends(*parts: str) -> str:
    """The one line of a run that ends after a failed attempt (kept in run.json's ``attempts``): the
    failure (a :class:`Decision`'s ``why``), then why no new attempt starts, joined by ``; `` (parts
    that say nothing are left out, and none ends in a separator of its own)."""
    said = [p.strip().rstrip(";:,").rstrip() for p in parts]
    return "; ".join(p for p in said if p) or "no reason recorded"
