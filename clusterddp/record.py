"""The run record (``run.json``) as typed, frozen data, and the one vocabulary of run and node states.

Every module that writes, compares or prints a state uses :class:`RunStatus` and :class:`NodeState`;
every read of ``run.json`` goes through :meth:`RunRecord.from_json`, which also reads records written
before this module existed (schema 0: no ``schema``, no ``fanout``; node states ``exited``, ``missing``
and ``unreachable`` written by ``clusterddp status``). Pure data: no files, no network.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import enum
import re
import signal
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from . import jsonread
from .errors import RecordError
from .failure import KINDS, MAX_HANG_GROUPS, MAX_HANG_RANKS, Failure, Hang, HangGroup, HangRank
from .failure import MAX_FRAMES as _MAX_FRAMES
from .failure import MAX_LOG_LINES as _MAX_LOG_LINES
from .failure import MAX_OTHERS as _MAX_OTHERS
from .flight import Flight
from .inventory import DEFAULT_FANOUT, ENV_NAME_RE, HOST_NAME_RE, Host, Node, RunNode
from .jsonread import REQUIRED
from .jsonread import short as _short

VERSION_RE = re.compile(r"[0-9A-Za-z.+-]{1,64}")  # a PEP 440 version, as clusterddp --version prints it
SCHEMA = 1  # 0: records written before the schema field (read as well)
RUN_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")  # it names the run folder
MAX_FANOUT = 1024  # as the inventory allows


class _Words(str, enum.Enum):
    """A str enum that prints as its word, on every Python version we support."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class RunStatus(_Words):
    """How a run stands. The exit code of `up` (and of the run record) follows from it."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"

    def is_terminal(self) -> bool:
        return self is not RunStatus.RUNNING

    @property
    def exit_code(self) -> int | None:
        """0 succeeded, 1 failed, 130 stopped (as for Ctrl-C); None while running."""
        return _EXIT_CODES.get(self)


_EXIT_CODES = {RunStatus.SUCCEEDED: 0, RunStatus.FAILED: 1, RunStatus.STOPPED: 130}


class NodeState(_Words):
    """How one node's part of a run stands, as `up`, `status` and `stop` record and print it.

    ``PENDING -> STARTING -> RUNNING -> SUCCEEDED | FAILED | LOST``; ``STOPPED`` when a teardown ended
    it (another node failed, Ctrl-C, `clusterddp stop`); ``UNREACHABLE`` when the last look could not
    reach the node (its job may still run).
    """

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    SUCCEEDED = "succeeded"   # exit code 0
    FAILED = "failed"         # a non-zero exit code, or it could not be started
    LOST = "lost"             # ended with no exit code known (killed, folder gone, stopped answering)
    STOPPED = "stopped"
    UNREACHABLE = "unreachable"

    def is_terminal(self) -> bool:
        return self in _TERMINAL

    def ended_badly(self) -> bool:
        return self.is_terminal() and self is not NodeState.SUCCEEDED

    @classmethod
    def of_exit_code(cls, code: int | None) -> NodeState:
        """A job that ended with ``code`` (None: no exit code was recorded)."""
        if code is None:
            return cls.LOST
        return cls.SUCCEEDED if code == 0 else cls.FAILED


def exit_text(code: int) -> str:
    """An exit code as people read it: ``exit code 143: SIGTERM`` where it is the shell's 128 + a signal."""
    if 128 < code < 128 + 65:
        try:
            return f"exit code {code}: {signal.Signals(code - 128).name}"
        except ValueError:
            pass
    return f"exit code {code}"


def ended_at(started_at: str, node_ends: Iterable[int | None], now: dt.datetime) -> str:
    """When a run whose nodes have all ended did end, as run.json's ``ended_at``: the last of its nodes'
    own end times (epoch seconds by each node's clock, None where a node did not say), kept between
    ``started_at`` and ``now`` (a node clock ahead of ours must not end the run in the future, one
    behind before it started); ``now`` when no node said, as for a run that was just seen ending."""
    known = [t for t in node_ends if t is not None]
    end = now.astimezone(dt.timezone.utc)
    if known:
        try:
            start = dt.datetime.fromisoformat(started_at)
        except ValueError:
            start = end
        if start.tzinfo is None:
            start = start.replace(tzinfo=dt.timezone.utc)
        try:
            node = dt.datetime.fromtimestamp(max(known), dt.timezone.utc)
        except (OverflowError, OSError, ValueError):  # beyond what a datetime holds: a node's nonsense
            node = end
        end = min(max(node, start), end)
    return end.isoformat(timespec="seconds")


_TERMINAL = frozenset({NodeState.SUCCEEDED, NodeState.FAILED, NodeState.LOST, NodeState.STOPPED})
# What a status report without an exit code means, for the record's `error`.
_NO_CODE = {"lost": "no process and no exit code", "missing": "no run folder on the node",
            "exited": "the exit code file is unreadable"}


def from_report(kind: str, exit_code: int | None) -> tuple[NodeState, str | None]:
    """The state a node's status report means (``plan.status_command``'s line, as ``nodeops.parse_status``
    reads it: ``running``, ``exited`` + code, ``lost``, ``missing``), and why when no exit code says it."""
    if kind == "running":
        return NodeState.RUNNING, None
    state = NodeState.of_exit_code(exit_code if kind == "exited" else None)
    return state, (_NO_CODE.get(kind, f"unexpected status report {kind!r}") if state is NodeState.LOST else None)


@dataclass(frozen=True)
class NodeRecord:
    """One node of a recorded run: where it is (the settings it ran with: an inventory's Host, or a Node
    that its backend reaches, such as a Slurm node) and how it stands."""

    host: str
    address: str
    node_rank: int
    nproc: int | str           # a count, or "auto" (probed on the node)
    run_dir: str
    control_dir: str
    marker: str
    settings: RunNode
    state: NodeState = NodeState.PENDING
    exit_code: int | None = None
    error: str | None = None

    def describe(self) -> str:
        """The node's state as `status` and `stop` print it: ``stopped (exit code 143: SIGTERM)``,
        ``lost`` (its ``error`` says why; the CLI adds it, escaped)."""
        return f"{self.state}" + (f" ({exit_text(self.exit_code)})" if self.exit_code is not None else "")

    def seen(self, state: NodeState, exit_code: int | None = None, error: str | None = None) -> NodeRecord:
        """This node after being seen in ``state``: the one rule for every writer (`up`, `status`, `stop`).

        A node recorded as stopped stays stopped once seen ended (its SIGTERM exit code is not a failure
        of its own); a node with a recorded outcome keeps it when it can no longer be seen (its run folder
        cleaned up, its host down). Otherwise what was seen wins.
        """
        if self.state is NodeState.STOPPED and state.is_terminal():
            return replace(self, exit_code=exit_code if exit_code is not None else self.exit_code)
        if self.state.is_terminal() and state in (NodeState.LOST, NodeState.UNREACHABLE):
            return self
        return replace(self, state=state, exit_code=exit_code, error=error)

    def to_json(self) -> dict[str, Any]:
        settings = _node_json(self.settings) if isinstance(self.settings, Node) else _host_json(self.settings)
        return {"host": self.host, "address": self.address, "node_rank": self.node_rank, "nproc": self.nproc,
                "run_dir": self.run_dir, "control_dir": self.control_dir, "marker": self.marker,
                "state": self.state.value, "exit_code": self.exit_code, "error": self.error, "settings": settings}

    @classmethod
    def from_json(cls, data: Any, path: str, where: str) -> NodeRecord:
        r = _Reader(data, path, where)
        exit_code, error, word = r.get("exit_code", int | None), r.get("error", str | None), r.get("state", str)
        if word == "missing" and error is None:  # schema 0's word: keep what it meant
            error = _NO_CODE["missing"]
        host = _name(r.get("host", str), HOST_NAME_RE, path, f"{where}.host", "a host name (letters, digits, . _ -)")
        settings = _run_node(r.get("settings", dict), path, f"{where}.settings")
        if settings.name != host:
            raise RecordError(path, f"{where}.settings.name", f"{settings.name!r} is not the node's host {host!r}")
        return cls(host=host, address=r.get("address", str),
                   node_rank=_at_least(r.get("node_rank", int), 0, r, "node_rank"),
                   nproc=_count(r.get("nproc", int | str), r, "nproc"), run_dir=r.get("run_dir", str),
                   control_dir=r.get("control_dir", str), marker=r.get("marker", str), settings=settings,
                   state=_node_state(word, exit_code, path, f"{where}.state"), exit_code=exit_code, error=error)


BACKEND_NAME_RE = re.compile(r"[a-z][a-z0-9_]{0,31}")  # a backend's name in the registry


@dataclass(frozen=True)
class BackendPart:
    """A backend's own part of run.json: which backend ran the run (``name``, the registry's), the
    version of the part's shape (``version``, the backend's own count) and what it wrote (``data``: a
    JSON object, opaque here). In the file: ``"backend": {"name": N, "version": V}`` and the part under
    the backend's name (``"slurm": {...}``, as records have always had it). This module checks the
    frame (a backend's name that is none of the record's own keys, a version, sane JSON values:
    :func:`clusterddp.jsonread.sane`); the
    backend reads ``data`` back as untrusted, its errors located at ``<name>.<field>`` of ``source``
    (the file it was read from)."""

    name: str
    version: int
    data: Mapping[str, Any]
    source: str = dataclasses.field(default="run.json", compare=False)  # where it was read from

    @classmethod
    def from_json(cls, record: dict, path: str) -> BackendPart | None:
        """run.json's part (None: an SSH or local run, which keeps none); a record written before the
        ``backend`` key (a Slurm run's ``slurm`` object alone) is read as version 1 of that part."""
        if record.get("backend") is None:
            legacy = next((n for n in _LEGACY_PARTS if record.get(n) is not None), None)
            if legacy is None:
                return None
            name, version = legacy, 1
        else:
            r = _Reader(record["backend"], path, "backend")
            name = _name(r.get("name", str), BACKEND_NAME_RE, path, "backend.name", "a backend's name (a-z, 0-9, _)")
            if name in _RECORD_KEYS:
                raise RecordError(path, "backend.name", f"{name!r} is one of the record's own keys, no backend's")
            version = _between(r.get("version", int), 1, 1000, r, "version")
        body = _Reader(record, path, "").get(name, dict)
        jsonread.sane(body, name, lambda field, problem: RecordError(path, field, problem))
        return cls(name, version, body, path)


# Before each backend owned its part of run.json, a Slurm run's record had the ``slurm`` object alone
# (its part's version 1), no ``backend``. No other backend wrote a part then, so this list never grows.
_LEGACY_PARTS = ("slurm",)
# The record's own keys (RunRecord.to_json's), never a backend's part.
_RECORD_KEYS = frozenset({"schema", "run_id", "name", "inventory", "script", "args", "status", "exit_code",
                          "failed_host", "schedule", "local", "started_at", "ended_at", "launch_dir", "master",
                          "collect", "fanout", "updated_at", "nodes", "failure", "backend", "attempts",
                          "lost_nodes", "clusterddp_version", "resumed_from"})


MAX_ATTEMPTS = 1000   # entries of `attempts` a record may hold (a run makes one per failed attempt)
MAX_WHY = 2000        # characters of an entry's `why` (the writer keeps one line)


@dataclass(frozen=True)
class Attempt:
    """A decision after a failed attempt of an attached SSH run (``attempts`` in run.json): attempt
    ``attempt`` (2, 3, ...) started at ``at`` without the hosts ``out`` and with the spares ``in_``
    (none: it went on with fewer nodes); ``attempt`` None: the run ended there instead (``out``: the
    hosts at fault, if any). ``why``: the one line said on the terminal."""

    attempt: int | None
    at: str
    out: tuple[str, ...]
    in_: tuple[str, ...]
    why: str

    def to_json(self) -> dict[str, Any]:
        return {"attempt": self.attempt, "at": self.at, "out": list(self.out), "in": list(self.in_), "why": self.why}

    @classmethod
    def from_json(cls, data: Any, path: str, where: str) -> Attempt:
        r = _Reader(data, path, where)
        attempt = r.get("attempt", int | None)
        if attempt is not None:
            _between(attempt, 2, MAX_ATTEMPTS + 1, r, "attempt")
        why = r.get("why", str)
        if len(why) > MAX_WHY:
            raise RecordError(path, r.field("why"), f"longer than {MAX_WHY} characters")
        hosts = {}
        for key in ("out", "in"):
            names = r.get(key, tuple[str, ...])
            if len(names) > MAX_FANOUT:
                raise RecordError(path, r.field(key), f"more than {MAX_FANOUT} hosts")
            hosts[key] = tuple(_name(h, HOST_NAME_RE, path, f"{r.field(key)}[{i}]", "a host name")
                               for i, h in enumerate(names))
        return cls(attempt, r.get("at", str)[:64], hosts["out"], hosts["in"], why)

    def describe(self) -> str:
        """The entry as `status` prints it."""
        moved = ", ".join([*(f"{h} out" for h in self.out), *(f"{h} in" for h in self.in_)]) or "no host changed"
        head = f"attempt {self.attempt}" if self.attempt is not None else "ended"
        return f"{head} ({self.at}): {moved}: {self.why}"


MAX_RESUMED = 64  # checkpoints (series) named in ``resumed_from``


@dataclass(frozen=True)
class ResumedFrom:
    """Where a run started from (``up --resume RUN``; ``resumed_from`` in run.json): the newest
    checkpoint of each series that run ``run`` left, each put on every node of this run at the same
    path under its run folder before the job started. ``checkpoints``: their names (a file, or a folder
    ending in /); ``step``: the highest step their names hold (None: none holds a number); ``source``:
    where they came from (``mirror``, ``collected``, ``node <host>``, several joined by ", ")."""

    run: str
    checkpoints: tuple[str, ...]
    step: int | None
    source: str

    def to_json(self) -> dict[str, Any]:
        return {"run": self.run, "checkpoints": list(self.checkpoints), "step": self.step, "source": self.source}

    @classmethod
    def from_json(cls, data: Any, path: str) -> ResumedFrom:
        r = _Reader(data, path, "resumed_from")
        run = _name(r.get("run", str), RUN_ID_RE, path, r.field("run"), "a run id (letters, digits, . _ -)")
        names = r.get("checkpoints", tuple[str, ...])
        if not 1 <= len(names) <= MAX_RESUMED or any(not n or len(n) > 4096 for n in names):
            raise RecordError(path, r.field("checkpoints"), f"must be 1 to {MAX_RESUMED} paths")
        step = r.get("step", int | None)
        if step is not None:
            _at_least(step, 0, r, "step")
        return cls(run, names, step, r.get("source", str)[:1024])

    def describe(self) -> str:
        """The line `status` prints."""
        step = f"step {self.step}; " if self.step is not None else ""
        return f"resumed from run {self.run}: {', '.join(self.checkpoints)} ({step}source: {self.source})"


@dataclass(frozen=True)
class RunRecord:
    """Everything known about one run: enough to reach its nodes again without the inventory."""

    run_id: str
    name: str | None
    inventory: str             # the inventory's absolute path, or "local"
    script: str
    args: tuple[str, ...]
    status: RunStatus
    failed_host: str | None
    schedule: str | None       # the schedule that started it
    local: bool
    started_at: str
    ended_at: str | None
    launch_dir: str
    master_addr: str
    master_port: int
    collect: tuple[str, ...]
    nodes: tuple[NodeRecord, ...]
    fanout: int = DEFAULT_FANOUT   # hosts contacted at once by status, stop, logs and collect
    schema: int = SCHEMA
    failure: Failure | None = None  # why it failed: the rank that failed first (clusterddp.failure)
    # The part of the backend that ran it, where that backend keeps one (a Slurm run: its job); None
    # for an SSH or local run. Older records' ``slurm`` object alone is read as its version 1.
    backend: BackendPart | None = None
    # When this record was last written (the store stamps every write): what it says of a running run is
    # as of then, the last look at its nodes (`up`, `status`, `stop`). None in records written before it.
    updated_at: str | None = None
    # The decisions after failed attempts (an SSH run with spares or --nodes MIN:MAX), oldest first;
    # absent from older records. ``nodes`` are always the current (last) attempt's.
    attempts: tuple[Attempt, ...] = ()
    # The nodes of earlier attempts that were lost (its job may run on there, out of reach): `stop` ends
    # what is left of it once the host answers again, then drops it from here. Absent from older records.
    lost: tuple[NodeRecord, ...] = ()
    # The clusterddp that started the run (``clusterddp --version``); None in records written before it.
    version: str | None = None
    # `up --resume RUN`: the checkpoints this run started from (absent from older records and from runs
    # that did not resume).
    resumed_from: ResumedFrom | None = None

    @property
    def attempt(self) -> int:
        """The number of the run's current (or last) attempt: 1 until a failed one was followed by another."""
        return max((a.attempt for a in self.attempts if a.attempt is not None), default=1)

    @property
    def exit_code(self) -> int | None:
        return self.status.exit_code

    @property
    def backend_name(self) -> str:
        """The registry's name of the backend that ran it: its part's, or ``ssh`` (SSH and local runs)."""
        return self.backend.name if self.backend is not None else "ssh"

    @property
    def hosts(self) -> list[str]:
        return [n.host for n in self.nodes]

    def node(self, host: str) -> NodeRecord:
        return next(n for n in self.nodes if n.host == host)

    def seen(self, states: Mapping[str, tuple[NodeState, int | None, str | None]]) -> RunRecord:
        """The record after its nodes were seen: ``{host: (state, exit code, error)}``, by :meth:`NodeRecord.seen`."""
        return replace(self, nodes=tuple(n.seen(*states[n.host]) if n.host in states else n for n in self.nodes))

    def to_json(self) -> dict[str, Any]:
        """run.json's content; its keys are read by people and scripts: keep them."""
        return {"schema": SCHEMA, "run_id": self.run_id, "name": self.name, "inventory": self.inventory,
                "script": self.script, "args": list(self.args), "status": self.status.value,
                "exit_code": self.exit_code, "failed_host": self.failed_host, "schedule": self.schedule,
                "local": self.local, "started_at": self.started_at, "ended_at": self.ended_at,
                "launch_dir": self.launch_dir, "master": {"addr": self.master_addr, "port": self.master_port},
                "collect": list(self.collect), "fanout": self.fanout, "updated_at": self.updated_at,
                "nodes": [n.to_json() for n in self.nodes],
                **({"failure": self.failure.to_json()} if self.failure else {}),
                **({"backend": {"name": self.backend.name, "version": self.backend.version},
                    self.backend.name: dict(self.backend.data)} if self.backend else {}),
                **({"attempts": [a.to_json() for a in self.attempts]} if self.attempts else {}),
                **({"lost_nodes": [n.to_json() for n in self.lost]} if self.lost else {}),
                **({"clusterddp_version": self.version} if self.version else {}),
                **({"resumed_from": self.resumed_from.to_json()} if self.resumed_from else {})}

    @classmethod
    def from_json(cls, data: Any, path: str) -> RunRecord:
        """A record from run.json's parsed content; raises :class:`RecordError` naming ``path`` and the field."""
        r = _Reader(data, path, "")
        schema = _at_least(r.get("schema", int, default=0), 0, r, "schema")
        if schema > SCHEMA:
            raise RecordError(path, "schema", f"version {schema}, newer than this clusterddp reads ({SCHEMA})",
                              "upgrade clusterddp to read this run")
        status = r.get("status", str)
        try:
            run_status = RunStatus(status)
        except ValueError:
            raise RecordError(path, "status", f"{status!r} is not one of {', '.join(s.value for s in RunStatus)}"
                              ) from None
        master = _Reader(r.get("master", dict), path, "master")
        fanout = _between(r.get("fanout", int, default=DEFAULT_FANOUT), 1, MAX_FANOUT, r, "fanout")
        nodes = r.get("nodes", list)
        r.get("exit_code", int | None)  # written for readers of the file; the status decides it
        run_id = _name(r.get("run_id", str), RUN_ID_RE, path, "run_id", "a run id (letters, digits, . _ -)")
        read = tuple(NodeRecord.from_json(n, path, f"nodes[{i}]") for i, n in enumerate(nodes))
        seen: set[str] = set()
        for i, n in enumerate(read):
            if n.host in seen:  # each host names its log file and its row in `status`
                raise RecordError(path, f"nodes[{i}].host", f"{n.host!r} is listed twice")
            seen.add(n.host)
        return cls(run_id=run_id, name=r.get("name", str | None), inventory=r.get("inventory", str),
                   script=r.get("script", str), args=r.get("args", tuple[str, ...]), status=run_status,
                   failed_host=r.get("failed_host", str | None), schedule=r.get("schedule", str | None),
                   local=r.get("local", bool), started_at=r.get("started_at", str),
                   ended_at=r.get("ended_at", str | None), launch_dir=r.get("launch_dir", str),
                   master_addr=master.get("addr", str), master_port=_between(master.get("port", int), 1, 65535,
                                                                              master, "port"),
                   collect=r.get("collect", tuple[str, ...]), fanout=fanout, schema=SCHEMA, nodes=read,
                   updated_at=r.get("updated_at", str | None, default=None),
                   failure=_failure(r.get("failure", dict | None, default=None), path),
                   backend=BackendPart.from_json(data, path),
                   attempts=_attempts(r.get("attempts", list, default=[]), path),
                   lost=_lost(r.get("lost_nodes", list, default=[]), path),
                   version=_version(r.get("clusterddp_version", str | None, default=None), path),
                   resumed_from=_resumed(r.get("resumed_from", dict | None, default=None), path))


def _version(value: str | None, path: str) -> str | None:
    """run.json's ``clusterddp_version``: shown by `status`, so bounded and printable like a run id."""
    if value is not None and not VERSION_RE.fullmatch(value):
        raise RecordError(path, "clusterddp_version", f"{value[:40]!r} is not a version (digits, letters, . + -)")
    return value


def _attempts(data: list, path: str) -> tuple[Attempt, ...]:
    """run.json's ``attempts`` (added after schema 1 without a version bump, like ``failure``: a record
    without it reads as before), bounded and checked entry by entry."""
    if len(data) > MAX_ATTEMPTS:
        raise RecordError(path, "attempts", f"more than {MAX_ATTEMPTS} entries")
    return tuple(Attempt.from_json(a, path, f"attempts[{i}]") for i, a in enumerate(data))


def _resumed(data: dict | None, path: str) -> ResumedFrom | None:
    """run.json's ``resumed_from`` (added after schema 1 without a version bump, like ``attempts``)."""
    return None if data is None else ResumedFrom.from_json(data, path)


def _lost(data: list, path: str) -> tuple[NodeRecord, ...]:
    """run.json's ``lost_nodes``: the nodes of earlier attempts still to be reached by `stop`, bounded
    (a host out never comes back in the same run, so each is named once)."""
    if len(data) > MAX_FANOUT:
        raise RecordError(path, "lost_nodes", f"more than {MAX_FANOUT} entries")
    read = tuple(NodeRecord.from_json(n, path, f"lost_nodes[{i}]") for i, n in enumerate(data))
    if len({n.host for n in read}) != len(read):
        raise RecordError(path, "lost_nodes", "a host is listed twice")
    return read


# ---- reading JSON into typed fields: clusterddp.jsonread, each refusal a RecordError ----

_REQUIRED = REQUIRED


class _Reader(jsonread.Fields):
    """Typed access to one JSON object of run.json, with errors located at ``where.key``."""

    def __init__(self, data: Any, path: str, where: str) -> None:
        self.path = path
        super().__init__(data, where, lambda field, problem: RecordError(path, field, problem))


def _name(value: str, pattern: re.Pattern, path: str, field: str, what: str) -> str:
    if not pattern.fullmatch(value):
        raise RecordError(path, field, f"must be {what}, not {_short(value)}")
    return value


def _between(value: int | float, lo: float, hi: float, r: _Reader, key: str) -> Any:
    if not lo <= value <= hi:
        raise RecordError(r.path, r.field(key), f"must be between {lo:g} and {hi:g}, not {_short(value)}")
    return value


def _at_least(value: int | float, lo: float, r: _Reader, key: str) -> Any:
    if value < lo:
        raise RecordError(r.path, r.field(key), f"must be >= {lo:g}, not {_short(value)}")
    return value


def _count(value: int | str | None, r: _Reader, key: str) -> Any:
    """A process or GPU count: >= 1, or "auto"."""
    if value is None or value == "auto":
        return value
    if isinstance(value, str):
        raise RecordError(r.path, r.field(key), f"must be a count or \"auto\", not {_short(value)}")
    return _at_least(value, 1, r, key)


_HOST_TYPES: dict[str, Any] = {}


def _host_json(host: Host) -> dict[str, Any]:
    settings = dataclasses.asdict(host)
    settings["env"], settings["setup"] = dict(host.env), list(host.setup)
    # only where set, so older readers read the rest
    for key in ("slots", "lease_dir", "identity_from", "packages", "env_id", "lock_sha256"):
        if settings[key] is None:
            del settings[key]
    settings.pop("index_url", None)  # a secret (its credentials): never recorded
    if settings.get("wheels") == "push":
        del settings["wheels"]
    return settings


def _host(data: dict, path: str, where: str) -> Host:
    """The inventory Host a node ran with; fields added to Host since the record was written take their defaults."""
    if not _HOST_TYPES:
        _HOST_TYPES.update(typing.get_type_hints(Host))
    r = _Reader(data, path, where)
    kwargs = {}
    for f in dataclasses.fields(Host):
        has_default = f.default is not dataclasses.MISSING
        value = r.get(f.name, _HOST_TYPES[f.name], default=f.default if has_default else _REQUIRED)
        kwargs[f.name] = value
    unknown = sorted(set(data) - set(kwargs))
    if unknown:
        raise RecordError(path, f"{where}.{unknown[0]}", "not a host setting this clusterddp knows",
                          "upgrade clusterddp to read this run")
    _name(kwargs["name"], HOST_NAME_RE, path, f"{where}.name", "a host name (letters, digits, . _ -)")
    if kwargs["port"] is not None:
        _between(kwargs["port"], 1, 65535, r, "port")
    _count(kwargs["gpus"], r, "gpus")
    if kwargs["connect_timeout"] <= 0:
        raise RecordError(path, f"{where}.connect_timeout", f"must be > 0, not {_short(kwargs['connect_timeout'])}")
    _at_least(kwargs["keepalive"], 0, r, "keepalive")
    # "slurm": a Slurm node recorded as a host entry before Node (:func:`_run_node` reads it as its Node)
    for key, choices in (("transport", ("ssh", "local", "slurm")), ("host_key_policy", ("strict", "accept-new"))):
        if kwargs[key] not in choices:
            raise RecordError(path, f"{where}.{key}", f"{_short(kwargs[key])} is not one of {', '.join(choices)}",
                              "upgrade clusterddp to read this run")
    for name, _ in kwargs["env"]:
        _name(name, ENV_NAME_RE, path, f"{where}.env", "an object keyed by variable names")
    return Host(**kwargs)


# A node's settings of kind "node" (a Node: no SSH host entry) say so; an SSH or local host's have no
# "kind" (as every record before Node had them).
NODE_KIND = "node"


def _node_json(node: Node) -> dict[str, Any]:
    return {"kind": NODE_KIND, **dataclasses.asdict(node), "env": dict(node.env), "setup": list(node.setup)}


def _run_node(data: dict, path: str, where: str) -> RunNode:
    """A node's recorded settings: a Node (``"kind": "node"``), else the inventory Host it ran with. A
    host entry of transport "slurm" (a Slurm node recorded as a host, before Node) is read as its Node."""
    if data.get("kind") is None:
        h = _host(data, path, where)
        if h.transport != "slurm":
            return h
        return Node(name=h.name, address=h.address, python=h.python, workdir=h.workdir, env=h.env, setup=h.setup,
                    gpus=h.gpus, connect_timeout=h.connect_timeout)
    r = _Reader(data, path, where)
    if r.get("kind", str) != NODE_KIND:
        raise RecordError(path, f"{where}.kind", f"{_short(data['kind'])} is not a kind of node this clusterddp knows",
                          "upgrade clusterddp to read this run")
    unknown = sorted(set(data) - {"kind", *(f.name for f in dataclasses.fields(Node))})
    if unknown:
        raise RecordError(path, f"{where}.{unknown[0]}", "not a node setting this clusterddp knows",
                          "upgrade clusterddp to read this run")
    name = _name(r.get("name", str), HOST_NAME_RE, path, f"{where}.name", "a host name (letters, digits, . _ -)")
    connect_timeout = r.get("connect_timeout", float, default=Node.connect_timeout)
    if connect_timeout <= 0:
        raise RecordError(path, f"{where}.connect_timeout", f"must be > 0, not {_short(connect_timeout)}")
    env = r.get("env", tuple[tuple[str, str], ...], default=())
    for var, _ in env:
        _name(var, ENV_NAME_RE, path, f"{where}.env", "an object keyed by variable names")
    return Node(name=name, address=r.get("address", str), python=r.get("python", str), workdir=r.get("workdir", str),
                env=env, setup=r.get("setup", tuple[str, ...], default=()),
                gpus=_count(r.get("gpus", int | str, default=1), r, "gpus"), connect_timeout=connect_timeout,
                env_id=r.get("env_id", str | None, default=None), lock_sha256=r.get("lock_sha256", str | None,
                                                                                   default=None))


_MAX_TEXT = 20000  # characters of any text of a failure: the writer keeps far less


def _failure(data: dict | None, path: str) -> Failure | None:
    """run.json's ``failure`` (added after schema 1 without a version bump: a record without it reads
    as before), checked field by field like the rest of the file: it holds what a node sent."""
    if data is None:
        return None
    r = _Reader(data, path, "failure")

    def text(key: str, tp: Any = str) -> Any:
        v = r.get(key, tp, default=None if tp is not str else _REQUIRED)
        if isinstance(v, str) and len(v) > _MAX_TEXT:
            raise RecordError(path, r.field(key), f"longer than {_MAX_TEXT} characters")
        return v

    def texts(key: str, limit: int) -> tuple[str, ...]:
        v = r.get(key, tuple[str, ...], default=())
        if len(v) > limit or any(len(x) > _MAX_TEXT for x in v):
            raise RecordError(path, r.field(key), f"more than {limit} entries, or an entry too long")
        return v

    kind = text("kind")
    if kind not in KINDS:
        raise RecordError(path, "failure.kind", f"{_short(kind)} is not one of {', '.join(KINDS)}")
    host = _name(text("host"), HOST_NAME_RE, path, "failure.host", "a host name (letters, digits, . _ -)")
    others = r.get("others", list, default=[])
    if len(others) > _MAX_OTHERS:
        raise RecordError(path, "failure.others", f"more than {_MAX_OTHERS} entries")
    pairs = []
    for i, o in enumerate(others):
        o_r = _Reader(o, path, f"failure.others[{i}]")
        note = o_r.get("note", str)
        if len(note) > _MAX_TEXT:
            raise RecordError(path, o_r.field("note"), f"longer than {_MAX_TEXT} characters")
        pairs.append((_name(o_r.get("host", str), HOST_NAME_RE, path, o_r.field("host"), "a host name"), note))
    ranks = [r.get(k, int | None, default=None) for k in ("rank", "local_rank")]
    for k, v in zip(("rank", "local_rank"), ranks, strict=True):
        if v is not None:
            _at_least(v, 0, r, k)
    hang = r.get("hang", dict | None, default=None)
    try:
        flight = Flight.from_json(r.get("flight", dict)) if data.get("flight") is not None else None
    except ValueError as e:
        raise RecordError(path, "failure.flight", str(e)) from None
    return Failure(host=host, kind=kind, summary=text("summary"), rank=ranks[0], local_rank=ranks[1],
                   exc_type=text("exc_type", str | None), message=text("message", str | None),
                   frames=texts("frames", _MAX_FRAMES), signal=text("signal", str | None),
                   log_tail=texts("log_tail", _MAX_LOG_LINES), others=tuple(pairs),
                   hang=_hang(hang, path) if hang is not None else None, flight=flight)


def _hang(data: dict, path: str) -> Hang:
    """``failure.hang``: what the stall watchdog found, checked like the rest of the failure."""
    r = _Reader(data, path, "failure.hang")

    def short(reader: _Reader, key: str, tp: Any = str) -> Any:
        v = reader.get(key, tp)
        if isinstance(v, str) and len(v) > _MAX_TEXT:
            raise RecordError(path, reader.field(key), f"longer than {_MAX_TEXT} characters")
        return v

    def listed(reader: _Reader, key: str, limit: int) -> list:
        v = reader.get(key, list, default=[])
        if len(v) > limit:
            raise RecordError(path, reader.field(key), f"more than {limit} entries")
        return v
    groups = []
    for i, g in enumerate(listed(r, "groups", MAX_HANG_GROUPS)):
        gr = _Reader(g, path, f"failure.hang.groups[{i}]")
        ranks = []
        for j, one in enumerate(listed(gr, "ranks", MAX_HANG_RANKS)):
            rr = _Reader(one, path, f"{gr.field('ranks')}[{j}]")
            host = _name(rr.get("host", str), HOST_NAME_RE, path, rr.field("host"), "a host name")
            frames = rr.get("frames", tuple[str, ...], default=())
            if len(frames) > _MAX_FRAMES or any(len(f) > _MAX_TEXT for f in frames):
                raise RecordError(path, rr.field("frames"), f"more than {_MAX_FRAMES} entries, or one too long")
            numbers = [rr.get(k, int | None) for k in ("rank", "local_rank")]
            for k, v in zip(("rank", "local_rank"), numbers, strict=True):
                if v is not None:
                    _at_least(v, 0, rr, k)
            ranks.append(HangRank(host, numbers[0], numbers[1], _at_least(rr.get("pid", int), 0, rr, "pid"), frames))
        groups.append(HangGroup(gr.get("odd", bool), short(gr, "where"), tuple(ranks)))
    missing = []
    for i, m in enumerate(listed(r, "missing", _MAX_OTHERS)):
        mr = _Reader(m, path, f"failure.hang.missing[{i}]")
        missing.append((_name(mr.get("host", str), HOST_NAME_RE, path, mr.field("host"), "a host name"),
                        short(mr, "why")))
    by = r.get("decided_by", str | None)
    return Hang(timeout=_at_least(r.get("timeout", float), 0, r, "timeout"),
                silent_s=_at_least(r.get("silent_s", float), 0, r, "silent_s"),
                decided_by=by[:255] if by is not None else None, groups=tuple(groups),
                stacks_dir=short(r, "stacks_dir", str | None), missing=tuple(missing))


# States written by `clusterddp status` before schema 1, and what they mean now.
_OLD_STATES = {"missing": NodeState.LOST}


def _node_state(word: str, exit_code: int | None, path: str, field: str) -> NodeState:
    if word == "exited":
        return NodeState.of_exit_code(exit_code)
    if word in _OLD_STATES:
        return _OLD_STATES[word]
    try:
        return NodeState(word)
    except ValueError:
        raise RecordError(path, field, f"{word!r} is not one of {', '.join(s.value for s in NodeState)}") from None


# ---- a backend reading its part back (BackendPart.data: untrusted, like the rest of run.json) ----

def part_reader(part: BackendPart) -> _Reader:
    """Typed access to a backend's part (``reader.get(key, type, default)``), errors located at
    ``<name>.<key>`` of the file the part was read from: the reader of the rest of run.json."""
    return _Reader(dict(part.data), part.source, part.name)


def part_host(reader: _Reader, key: str) -> Host:
    """The host entry at ``key`` of a backend's part (written by :func:`host_json`), checked as a node's."""
    return _host(reader.get(key, dict), reader.path, reader.field(key))


def part_count(reader: _Reader, key: str, default: int = 1) -> int:
    """A count (>= 1) at ``key`` of a backend's part."""
    value: int = _at_least(reader.get(key, int, default=default), 1, reader, key)
    return value


def host_json(host: Host) -> dict[str, Any]:
    """A Host as run.json keeps it (a node's ``settings``; a backend's part may keep one: a login host)."""
    return _host_json(host)


def part_object(reader: _Reader, key: str) -> _Reader:
    """The object at ``key`` of a backend's part, read as the part is (errors at ``<name>.<key>.<field>``)."""
    return _Reader(reader.get(key, dict), reader.path, reader.field(key))


def part_env(reader: _Reader, key: str) -> tuple[tuple[str, str], ...]:
    """Environment pairs at ``key`` (an object of strings keyed by variable names)."""
    env: tuple[tuple[str, str], ...] = reader.get(key, tuple[tuple[str, str], ...], default=())
    for name, _ in env:
        _name(name, ENV_NAME_RE, reader.path, reader.field(key), "an object keyed by variable names")
    return env
