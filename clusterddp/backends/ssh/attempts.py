"""The attempts of an attached SSH run, pure: after a failed attempt that the policy lets carry on
(:func:`clusterddp.policy.after_failure`), how many more attempts the run may make, which spares
may stand in, and which hosts the next attempt runs on. :mod:`.launch` does the rest (checks the
spares, leases, sends the code, starts it).

The rules, in the words docs/machine-dies.md uses:

- New attempts: up to ``--max-restarts N`` (else the inventory's ``restarts: N``); with
  ``--nodes MIN:MAX`` and neither, up to MAX - MIN (each one goes on with a spare or a node fewer).
  That number is the run spec's ``restarts``, resolved with every other option's precedence
  (:func:`clusterddp.runspec.resolve`).
- Each host out is replaced by the first healthy spare in ``spares:`` order that the run has not
  used yet and that is not quarantined; a host out never comes back in the same run.
- Without enough spares, the run goes on with the hosts left only with ``--nodes MIN:MAX`` and
  only while they are at least MIN; otherwise it ends.
- A host down when the run starts (no answer: a timeout, no route, the connection lost) is replaced
  the same way, before anything starts, when there are enough healthy spares (:func:`down_hosts`);
  a host that answers wrongly (its host key, a refused login) is not: its fix is in the inventory.
- Node ranks follow the hosts in use in their order (the run's hosts in inventory order, then the
  spares that came in, in the order they came): :meth:`Inventory.ranked` puts the master first,
  and a lost master's place goes to the first host left.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from ...errors import HostError, HostErrorKind
from ...inventory import Host


def start_hosts(hosts: Sequence[Host], nodes: tuple[int, int] | None) -> tuple[tuple[Host, ...], str | None]:
    """The hosts a run with ``--nodes MIN:MAX`` starts on (the first MAX), or why it cannot start
    (fewer than MIN hosts)."""
    if nodes is None:
        return tuple(hosts), None
    lo, hi = nodes
    if len(hosts) < lo:
        return tuple(hosts), (f"--nodes {lo}:{hi} needs at least {lo} hosts, and the run has {len(hosts)}")
    return tuple(hosts[:hi]), None


def candidates(spares: Iterable[Host], used: Iterable[str], quarantined: Iterable[str]) -> list[Host]:
    """The spares that may stand in, in inventory order: not used by this run already (in, or out),
    and not quarantined."""
    skip = set(used) | set(quarantined)
    return [s for s in spares if s.name not in skip]


@dataclass(frozen=True)
class Next:
    """The next attempt's hosts (in rank order but for the master, which :meth:`Inventory.ranked` puts
    first), the hosts that left and the spares that came in."""

    hosts: tuple[Host, ...]
    out: tuple[str, ...]
    in_: tuple[str, ...]

    def says(self) -> str:
        """``node2 out, node3 in`` (``node2 out, going on with 1 node``)."""
        moved = [*(f"{h} out" for h in self.out), *(f"{h} in" for h in self.in_)]
        if len(self.in_) < len(self.out):
            moved.append(f"going on with {len(self.hosts)} node{'s' if len(self.hosts) != 1 else ''}")
        return ", ".join(moved)


def next_hosts(current: Sequence[Host], out: Iterable[str], healthy: Sequence[Host],
               nodes: tuple[int, int] | None) -> Next | str:
    """The next attempt after ``current``'s hosts ``out`` failed: each replaced by the first of the
    ``healthy`` spares (in order), or, when they run short, the hosts left alone if ``--nodes`` allows
    that many. A string: why the run cannot go on."""
    gone = [h.name for h in current if h.name in set(out)]
    left = [h for h in current if h.name not in set(gone)]
    came = list(healthy[:len(gone)])
    hosts = (*left, *came)
    if len(hosts) < len(current):
        short = f"no healthy spare for {', '.join(gone[len(came):])}"
        if nodes is None:
            return f"{short}, and without --nodes MIN:MAX the run does not go on with fewer nodes"
        if len(hosts) < nodes[0] or not hosts:
            return (f"{short}, and the {len(hosts)} node(s) left are fewer than --nodes {nodes[0]}:{nodes[1]} "
                    "allows")
    return Next(hosts, tuple(gone), tuple(h.name for h in came))


_DOWN = (HostErrorKind.TIMEOUT, HostErrorKind.UNREACHABLE, HostErrorKind.CONNECTION_LOST)


def down_hosts(failed: Mapping[str, Exception]) -> dict[str, str]:
    """Of the hosts that could not be connected to when a run starts (``failed``: by name), those that
    are down, each with why: a spare may stand in for them. One that answered wrongly (a changed host
    key, a refused login, no SSH server there) is left out: the preflight names it with its fix."""
    return {h: e.detail for h, e in failed.items() if isinstance(e, HostError) and e.kind in _DOWN}
