"""DeepSpeed/MPI hostfiles (``worker-1 slots=4``) read into host entries, private to :mod:`clusterddp.inventory`.

A hostfile line is a host name, then ``key=value`` words: ``slots=N`` (processes on that host:
the inventory's ``gpus``), MPI's ``max_slots=N`` (accepted and ignored: clusterddp never
oversubscribes), and any one-value host field of the inventory (``address``, ``user``, ``port``,
``workdir``, ...). A bare host name takes every default (``gpus: auto``). ``#`` starts a comment.
This module only reads the lines: :func:`clusterddp.inventory.loader.parse_hostfile` validates each
host with the inventory's own schema, so the rules and messages are the same, located at the
hostfile's line (``hosts:3: port: ...``).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import InventoryError
from .model import HOST_NAME_RE, LOCAL, ascii_digits, show

# The inventory fields a hostfile line may set (lists and mappings, env and setup, have no
# one-word form), and how a value is read: YAML would read `port=22` as a number, so do we.
FIELDS: dict[str, type] = {"address": str, "user": str, "port": int, "identity_file": str, "known_hosts": str,
                           "host_key_policy": str, "python": str, "workdir": str, "connect_timeout": float,
                           "keepalive": float}
IGNORED = ("max_slots",)  # MPI's oversubscription limit: meaningless here
MAX_HOSTS = 10_000

# Characters that open a YAML construct at the start of a line: a file whose lines start so is YAML.
_YAML_START = tuple("-{[!&*%|>'\"?@`")
_NUMBER = re.compile(r"[0-9]+(\.[0-9]+)?")


def _words(line: str) -> list[str]:
    return line.split("#", 1)[0].split()


def is_hostfile(text: str) -> bool:
    """True when ``text`` reads as a hostfile: some host lines, and none that YAML would read as a
    mapping (a first word with ``:``, as in ``hosts:``) or start a YAML construct."""
    firsts = [w[0] for w in map(_words, text.split("\n")) if w]
    return bool(firsts) and not any(":" in f or f.startswith(_YAML_START) for f in firsts)


def _value(key: str, text: str) -> Any:
    if key == "slots" or FIELDS.get(key) is int:
        return int(text) if ascii_digits(text) and len(text) <= 9 else text
    if FIELDS.get(key) is float:
        return float(text) if _NUMBER.fullmatch(text) and len(text) <= 20 else text
    return text


def host_entries(text: str, path: str) -> tuple[list[dict[str, Any]], list[int]]:
    """The host entries of hostfile ``text`` (from ``path``), in file order, as the inventory's
    ``hosts:`` list would hold them, and the line of each. Raises :class:`InventoryError` naming the
    file and line for what is not a hostfile line; the entries' values are checked by the caller."""
    entries: list[dict[str, Any]] = []
    lines: list[int] = []
    seen: dict[str, int] = {}
    for n, raw in enumerate(text.split("\n"), 1):  # not splitlines(): a form feed is no line break in a hostfile
        words = _words(raw)
        if not words:
            continue
        if len(entries) >= MAX_HOSTS:
            raise InventoryError(path, f"more than {MAX_HOSTS:,} hosts", line=n, hint="is this the right file?")
        name, *pairs = words
        if not HOST_NAME_RE.fullmatch(name) or name == LOCAL:
            raise InventoryError(path, f"{show(name)} is not a host name: 1 to 128 letters, digits, '.', '_' or '-' "
                                 "(it names a log file), and not 'local'", line=n,
                                 hint="a hostfile line is `host slots=N`")
        if name in seen:
            raise InventoryError(path, f"duplicate host name {show(name)} (also line {seen[name]})", line=n,
                                 hint="list every host once, with all its slots: `host slots=N`")
        seen[name] = n
        entry: dict[str, Any] = {"name": name}
        for pair in pairs:
            key, sep, value = pair.partition("=")
            if not sep or not value:
                raise InventoryError(path, f"{show(pair)}: expected key=value", line=n,
                                     hint="a hostfile line is `host slots=N`, e.g. `gpu-01 slots=8`")
            if key not in FIELDS and key not in IGNORED and key != "slots":
                raise InventoryError(path, f"{show(key)}: unknown key", line=n,
                                     hint=f"a hostfile line takes slots=N and host fields: {', '.join(FIELDS)}")
            field = "gpus" if key == "slots" else key
            if field in entry:
                raise InventoryError(path, f"{key} given twice", line=n, hint="give each key once per line")
            if key not in IGNORED:
                entry[field] = _value(key, value)
        entries.append(entry)
        lines.append(n)
    return entries, lines
