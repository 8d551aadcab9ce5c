"""Read and validate a YAML host inventory (or a DeepSpeed/MPI hostfile) into :mod:`.model`'s frozen data.

With its private modules ``_inventory_yaml`` (a strict, bounded YAML 1.2 reader), ``_inventory_schema``
(the shape) and ``_hostfile``, the only place that knows the file formats. Any text gives an
inventory or an InventoryError naming file, line and field.
Precedence for each host setting: CLI flag (applied later, in the plan) > host entry > inventory ``defaults`` >
``~/.ssh/config`` (for user, port, identity, address: left unset here, transport/ssh.py reads it) > built-in.
``env`` merges key by key (host wins); every other field is replaced whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import FileRefused, InventoryError
from ..files import read_bounded
from .model import (
    BUILTIN,
    DEFAULT_FANOUT,
    DEFAULT_MASTER_PORT,
    DEFAULT_QUARANTINE_S,
    LOCAL,
    Host,
    Inventory,
    Master,
    NotifyTarget,
    reserved_env,
    show,
    some,
)

if TYPE_CHECKING:  # yaml is imported when a file is parsed: commands that only read run.json skip it
    import yaml

    from ._inventory_schema import Model, Problem
    from .section import Section, Sections

def _path_str(loc: tuple) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            text = str(part)
            if not (text.isprintable() and len(text) <= 40 and " " not in text):
                text = show(text)
            out += ("." if out else "") + text
    return out


def _line_of(node: yaml.Node | None, loc: tuple) -> int | None:
    """The 1-based line of the field at ``loc`` (its key's line in a mapping), or of its nearest parent."""
    import yaml
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            item = next(((k, v) for k, v in node.value if getattr(k, "value", None) == part), None)
            if item is None:
                break
            line = item[0].start_mark.line + 1
            node = item[1]
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


def _where(path: str, root: yaml.Node | None, loc: tuple, line: int | None = None) -> str:
    """``lab.yaml:7: hosts[1].identity_file``: a field of the file, for messages given after loading."""
    line = line if line is not None or root is None else _line_of(root, loc)
    return f"{path}:{line}: {_path_str(loc)}" if line is not None else f"{path}: {_path_str(loc)}"


def _message(p: Problem) -> str:
    if p.kind == "extra_forbidden":
        return p.msg if "did you mean" in p.msg else \
            "unknown key; check its spelling against docs/inventory.md, \"Every field\""
    if p.kind == "too_short":
        return "must list at least one host"
    return p.msg


def _hint(p: Problem) -> str | None:
    if p.kind == "extra_forbidden" and p.loc and p.loc[-1] == "<<":
        return "merge keys (`<<: *x`) are YAML 1.1, not 1.2; put shared settings under `defaults:`"
    return None


def parse(text: str, path: str, sections: Sections | None = None) -> Inventory:
    """Validate inventory YAML text; raise :class:`InventoryError` naming file, line and field.

    The YAML is read strictly (see ``_inventory_yaml``): YAML 1.2 scalars, no duplicate keys,
    bounded size, nesting and aliases, so any text gives an inventory or a located error, quickly.
    ``sections``: the backends' sections by key (:mod:`.section`; the registry's
    :func:`clusterddp.backends.inventory_section`): a document with one of their keys is that backend's."""
    from ._inventory_yaml import Refused
    from ._inventory_yaml import load as load_yaml
    try:
        data, root = load_yaml(text)
    except Refused as e:
        raise InventoryError(path, e.message, field=_path_str(e.path) or None, line=e.line, hint=e.hint) from None
    if not isinstance(data, dict):
        raise InventoryError(path, "must be a YAML mapping with a `hosts:` list", line=1 if root is None else
                             _line_of(root, ()), hint="see inventory/lab.yaml for an example")
    for key in data:
        section = sections(key) if sections is not None and isinstance(key, str) else None
        if section is not None:
            return _parse_section(section, data, path, root)
    from ._inventory_schema import INVENTORY
    return _resolve(_validate(INVENTORY, data, path, root), path, root)


def _validate(model: Model, data: dict, path: str, root: yaml.Node | None) -> Any:
    """``data`` checked as ``model`` (:mod:`._inventory_schema`), or an InventoryError at the first problem."""
    from ._inventory_schema import Invalid, validate
    try:
        return validate(model, data)
    except Invalid as e:
        first = e.problems[0]
        more = len(e.problems) - 1
        hint = _hint(first)
        if more:
            hint = (hint + "; " if hint else "") + f"{more} more problem(s) after this one"
        raise InventoryError(path, _message(first), field=_path_str(first.loc) or None,
                             line=_line_of(root, first.loc), hint=hint) from None


def _parse_section(section: Section, data: dict, path: str, root: yaml.Node | None) -> Inventory:
    """A document of a backend's kind (its ``section.key`` given): what every inventory takes, and the
    section read by its backend (``Inventory.backend_settings``)."""
    for key in ("hosts", "defaults", "master", "fanout"):
        if key in data:
            raise InventoryError(path, f"not part of a `{section.key}:` inventory: {section.allocates}",
                                 field=key, line=_line_of(root, (key,)),
                                 hint=f"remove it; per-node settings (python, setup, env) go under `{section.key}:`")
    inv = _validate(section.model(), data, path, root)
    settings = section.read(getattr(inv, section.key), _Located(path, root, data))
    return Inventory(path, inv.name or Path(path).stem, (), Master("", "", 29500), tuple(inv.collect),
                     keep_runs=inv.keep_runs, backend=section.key, backend_settings=settings,
                     notify=_notify(inv.notify, path), **_watchdog(inv))


@dataclass(frozen=True)
class _Located:
    """:class:`.section.Located`: a section's errors located in this file, as the reader's are."""

    path: str
    root: yaml.Node | None
    data: Mapping[str, Any]

    def where(self, loc: tuple[str | int, ...]) -> str:
        return _where(self.path, self.root, loc)

    def error(self, message: str, loc: tuple[str | int, ...], hint: str | None = None) -> InventoryError:
        return InventoryError(self.path, message, field=_path_str(loc) or None, line=_line_of(self.root, loc),
                              hint=hint)

    def validate(self, model: Model, data: Mapping[str, Any]) -> Any:
        return _validate(model, dict(data), self.path, self.root)


def _resolve(inv: Any, path: str, root: yaml.Node | None, lines: list[int] | None = None) -> Inventory:
    """The validated file ``inv`` as an Inventory; ``lines``: a hostfile's line of each host."""
    lists = (("hosts", inv.hosts), ("spares", getattr(inv, "spares", [])))
    envs = [(("defaults", "env"), inv.defaults.env)] + [((key, i, "env"), h.env) for key, entries in lists
                                                        for i, h in enumerate(entries)]
    for loc, env in envs:
        for k in env or ():
            why = reserved_env(k)
            if why:
                raise InventoryError(path, "a reserved name", field=_path_str((*loc, k)),
                                     line=_line_of(root, (*loc, k)), hint=why)
    seen: dict[str, int] = {}
    where: dict[str, str] = {}  # each name's entry, for a duplicate's message: hosts and spares share names
    for key, entries in lists:
        for i, h in enumerate(entries):
            if h.name in where:
                raise InventoryError(path, f"duplicate host name {show(h.name)} (also {where[h.name]})",
                                     field=f"{key}[{i}].name", line=_line_of(root, (key, i, "name")),
                                     hint="give every host and spare a unique name")
            where[h.name] = f"{key}[{i}]"
            if key == "hosts":
                seen[h.name] = i
    d = inv.defaults
    hosts = [_host(path, root, lines, "hosts", i, h, d) for i, h in enumerate(inv.hosts)]
    spares = tuple(_host(path, root, None, "spares", i, h, d) for i, h in enumerate(lists[1][1]))
    m = inv.master
    master_name = m.host or hosts[0].name
    if master_name not in seen:
        spare = " (it is a spare)" if master_name in where else ""
        raise InventoryError(path, f"{show(master_name)} is not one of the hosts{spare}",
                             field="master.host", line=_line_of(root, ("master", "host")),
                             hint=f"use one of: {some(list(seen))}")
    master_host = hosts[seen[master_name]]
    master = Master(master_name, m.addr or master_host.address, m.port or DEFAULT_MASTER_PORT, m.port is not None)
    return Inventory(path, inv.name or Path(path).stem, tuple(hosts), master, tuple(inv.collect),
                     inv.fanout or DEFAULT_FANOUT, keep_runs=inv.keep_runs, notify=_notify(inv.notify, path),
                     quarantine_s=DEFAULT_QUARANTINE_S if inv.quarantine is None else float(inv.quarantine),
                     retry_job_failures=inv.retry_job_failures, quarantine_stragglers=inv.quarantine_stragglers,
                     spares=spares, restarts=getattr(inv, "restarts", None), checkpoints=tuple(inv.checkpoints),
                     **_watchdog(inv))


def _host(path: str, root: yaml.Node | None, lines: list[int] | None, key: str, i: int, h: Any, d: Any) -> Host:
    """Entry ``i`` of ``key`` (``hosts`` or ``spares``: the same shape, the same defaults) as a Host."""
    def pick(name: str) -> Any:
        v = getattr(h, name)
        return v if v is not None else getattr(d, name)
    env = {**(d.env or {}), **(h.env or {})}
    gpus = pick("gpus") or BUILTIN["gpus"]
    slots = tuple(sorted(gpus)) if isinstance(gpus, list) else None
    return Host(
        name=h.name, address=h.address or h.name, user=pick("user"), port=pick("port"),
        identity_file=pick("identity_file"), identity_from=_identity_from(path, root, lines, i, h, d, key),
        known_hosts=pick("known_hosts") or BUILTIN["known_hosts"],
        host_key_policy=pick("host_key_policy") or BUILTIN["host_key_policy"],
        gpus=len(slots) if slots else gpus, slots=slots, lease_dir=pick("lease_dir"),
        packages=_beside(path, (pick("packages") or {}).get("file")),
        wheels=(pick("packages") or {}).get("wheels", "push"), index_url=(pick("packages") or {}).get("index_url"),
        python=pick("python") or BUILTIN["python"],
        workdir=pick("workdir") or BUILTIN["workdir"], env=tuple(env.items()),
        setup=tuple(pick("setup") or ()),
        connect_timeout=float(pick("connect_timeout") or BUILTIN["connect_timeout"]),
        keepalive=float(BUILTIN["keepalive"] if pick("keepalive") is None else pick("keepalive")))


def _beside(path: str, value: str | None) -> str | None:
    """A file the inventory names (`packages:`), absolute, relative to the inventory's folder."""
    return None if value is None else str((Path(path).parent / Path(value).expanduser()).absolute())


def _notify(entries: list[Any], path: str) -> tuple[NotifyTarget, ...]:
    """`notify:` as targets; a webhook_file relative to the inventory's folder (read when a run starts)."""
    out = []
    for i, e in enumerate(entries):
        kind = next(k for k in ("webhook", "webhook_file", "command") if getattr(e, k) is not None)
        value = getattr(e, kind)
        if kind == "webhook_file":
            value = str((Path(path).parent / Path(value).expanduser()).absolute())
        out.append(NotifyTarget(kind, value, tuple(e.on or ()), float(e.timeout), f"{path}: notify[{i}]"))
    return tuple(out)


def _watchdog(inv: Any) -> dict:
    """`stall_timeout:` and `progress_regex:` as the Inventory holds them (and the sampler's keys)."""
    s = inv.stall_timeout
    i, idle = inv.metrics_interval, inv.idle_policy
    return {"stall_timeout": float(s) if s is not None else None, "progress_regex": inv.progress_regex,
            "metrics_interval": float(i) if i is not None else None, "metrics_regex": inv.metrics_regex,
            "idle_policy": None if idle is None else (float(idle.below), float(idle.minutes) * 60, bool(idle.stop))}


def _identity_from(path: str, root: yaml.Node | None, lines: list[int] | None, i: int, h: Any, d: Any,
                   key: str = "hosts") -> str | None:
    """Where entry ``i`` of ``key``'s identity_file was set: its own entry, or the defaults (see :func:`_where`)."""
    if lines is not None:  # a hostfile: one line per host, no defaults
        return f"{path}:{lines[i]}: identity_file" if h.identity_file is not None else None
    if h.identity_file is not None:
        return _where(path, root, (key, i, "identity_file"))
    if d.identity_file is not None:
        return _where(path, root, ("defaults", "identity_file"))
    return None


def parse_hostfile(text: str, path: str) -> Inventory:
    """Read hostfile ``text`` (from ``path``) into an :class:`Inventory`; hosts in file order, the first
    one the master. Raises :class:`InventoryError` naming the file, line and field."""
    from ._hostfile import host_entries
    from ._inventory_schema import INVENTORY, Invalid, validate

    entries, lines = host_entries(text, path)
    try:
        inv = validate(INVENTORY, {"hosts": entries})
    except Invalid as e:
        first = e.problems[0]
        loc = first.loc
        line = lines[loc[1]] if len(loc) > 1 and isinstance(loc[1], int) else None
        at = str(loc[2]) if len(loc) > 2 else None
        raise InventoryError(path, _message(first), field="slots" if at == "gpus" else at, line=line) from None
    return _resolve(inv, path, None, lines)


def load(path: str | Path, sections: Sections | None = None) -> Inventory:
    """Read and validate the inventory file at ``path`` (at most 1 MiB is read): YAML, or a
    DeepSpeed/MPI hostfile (see ``_hostfile``); ``sections`` as :func:`parse` takes them."""
    from ._hostfile import is_hostfile
    from ._inventory_yaml import MAX_BYTES
    p = Path(path)
    try:  # non-blocking, regular files only, bounded: a FIFO or /dev/zero named as the inventory is refused
        raw, _ = read_bounded(p, MAX_BYTES)
    except FileRefused as e:
        if e.reason == "missing":
            raise InventoryError(str(p), "no such file", hint="pass the path of a YAML inventory, or `local`") from None
        if e.reason == "too_large":
            raise InventoryError(str(p), f"larger than {MAX_BYTES:,} bytes (1 MiB), the most an inventory may be",
                                 hint="is this the right file?") from None
        raise InventoryError(str(p), e.problem, hint="pass the path of a YAML inventory file, or `local`") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        raise InventoryError(str(p), f"not UTF-8 text (byte 0x{raw[e.start]:02x})", line=line,
                             hint="save the file as UTF-8") from None
    if is_python(p, text):
        raise _python_script(str(p))
    try:
        if is_hostfile(text):  # a DeepSpeed/MPI hostfile: `host slots=N` lines
            return parse_hostfile(text, str(p))
        return parse(text, str(p), sections)
    except InventoryError:
        if _PYTHON_LINE.search(text):  # a script without .py or #!: it fails on some line of Python
            raise _python_script(str(p)) from None
        raise


_PYTHON_LINE = re.compile(r"^(import [A-Za-z_][\w.]*|from [A-Za-z_.][\w.]* import |def [A-Za-z_]\w*\(|"
                          r"if __name__ == )", re.M)


def is_python(path: Path, text: str) -> bool:
    """A Python script (named .py, or a `#!` line naming python), never an inventory."""
    first = text.split("\n", 1)[0]
    return path.suffix.lower() in (".py", ".pyw") or (first.startswith("#!") and "python" in first)


def _python_script(path: str) -> InventoryError:
    """A Python script named where the inventory goes: most often `up train.py inv.yaml`, the two swapped."""
    return InventoryError(path, "is a Python script, not an inventory",
                          hint="the inventory comes first, then the script: `clusterddp up INVENTORY SCRIPT "
                               "[-- ARGS...]`; an inventory is a YAML file (see inventory/lab.yaml), a hostfile, "
                               "or `local`")


def load_named(arg: str, gpus: int | None = None, hosts: list[str] | None = None,
               exclude: list[str] | None = None, sections: Sections | None = None) -> Inventory:
    """The inventory a command line names, read the one way every command reads it: ``local`` (this
    machine, this Python, ``gpus`` processes or one per GPU) or a file (:func:`load`); narrowed to
    ``hosts`` less ``exclude`` (:meth:`Inventory.narrow`). (--fanout over it: :func:`clusterddp.runspec.fanout_of`.)
    ``sections``: the backends' inventory sections (:func:`parse`); the CLI passes the registry's."""
    import sys
    inv = local(gpus=gpus or "auto", python=sys.executable) if arg == LOCAL else load(arg, sections)
    return inv.narrow(hosts, exclude)


def local(gpus: int | str = "auto", python: str = "python3") -> Inventory:
    """The single-node inventory behind ``clusterddp up local``: this machine, no SSH."""
    host = Host(name=LOCAL, address="127.0.0.1", user=None, port=None, identity_file=None,
                known_hosts=BUILTIN["known_hosts"], host_key_policy="strict", gpus=gpus, python=python,
                workdir=".", env=(), setup=(), connect_timeout=BUILTIN["connect_timeout"], transport="local")
    return Inventory(LOCAL, LOCAL, (host,), Master(LOCAL, "127.0.0.1", 29500), ())


def metrics_regex_problem(regex: str) -> str | None:
    """Why ``regex`` is no metrics regex (`metrics_regex:`, `--metrics-regex`), or None."""
    from ._inventory_schema import _metrics_regex
    try:
        _metrics_regex(regex)
    except ValueError as e:
        return str(e)
    return None
