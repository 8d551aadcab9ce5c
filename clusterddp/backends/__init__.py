"""The one registry of backends: a name -> module map, loaded lazily (``clusterddp --help`` imports
none of them, so neither paramiko nor torch), and the pick of one for an inventory or a run record, by
the name each carries (``Inventory.backend``: the section key of its file; the backend's part of
run.json, ``RunRecord.backend_name``). This is the only place outside a backend that names one; adding
a backend is a folder beside ``ssh/`` and ``slurm/`` whose ``__init__`` has a ``BACKEND``
(:class:`base.Backend`: its code, its inventory section, its part of run.json, its secrets), and one
line in :data:`BACKENDS` (its name is its section's key in an inventory file).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from .. import inventory as inv_mod
from .base import (
    load_inventory,  # noqa: F401 - the inventory loader of `up` and `schedule add`
    on_hosts,  # noqa: F401 - the refusal of exec, leases, top --inventory where nothing lists hosts
)

if TYPE_CHECKING:
    from ..inventory.section import Section
    from ..nodeops import Reach
    from ..record import RunRecord
    from ..store import RunStore
    from .base import Backend

BACKENDS = {
    "ssh": "clusterddp.backends.ssh",      # SSH hosts, and `local` (this machine, one host)
    "slurm": "clusterddp.backends.slurm",  # a `slurm:` inventory: Slurm allocates, starts and kills
}


def get(name: str) -> Backend:
    """The backend called ``name`` (a key of :data:`BACKENDS`)."""
    backend: Backend = importlib.import_module(BACKENDS[name]).BACKEND
    return backend


def inventory_section(key: str) -> Section | None:
    """The inventory section whose key is ``key`` (``slurm``): that backend's, or None (not a backend's
    key, or a backend that lists hosts). What :func:`load_inventory` hands the inventory reader."""
    return get(key).section() if key in BACKENDS else None


def inventory_sections() -> tuple[Section, ...]:
    """Every backend's inventory section (the JSON Schema and docs/inventory.md are rendered from them)."""
    return tuple(s for s in (get(name).section() for name in BACKENDS) if s is not None)


def inventory_keys() -> tuple[str, ...]:
    """Every top-level key that makes a YAML file an inventory: ``hosts:`` (an inventory that lists its
    hosts, the SSH backend's) and each backend's section key. What the upload asks, through its caller,
    to leave another inventory in the script's folder out (it may hold env secrets)."""
    return ("hosts", *(s.key for s in inventory_sections()))


def name_of_inventory(inv: inv_mod.Inventory) -> str:
    return inv.backend


def for_inventory(inv: inv_mod.Inventory) -> Backend:
    """The backend that runs ``inv``'s jobs."""
    return get(name_of_inventory(inv))


def name_of_record(rec: RunRecord) -> str:
    return rec.backend_name


def for_record(rec: RunRecord) -> Backend:
    """The backend that ran the run ``rec`` records (a run is reached as recorded, whatever its
    inventory says now); a UsageError (exit 2) when this clusterddp has no backend of that name."""
    name = name_of_record(rec)
    if name not in BACKENDS:
        from ..errors import UsageError
        raise UsageError(f"run {rec.run_id} was run by the backend {name!r}, which this clusterddp does not have "
                         f"({', '.join(BACKENDS)})", "upgrade clusterddp to reach this run")
    return get(name)


def reach(store: RunStore, rec: RunRecord, verb: str) -> Reach:
    """The nodes of the run ``rec`` records, as the backend that ran it reaches them, for ``verb``
    (``top``, ``prune``): :meth:`base.Backend.reach`, which refuses what that backend cannot do."""
    return for_record(rec).reach(store, rec, verb)
