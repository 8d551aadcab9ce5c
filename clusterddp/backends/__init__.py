"""The one registry of backends: a name -> module map, loaded lazily (``clusterddp --help`` imports
none of them, so neither paramiko nor torch), and the rule that picks one for an inventory or a run
record. This is the only place outside a backend that names one; adding a backend is a folder
beside ``ssh/`` and ``slurm/`` whose ``__init__`` has a ``BACKEND`` (:class:`base.Backend`), and one
line in :data:`BACKENDS`.
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


def name_of_inventory(inv: inv_mod.Inventory) -> str:
    return "slurm" if inv.slurm is not None else "ssh"


def for_inventory(inv: inv_mod.Inventory) -> Backend:
    """The backend that runs ``inv``'s jobs."""
    return get(name_of_inventory(inv))


def name_of_record(rec: RunRecord) -> str:
    return "slurm" if rec.slurm is not None else "ssh"


def for_record(rec: RunRecord) -> Backend:
    """The backend that ran the run ``rec`` records (a run is reached as recorded, whatever its
    inventory says now)."""
    return get(name_of_record(rec))


def reach(store: RunStore, rec: RunRecord, verb: str) -> Reach:
    """The nodes of the run ``rec`` records, as the backend that ran it reaches them, for ``verb``
    (``top``, ``prune``): :meth:`base.Backend.reach`, which refuses what that backend cannot do."""
    return for_record(rec).reach(store, rec, verb)
