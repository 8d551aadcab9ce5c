"""`clusterddp stacks RUN`: the current Python stack of every thread of every rank of a running run,
from every node at once, grouped so that the rank that is not where the others are stands out.

Every node runs the same node program (``clusterddp/node/stacks.py``, the command
:func:`node_command`); how it is reached is the run's backend's (``Backend.stacks``): an SSH or
local run's by :func:`take`, which sends each node the command through one
:class:`~clusterddp.fleet.Fleet`, in parallel, each bounded by the host's connect timeout plus
:data:`ANSWER_S`; a Slurm run's by one job step per node. Each backend hands the checked answers
to :func:`taken_from`: a node that does not answer in time, or answers something that is not the
program's reply, is named in :attr:`Taken.unanswered` and the others are still shown.
:func:`group` puts ranks whose main threads stand at the same place together, the smaller groups
(the odd ones out) first; :func:`save` writes every dump under the run folder. How a node takes
the stacks (faulthandler through the job's ``sitecustomize``; py-spy for a process not hooked) is
told in ``clusterddp/node/stackhook.py``. Nothing here prints.
"""

from __future__ import annotations

import json
import posixpath
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from . import plan as ssh_plan
from .errors import UsageError
from .fleet import Fleet, as_host_error
from .inventory import Host
from .node import stacks as node_stacks
from .nodeops import nodes_of
from .nodescript import HostLike, preamble, python_command, q
from .record import RunRecord, RunStatus
from .store import RunStore
from .transport import Transport
from .transport import connect as default_connect

WAIT_S = 3.0       # on the node: how long each signalled process has to write its dump
ANSWER_S = 30.0    # the node's whole answer (its /proc scan, the dumps, py-spy) after connecting
SHOWN_FRAMES = 3   # innermost frames of the user's own code shown per group

Frame = tuple[str, int | None, str]   # file, line (None: faulthandler's ???), function


@dataclass(frozen=True)
class Proc:
    """One process of a node's job as its stacks answer found it: a rank (``rank`` set) or the agent."""

    host: str
    pid: int
    role: str                 # "rank" or "agent"
    rank: int | None
    local_rank: int | None
    how: str                  # "faulthandler", "py-spy" or "none" (``note`` says why)
    note: str
    dump: str                 # as the node sent it (faulthandler's text)
    threads: tuple[tuple[int, bool, tuple[Frame, ...]], ...]
    main: tuple[Frame, ...]   # the main thread's frames, innermost first (empty: no dump)


@dataclass(frozen=True)
class Group:
    """Ranks whose main threads stand at the same place (the same frames, the innermost one's line aside)."""

    procs: tuple[Proc, ...]
    odd: bool                 # not where the most ranks are

    @property
    def ranks(self) -> list[int]:
        return sorted(p.rank for p in self.procs if p.rank is not None)


@dataclass
class Taken:
    """One ``stacks`` call: every node's processes, or why a node gave none."""

    run_id: str
    at: float
    procs: list[Proc] = field(default_factory=list)
    unanswered: dict[str, str] = field(default_factory=dict)   # host -> why (no answer, bad answer)
    ended: dict[str, int | None] = field(default_factory=dict)  # host -> exit code, where the job has ended
    saved: Path | None = None


def node_command(host: HostLike, control_dir: str, marker: str, wait: float = WAIT_S) -> str:
    """The command that asks one node for its job's stacks (the job whose processes carry ``marker``,
    whose control folder is ``control_dir``), after the host's setup lines. Every backend runs this
    on each node, however it reaches the node."""
    args = {"ctl": control_dir, "marker": marker, "wait": wait}
    lines = preamble(host, (), stdout_to=">/dev/null 2>&1", on_fail=lambda line: "true")
    return "\n".join([*lines, python_command(host.python, "stacks", [q(json.dumps(args))])])


def stacks_command(host: Host, node: ssh_plan.NodeLaunch, wait: float = WAIT_S) -> str:
    """:func:`node_command` for an SSH or local run's node."""
    return node_command(host, node.control_dir, node.marker, wait)


def running_record(store: RunStore, run: str) -> RunRecord:
    """The record of ``run`` (an id or a unique part of one); a UsageError (exit 2) when there is no
    such run, or when it has ended."""
    rec = store.load(store.resolve(run))
    if rec.status is not RunStatus.RUNNING:
        raise ended_error(rec)
    return rec


def ended_error(rec: RunRecord) -> UsageError:
    """What ``stacks`` says of a run that is not running (exit 2)."""
    ended = f" at {rec.ended_at}" if rec.ended_at else ""
    return UsageError(f"run {rec.run_id} has ended ({rec.status.value}{ended}): it has no stacks to take",
                      f"`clusterddp status {rec.run_id}` says how it ended; `clusterddp logs {rec.run_id}` "
                      "shows its output")


def take(rec: RunRecord, connect: Callable[[Host], Transport] = default_connect,
         wait: float = WAIT_S) -> Taken:
    """Every node of an SSH or local run asked at once for its job's stacks; each node's answer checked."""
    nodes = nodes_of(rec)
    by_name = {n.host.name: n for n in nodes}
    at = time.time()

    def one(host: Host, t: Transport) -> dict:
        res = t.run(stacks_command(host, by_name[host.name], wait), timeout=ANSWER_S + wait)
        return node_stacks.parse_reply(res.stdout)

    with Fleet([n.host for n in nodes], fanout=rec.fanout, connect=connect) as fleet:
        answers = fleet.each(one)
    return taken_from(rec.run_id, at, [n.host.name for n in nodes], answers)


def taken_from(run_id: str, at: float, hosts: Sequence[str], answers: Mapping[str, dict | Exception | None]) -> Taken:
    """One ``stacks`` call from each host's answer: the node program's reply as :func:`parse_reply
    <clusterddp.node.stacks.parse_reply>` checked it, or why there is none (an exception: its host
    error's words; missing or None: not asked). ``hosts``: the run's hosts, in its order."""
    taken = Taken(run_id, at)
    for host in hosts:
        got = answers.get(host)
        if got is None or isinstance(got, Exception):
            taken.unanswered[host] = str(as_host_error(host, got)) if isinstance(got, Exception) else "not asked"
            continue
        if got["state"] != "running" or not got["procs"]:
            taken.ended[host] = got["exit_code"]
        for p in got["procs"]:
            threads = tuple((tid, cur, tuple(fr)) for tid, cur, fr in node_stacks.parse_dump(p["dump"]))
            taken.procs.append(Proc(host, p["pid"], p["role"], p["rank"], p["local_rank"], p["how"],
                                    p["note"], p["dump"], threads, _main(threads, p["main"])))
    taken.procs.sort(key=lambda p: (p.role != "rank", p.rank if p.rank is not None else 0, p.host, p.pid))
    return taken


def _main(threads: Sequence[tuple[int, bool, tuple[Frame, ...]]], main: str | None) -> tuple[Frame, ...]:
    """The main thread's frames: the thread the hook's header names, else the one that took the signal."""
    want = int(main, 16) if main else None
    for tid, _, frames in threads:
        if tid == want:
            return frames
    for _, current, frames in threads:
        if current:
            return frames
    return threads[0][2] if threads else ()


# ---- grouping ----

# Where a frame is not the user's own code: the standard library, site-packages, frozen modules.
_NOT_USERS = re.compile(r"(/site-packages/|/dist-packages/|/lib/python\d[\d.]*/|^<)")


def users(frame: Frame) -> bool:
    """Whether ``frame`` is in the user's own code (not Python's, not an installed package's)."""
    return _NOT_USERS.search(frame[0]) is None


def place(frames: Sequence[Frame]) -> tuple:
    """What ranks at the same place share: every frame's file name (not its folder: each host has
    the script in its own run folder), line and function, the innermost one's line aside (a rank
    that loops in Python is at one place, whichever line of the loop the signal found it on)."""
    if not frames:
        return ()
    names = [(posixpath.basename(f), ln, fn) for f, ln, fn in frames]
    return ((names[0][0], names[0][2]), *names[1:])


def group(procs: Sequence[Proc]) -> list[Group]:
    """The ranks (not the agent) by :func:`place`: the odd ones out first (the groups smaller than the
    biggest; none when every group is as big), then by their lowest rank. Ranks with no dump are a
    group of their own, last."""
    ranks = [p for p in procs if p.role == "rank"]
    by: dict[tuple, list[Proc]] = {}
    for p in ranks:
        if p.main:
            by.setdefault(place(p.main), []).append(p)
    biggest = max((len(g) for g in by.values()), default=0)
    uneven = len({len(g) for g in by.values()}) > 1
    groups = [Group(tuple(g), uneven and len(g) < biggest) for g in by.values()]
    groups.sort(key=lambda g: (not g.odd, min((p.rank for p in g.procs if p.rank is not None), default=0)))
    blank = tuple(p for p in ranks if not p.main)
    return groups + ([Group(blank, False)] if blank else [])


def innermost_users(frames: Sequence[Frame], most: int = SHOWN_FRAMES) -> list[Frame]:
    """The innermost ``most`` frames of the user's own code, innermost first."""
    return [f for f in frames if users(f)][:most]


def summary(frames: Sequence[Frame]) -> str:
    """Where a main thread stands, in one line: the innermost user frame's function, then the
    frames it called down to the innermost one (``train -> all_reduce (train.py:41)``), at the
    user frame's line; the innermost frame alone when none is the user's."""
    if not frames:
        return "(no stack)"
    at = next((i for i, f in enumerate(frames) if users(f)), None)
    chain = frames[: (at if at is not None else 0) + 1]
    names = [f[2] for f in reversed(chain)]
    if len(names) > 3:
        names = [names[0], "...", *names[-2:]]
    where = chain[-1]
    line = "?" if where[1] is None else str(where[1])
    return f"{' -> '.join(names)} ({Path(where[0]).name}:{line})"


# ---- saving ----

def stamp(at: float) -> str:
    """A ``stacks`` call's folder name: its UTC time to the millisecond."""
    t = datetime.fromtimestamp(at, timezone.utc)
    return t.strftime("%Y%m%dT%H%M%S.") + f"{t.microsecond // 1000:03d}Z"


def file_name(p: Proc) -> str:
    return f"rank{p.rank}.txt" if p.role == "rank" and p.rank is not None else f"{p.role}-{p.pid}.txt"


def save(store: RunStore, taken: Taken) -> Path:
    """Every process's whole dump as ``<run>/stacks/<time>/<host>/rank<N>.txt`` (the agent's as
    ``agent-<pid>.txt``), a header line first; the folder."""
    folder = stamp(taken.at)
    for p in taken.procs:
        who = f"rank {p.rank} (local rank {p.local_rank})" if p.role == "rank" else "torchrun agent"
        head = f"# run {taken.run_id}, {p.host}, {who}, pid {p.pid}: {p.how}{', ' + p.note if p.note else ''}\n"
        store.write_evidence(taken.run_id, "stacks", folder, f"{p.host}/{file_name(p)}",
                             (head + p.dump).encode("utf-8", "replace"))
    taken.saved = store.run_dir(taken.run_id) / "stacks" / folder
    return taken.saved


# ---- as data ----

def to_json(taken: Taken, groups: Sequence[Group]) -> dict:
    """``stacks --json``: the same as the text, as data."""
    def proc(p: Proc) -> dict:
        return {"host": p.host, "pid": p.pid, "role": p.role, "rank": p.rank, "local_rank": p.local_rank,
                "how": p.how, "note": p.note, "where": summary(p.main),
                "main": [{"file": f, "line": ln, "function": fn} for f, ln, fn in p.main],
                "threads": len(p.threads),
                "file": str(taken.saved / p.host / file_name(p)) if taken.saved else None}
    return {"run_id": taken.run_id, "time": taken.at, "saved": str(taken.saved) if taken.saved else None,
            "groups": [{"odd": g.odd, "ranks": g.ranks, "where": summary(g.procs[0].main),
                        "procs": [proc(p) for p in g.procs]} for g in groups],
            "agents": [proc(p) for p in taken.procs if p.role == "agent"],
            "unanswered": taken.unanswered, "ended": taken.ended}
