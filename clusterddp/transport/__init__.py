"""Transports run shell commands on a node. Loaded lazily by name so `--help` stays fast."""

from __future__ import annotations

from importlib import import_module

from ..inventory import Host
from .base import CommandResult, Tail, Transport

__all__ = ["CommandResult", "Tail", "Transport", "connect"]

_BACKENDS = {"ssh": "clusterddp.transport.ssh", "local": "clusterddp.transport.local"}


def connect(host: Host) -> Transport:
    """Open a transport to ``host`` (raises :class:`~clusterddp.errors.HostError` naming it)."""
    if host.transport not in _BACKENDS:  # a Slurm node: reached through its run's backend (backends.reach) only
        from ..errors import HostError
        raise HostError(host.name, f"not reached by a transport of its own (its settings say {host.transport!r}); "
                        "a command for a run's nodes goes through the run's backend")
    module = import_module(_BACKENDS[host.transport])
    return module.open(host)
