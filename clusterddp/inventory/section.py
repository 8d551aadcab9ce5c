"""A backend's own part of an inventory file: the seam between the inventory reader and a backend.

An inventory either lists its hosts (``hosts:``, the SSH backend's) or names a backend's section by
its key (``slurm:``): the cluster that allocates the hosts. The inventory package knows no such
section; a backend declares its :class:`Section` (its key, its rules, how its validated entry becomes
the backend's settings, its part of the JSON Schema and of docs/inventory.md's field reference) and
the backends' registry hands the sections in (``sections``: key -> Section or None) to
:func:`clusterddp.inventory.load_named`, :func:`~clusterddp.inventory.load`,
:func:`~clusterddp.inventory.parse` and the schema generator. The rules a section is written with are
the inventory's own (:class:`Model`, :class:`Field`, ...), re-exported here as its public kit.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..errors import InventoryError
from ._inventory_schema import (  # the rule kit a section is written with
    ENV,
    HOST_ENTRY,
    REQUIRED,
    Anything,
    Bool,
    Field,
    Line,
    ListOf,
    Maybe,
    Model,
    Number,
    Str,
)
from .model import BUILTIN, Host

__all__ = ["ENV", "HOST_ENTRY", "REQUIRED", "Anything", "Bool", "Field", "ListOf", "Line", "Located", "Maybe",
           "Model", "Number", "Section", "Sections", "Str", "login_host"]


class Located(Protocol):
    """Where a section is read from: the file, its YAML tree and the whole document, so the section's
    own checks raise errors located as the reader's are (``lab.yaml:7: slurm.env.RANK``)."""

    @property
    def path(self) -> str: ...

    @property
    def data(self) -> Mapping[str, Any]:
        """The whole document, as read."""
        ...

    def where(self, loc: tuple[str | int, ...]) -> str:
        """``lab.yaml:7: slurm.login.identity_file``: a field of the file, for messages given later."""
        ...

    def error(self, message: str, loc: tuple[str | int, ...], hint: str | None = None) -> InventoryError:
        """An InventoryError (exit 2) at the field ``loc``."""
        ...

    def validate(self, model: Model, data: Mapping[str, Any]) -> Any:
        """The whole document ``data`` checked as ``model``, or an InventoryError at its first problem."""
        ...


def login_host(h: Any, identity_from: str | None) -> Host:
    """A validated host entry (``HOST_ENTRY``'s fields) that is not one of the run's hosts, such as a
    cluster's login host, as a Host: the defaults of a hosts[] entry, no GPUs of its own.
    ``identity_from``: where its identity_file is set (:meth:`Located.where`)."""
    return Host(name=h.name, address=h.address or h.name, user=h.user, port=h.port, identity_file=h.identity_file,
                identity_from=identity_from if h.identity_file else None,
                known_hosts=h.known_hosts or BUILTIN["known_hosts"],
                host_key_policy=h.host_key_policy or BUILTIN["host_key_policy"], gpus=1,
                python=h.python or BUILTIN["python"], workdir=BUILTIN["workdir"], env=tuple((h.env or {}).items()),
                setup=tuple(h.setup or ()), connect_timeout=float(h.connect_timeout or BUILTIN["connect_timeout"]),
                keepalive=float(BUILTIN["keepalive"] if h.keepalive is None else h.keepalive))


@dataclass(frozen=True)
class Section:
    """A backend's part of an inventory file, declared by the backend.

    ``key``: the top-level key that makes an inventory this backend's (its name in the registry);
    ``entry``: the rules of the block under it; ``read(entry, at)``: the validated block as the
    backend's settings (``Inventory.backend_settings``), or an InventoryError located by ``at``;
    ``allocates``: why an inventory of this kind lists no hosts (``hosts:``, ``defaults:``,
    ``master:`` and ``fanout:`` are refused with it); ``blocks``: other blocks its JSON Schema refers to,
    and ``trim(defs)`` what to drop from them; ``descriptions``: each of its fields' help, by name;
    ``docs``: its headings in docs/inventory.md's field reference (heading, schema blocks, the prefix
    of its fields' headings)."""

    key: str
    entry: Model
    read: Callable[[Any, Located], Any]
    allocates: str
    descriptions: Mapping[str, str] = field(default_factory=dict)
    blocks: tuple[Model, ...] = ()
    trim: Callable[[dict[str, Any]], None] | None = None
    docs: tuple[tuple[str, tuple[str, ...], str], ...] = ()

    @property
    def title(self) -> str:
        """Its kind of inventory in the JSON Schema (``SlurmInventory``)."""
        return f"{self.key.capitalize()}Inventory"

    def model(self) -> Model:
        """The rules of a whole inventory of this kind: what every inventory takes beside its machines,
        and the section, required."""
        from ._inventory_schema import COMMON
        return Model(self.title, {**COMMON, self.key: Field(self.entry, REQUIRED)})


# What the registry hands the reader: the section of a top-level key, or None (not a backend's key).
Sections = Callable[[str], "Section | None"]
