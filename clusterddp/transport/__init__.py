"""Transports run shell commands on a node. Loaded lazily by name so `--help` stays fast."""

from __future__ import annotations

from importlib import import_module

from ..inventory import Node, RunNode
from .base import CommandResult, Tail, Transport

__all__ = ["CommandResult", "Tail", "Transport", "connect"]

_BACKENDS = {"ssh": "clusterddp.transport.ssh", "local": "clusterddp.transport.local"}


def connect(host: RunNode) -> Transport:
    """Open a transport to ``host`` (raises :class:`~clusterddp.errors.HostError` naming it). A
    :class:`~clusterddp.inventory.Node` (a Slurm node) has none of its own: its run's backend reaches it
    (``backends.reach``), so asking here is a caller's mistake, refused naming the node."""
    if isinstance(host, Node) or host.transport not in _BACKENDS:
        from ..errors import HostError
        raise HostError(host.name, "not reached by a connection of its own; a command for a run's nodes goes "
                        "through the backend that ran it")
    module = import_module(_BACKENDS[host.transport])
    return module.open(host)
