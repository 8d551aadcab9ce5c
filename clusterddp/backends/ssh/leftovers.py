"""What a lost host kept running of a run that has ended: found and ended (issue 39, section 1).

A host lost during a run (its link cut, out of reach) keeps running its part of the job, and with it
the GPU slots its lease took; the run goes on elsewhere (a spare, fewer nodes) and ends. Two places
end such a leftover:

- the end of an attached run (:func:`end_lost`): every host its record keeps in ``lost`` that answers
  now is asked to end the run's processes there (bounded: the host's connect timeout, then the
  teardown's grace); those that do not answer stay in the record, for `stop` or the next run;
- a run refused because slots are held (:func:`leftovers`, then :func:`end`): a holder is ended and
  its slots taken only when it is, beyond doubt, a leftover of ours. The rule, pure and tested:
  the holding run is recorded in this runs folder as ended (succeeded, failed or stopped: never a
  running one, whose lost host may still come back into use), its lease is running there (not being
  taken right now), it names this host as one of that run's nodes (current or lost), and the lease
  was taken by the same ``user@machine`` that launches now. Another user's run, a run this
  launcher does not know, or one still running, is never touched: the refusal stands.

The teardown is the one `stop` uses: the processes carrying that run's marker on that host, so
nothing of any other run is touched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from ... import nodeops
from ... import plan as ssh_plan
from ...errors import ClusterDDPError
from ...fleet import Fleet, as_host_error
from ...inventory import Host
from ...record import NodeRecord, RunRecord, RunStatus
from ...store import RunStore
from ...transport import Transport

GRACE_S = 5.0  # SIGTERM, then SIGKILL after this: the run it belongs to has ended already


@dataclass(frozen=True)
class Leftover:
    """A lease on ``host`` held by ``run``, a run recorded here as ended (``status``); ``node`` is that
    run's node on the host (its marker ends it)."""

    host: str
    run: str
    status: RunStatus
    slots: tuple[int, ...]
    node: NodeRecord


def leftovers(host: str, holders: Iterable, load: Callable[[str], RunRecord | None], me: str) -> list[Leftover]:
    """The holders of ``host``'s slots (``leases.Holding``s, as its lease folder reports them) that may
    be ended and their slots taken (the module's rule). ``load(run id)``: the run's record in this
    runs folder, None when it has none (or it cannot be read); ``me``: the launching ``user@machine``."""
    out = []
    for h in holders:
        if h.state != "running" or h.user != me:
            continue
        rec = load(h.run)
        if rec is None or not rec.status.is_terminal():
            continue
        # its lost node there (an earlier attempt's), else its node there
        node = next((n for n in (*reversed(rec.lost), *rec.nodes) if n.host == h.host), None)
        if node is None:
            continue
        out.append(Leftover(host, h.run, rec.status, tuple(h.slots), node))
    return out


def loader(store: RunStore) -> Callable[[str], RunRecord | None]:
    """:func:`leftovers`'s ``load`` for ``store``: a record that is missing or cannot be read is None."""
    def load(run_id: str) -> RunRecord | None:
        try:
            return store.load(run_id)
        except (ClusterDDPError, OSError, ValueError):
            return None
    return load


def end(fleet: Fleet, host: Host, found: Iterable[Leftover], grace: float = GRACE_S
        ) -> list[tuple[Leftover, str | None]]:
    """End each leftover on ``host`` (through ``fleet``'s connection to it: the machine whose slots
    are held): each with None when nothing of it is left there now, else what went wrong."""
    out: list[tuple[Leftover, str | None]] = []
    for x in found:
        command = ssh_plan.teardown_command(nodeops.launch_of(x.node), grace)  # by its marker: nothing else is touched
        try:
            said = nodeops.last_line(fleet.transport(host).run(command, timeout=grace + 30).text)
        except Exception as e:  # noqa: BLE001 - this host's failure, said; the refusal stands
            out.append((x, as_host_error(host.name, e).detail))
            continue
        word = said.partition(" ")[0]
        out.append((x, None if word in ("terminated", "killed", "clean") else f"the teardown printed {said!r}"))
    return out


def taken(x: Leftover, problem: str | None) -> str:
    """What ``up`` says of a leftover it ended (or could not)."""
    slots = ",".join(map(str, x.slots))
    if problem is None:
        return (f"[clusterddp] {x.host}: slots {slots} were held by run {x.run}, which has ended ({x.status}): "
                f"what was left of it there is ended; taking them")
    return (f"[clusterddp] {x.host}: slots {slots} are held by run {x.run}, which has ended ({x.status}), "
            f"but what is left of it there could not be ended: {problem}")


def end_lost(store: RunStore, run_id: str, connect: Callable[[Host], Transport] | None = None,
             grace: float = GRACE_S) -> list[str]:
    """At the end of an attached run: `stop` on the hosts its earlier attempts lost (``rec.lost``),
    those that answer ended and dropped from the record; what to say of each."""
    from ...transport import connect as default_connect
    from .control import stop_lost
    rec = store.load(run_id)
    if not rec.lost:
        return []
    how, ended = stop_lost(rec, connect or default_connect, grace)
    if ended:
        store.update(run_id, lambda r: replace(r, lost=tuple(n for n in r.lost if n.host not in ended)))
    return [f"[clusterddp] {h}: {said.splitlines()[0]}" + ("" if h in ended else
            f"; it is ended by the next run that finds its slots held, or by `clusterddp stop {run_id}`")
            for h, said in how.items()]
