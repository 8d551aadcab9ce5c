"""Read and validate a YAML host inventory into frozen data.

With its private schema module ``_inventory_schema``, the only place that knows the YAML shape.
Precedence for each host setting: CLI flag (applied later, in the plan) > host entry > inventory ``defaults`` >
``~/.ssh/config`` (for user, port, identity, address: left unset here, transport/ssh.py reads it) > built-in.
``env`` merges key by key (host wins); every other field is replaced whole.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import InventoryError

if TYPE_CHECKING:  # yaml is imported when a file is parsed: commands that only read run.json skip it
    import yaml

LOCAL = "local"
HOST_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

BUILTIN = dict(host_key_policy="strict", gpus="auto", python="python3", workdir="~/clusterddp",
               known_hosts="~/.ssh/known_hosts", connect_timeout=10.0, keepalive=5.0)
DEFAULT_FANOUT = 32  # hosts contacted at once by fleet commands, like pdsh's default


@dataclass(frozen=True)
class Host:
    """One node, with defaults merged in. ``None`` means: let ssh_config or the SSH library decide."""

    name: str
    address: str
    user: str | None
    port: int | None
    identity_file: str | None
    known_hosts: str
    host_key_policy: str
    gpus: int | str  # a count, or "auto"
    python: str
    workdir: str
    env: tuple[tuple[str, str], ...]
    setup: tuple[str, ...]
    connect_timeout: float
    transport: str = "ssh"  # "ssh" or "local"
    keepalive: float = BUILTIN["keepalive"]  # seconds between SSH keepalives; 0: none


@dataclass(frozen=True)
class Master:
    host: str
    addr: str
    port: int


@dataclass(frozen=True)
class Inventory:
    """A validated inventory: hosts in node-rank order."""

    path: str
    name: str
    hosts: tuple[Host, ...]
    master: Master
    collect: tuple[str, ...] = field(default=())
    fanout: int = DEFAULT_FANOUT  # at most this many hosts are contacted at once

    def select(self, names: list[str]) -> "Inventory":
        """The same inventory restricted to ``names`` (kept in inventory order)."""
        known = {h.name for h in self.hosts}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise InventoryError(self.path, f"--hosts names {', '.join(unknown)}, not in the inventory",
                                 hint=f"choose from: {', '.join(sorted(known))}")
        hosts = tuple(h for h in self.hosts if h.name in names)
        master = self.master
        if master.host not in names:  # the master left the subset: the first chosen host leads
            master = Master(hosts[0].name, hosts[0].address, master.port)
        return Inventory(self.path, self.name, hosts, master, self.collect, self.fanout)


def _path_str(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """The 1-based line of the YAML node at ``loc`` (or its nearest parent)."""
    import yaml
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            nxt = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            if nxt is None:  # an unknown key: point at the key itself
                key = next((k for k, _ in node.value if getattr(k, "value", None) == part), None)
                return key.start_mark.line + 1 if key is not None else line
            node = nxt
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
        line = node.start_mark.line + 1
    return line


def _message(err: dict) -> str:
    kind, msg = err["type"], err["msg"]
    if kind == "extra_forbidden":
        return "unknown key; check its spelling against the inventory reference in the README"
    if kind == "missing":
        return "required, but missing"
    if kind == "too_short":
        return "must list at least one host"
    if msg.startswith("Value error, "):
        return msg[len("Value error, "):]
    return msg[0].lower() + msg[1:]


def parse(text: str, path: str) -> Inventory:
    """Validate inventory YAML text; raise :class:`InventoryError` naming file, field and line."""
    import yaml
    try:
        data = yaml.safe_load(text)
        root = yaml.compose(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        problem = getattr(e, "problem", None) or str(e)
        raise InventoryError(path, f"not valid YAML: {problem}", line=mark.line + 1 if mark else None,
                             hint="fix the YAML syntax at that line") from None
    if not isinstance(data, dict):
        raise InventoryError(path, "must be a YAML mapping with a `hosts:` list",
                             hint="see inventory/lab.yaml for an example")
    from pydantic import ValidationError  # imported here: `up local` and --help never pay for pydantic

    from ._inventory_schema import InventoryFile
    try:
        inv = InventoryFile.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(p for p in err["loc"] if isinstance(p, int) or not str(p).startswith(("function-", "literal[")))
        more = len(e.errors()) - 1
        raise InventoryError(path, _message(err), field=_path_str(loc) or None, line=_line_of(root, loc),
                             hint=f"{more} more problem(s) after this one" if more else None) from None
    return _resolve(inv, path, root)


def _resolve(inv: Any, path: str, root: yaml.Node) -> Inventory:
    seen: dict[str, int] = {}
    for i, h in enumerate(inv.hosts):
        if h.name in seen:
            raise InventoryError(path, f"duplicate host name {h.name!r} (also hosts[{seen[h.name]}])",
                                 field=f"hosts[{i}].name", line=_line_of(root, ("hosts", i, "name")),
                                 hint="give every host a unique name")
        seen[h.name] = i
    d = inv.defaults
    hosts = []
    for h in inv.hosts:
        def pick(key: str) -> Any:
            v = getattr(h, key)
            return v if v is not None else getattr(d, key)
        env = {**(d.env or {}), **(h.env or {})}
        hosts.append(Host(
            name=h.name, address=h.address or h.name, user=pick("user"), port=pick("port"),
            identity_file=pick("identity_file"),
            known_hosts=pick("known_hosts") or BUILTIN["known_hosts"],
            host_key_policy=pick("host_key_policy") or BUILTIN["host_key_policy"],
            gpus=pick("gpus") or BUILTIN["gpus"], python=pick("python") or BUILTIN["python"],
            workdir=pick("workdir") or BUILTIN["workdir"], env=tuple(env.items()),
            setup=tuple(pick("setup") or ()),
            connect_timeout=float(pick("connect_timeout") or BUILTIN["connect_timeout"]),
            keepalive=float(BUILTIN["keepalive"] if pick("keepalive") is None else pick("keepalive"))))
    m = inv.master
    master_name = m.host or hosts[0].name
    if master_name not in seen:
        raise InventoryError(path, f"{master_name!r} is not one of the hosts", field="master.host",
                             line=_line_of(root, ("master", "host")), hint=f"use one of: {', '.join(seen)}")
    master_host = hosts[seen[master_name]]
    master = Master(master_name, m.addr or master_host.address, m.port)
    return Inventory(path, inv.name or Path(path).stem, tuple(hosts), master, tuple(inv.collect),
                     inv.fanout or DEFAULT_FANOUT)


def load(path: str | Path) -> Inventory:
    """Read and validate the inventory file at ``path``."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InventoryError(str(p), "no such file", hint="pass the path of a YAML inventory, or `local`") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InventoryError(str(p), f"cannot be read: {e}") from None
    return parse(text, str(p))


def local(gpus: int | str = "auto", python: str = "python3") -> Inventory:
    """The single-node inventory behind ``clusterddp up local``: this machine, no SSH."""
    host = Host(name=LOCAL, address="127.0.0.1", user=None, port=None, identity_file=None,
                known_hosts=BUILTIN["known_hosts"], host_key_policy="strict", gpus=gpus, python=python,
                workdir=".", env=(), setup=(), connect_timeout=BUILTIN["connect_timeout"], transport="local")
    return Inventory(LOCAL, LOCAL, (host,), Master(LOCAL, "127.0.0.1", 29500), ())
