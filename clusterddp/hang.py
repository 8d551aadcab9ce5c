"""A run the stall watchdog ended (``up --stall-timeout S``): what each node's watchdog left, read back
and told as the run's failure, ``failure.kind: hang``, with every rank's stacks grouped.

The node side is ``clusterddp/node/watch.py`` (started by launch.sh, ``nodescript.watch_lines``); how
the nodes agree is told there. It leaves, in each node's control folder, ``hang.json`` (its decision:
when, how long without progress, who saw it first) and ``hang-stacks.txt`` (the ``stacks`` node
program's reply, exactly what ``clusterddp stacks`` gets). :func:`explain` reads both from every node
that may answer, with the sampler's ``idle.json`` (:mod:`clusterddp.metrics.idle`) in the same bounded
command (:func:`records_command`; :func:`parse_records` and :func:`parse_node` never raise: a node is not
trusted) and, when a node has a hang.json, makes the hang the run's failure: the stacks
go through :func:`clusterddp.stacks.take`'s own reading (replayed, :class:`_Replay`), are grouped
(:func:`clusterddp.stacks.group`), saved under the run folder as ``clusterddp stacks`` saves them,
and the odd rank(s) out are named first. Without a hang.json anywhere it is an ordinary failure
(:func:`clusterddp.postmortem.explain`). `up` (attached) and `status` (of a detached run) both come here.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import plan as ssh_plan
from . import postmortem
from . import stacks as stack_dumps
from .errors import HostError
from .failure import MAX_HANG_GROUPS, MAX_HANG_RANKS, MAX_NOTE, Failure, Hang, HangGroup, HangRank, clip
from .fleet import Fleet
from .metrics import idle as idle_records
from .metrics.idle import NodeIdle, idle_of
from .node import stacks as node_stacks
from .node.reply import ReplyError, loads
from .nodeops import each
from .nodescript import HANG, qpath
from .record import RunRecord
from .store import RunStore
from .transport import CommandResult, Transport

HANG_MOST = 64 << 10                       # bytes of hang.json read (the watchdog writes a few hundred)
STACKS_MOST = node_stacks.MOST_REPLY + 1   # the stacks program's own bound, and a byte to see it exceeded
SEPARATOR = "CLUSTERDDP_HANG_STACKS"       # between hang.json and the stacks reply in read_command's answer
IDLE_END = "CLUSTERDDP_IDLE_END"           # after idle.json, before read_command's answer, in records_command's
READ_TIMEOUT = 60.0


def read_command(node: ssh_plan.NodeLaunch) -> str:
    """Print the node's hang.json (nothing when there is none), then, after a :data:`SEPARATOR` line,
    its stacks reply; each bounded."""
    return (f"cd {qpath(node.control_dir)} 2>/dev/null || exit 0; [ -f {HANG} ] || exit 0; "
            f"head -c {HANG_MOST} {HANG}; echo; echo {SEPARATOR}; head -c {STACKS_MOST} hang-stacks.txt 2>/dev/null")


def records_command(node: ssh_plan.NodeLaunch) -> str:
    """One command for both records a failed run's diagnosis reads on a node: its idle.json
    (:func:`clusterddp.metrics.idle.read_command`), an :data:`IDLE_END` line, then :func:`read_command`'s
    answer (hang.json and its stacks). Each part in a subshell: one that finds nothing leaves the other be."""
    return f"( {idle_records.read_command(node)} ); echo; echo {IDLE_END}; ( {read_command(node)} )"


@dataclass(frozen=True)
class NodeHang:
    """One node's hang.json, checked, and its stacks reply (bytes, read by ``stacks``' own reader)."""

    host: str                     # the node it came from (the run's name for it, not what the node says)
    timeout: float
    silent_s: float
    decided_by: str | None
    at: float                     # when it decided, by the node's clock
    stacks: bytes                 # the stacks program's reply; empty when there is none
    note: str | None = None       # why there are no stacks (the watchdog's word, or what is wrong)


def _number(v: Any, lo: float, hi: float) -> float | None:
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and lo <= v <= hi
    return float(v) if ok else None


def parse_node(host: str, stdout: bytes) -> NodeHang | None:
    """:func:`read_command`'s answer: None when the node has no hang.json; never raises (what is wrong
    with a hang.json is its ``note``)."""
    stdout = stdout[:HANG_MOST + STACKS_MOST + 4096]
    head, sep, rest = stdout.partition(b"\n" + SEPARATOR.encode() + b"\n")
    if not sep:
        return None if not stdout.strip() else NodeHang(host, 0.0, 0.0, None, 0.0, b"", "an unreadable hang.json")
    try:
        data = loads(head.decode("utf-8", "replace").strip())
    except (ReplyError, ValueError, RecursionError):
        data = None
    if not isinstance(data, dict):
        return NodeHang(host, 0.0, 0.0, None, 0.0, rest, "hang.json is not the watchdog's JSON object")
    timeout = _number(data.get("timeout"), 0, 1e9)
    silent = _number(data.get("silent_s"), 0, 1e9)
    at = _number(data.get("time"), 0, 1e11)
    by = data.get("decided_by")
    by = clip(by, 255) if isinstance(by, str) and by else None
    stacks = data.get("stacks")
    note = None if stacks == "hang-stacks.txt" else clip(str(stacks), MAX_NOTE) if stacks else "no stacks taken"
    if timeout is None or silent is None or at is None:
        note = "hang.json lacks its timeout, silent_s or time"
    return NodeHang(host, timeout or 0.0, silent or 0.0, by, at or 0.0, rest if note is None else b"", note)


@dataclass(frozen=True)
class NodeRecords:
    """What a node's stall watchdog and idle policy left (:func:`records_command`); None: nothing of it."""

    hang: NodeHang | None
    idle: NodeIdle | None


def parse_records(host: str, stdout: bytes) -> NodeRecords:
    """:func:`records_command`'s answer, each part read by its own parser; never raises. An answer
    without the :data:`IDLE_END` line is read as :func:`read_command`'s alone."""
    head, sep, rest = stdout.partition(b"\n" + IDLE_END.encode() + b"\n")
    if not sep:
        return NodeRecords(parse_node(host, stdout), None)
    return NodeRecords(parse_node(host, rest), idle_records.parse_node(host, head))


class _Replay:
    """A transport that answers ``stacks``' command with what the node's watchdog already got from the
    same node program: :func:`clusterddp.stacks.take` then reads it exactly as a live call's answer."""

    def __init__(self, host: str, replies: Mapping[str, bytes]) -> None:
        self.host, self.replies = host, replies

    def run(self, command: str, *, timeout: float | None = None, stdin: object = None) -> CommandResult:
        got = self.replies.get(self.host)
        if not got:
            raise HostError(self.host, "the watchdog left no stacks there")
        return CommandResult(0, got, b"")

    def close(self) -> None:
        pass


def _rank(p: stack_dumps.Proc) -> HangRank:
    frames = tuple(
        clip(f"{fn} ({f}:{'?' if ln is None else ln})", 500) for f, ln, fn in stack_dumps.innermost_users(p.main)
    )
    return HangRank(p.host, p.rank, p.local_rank, p.pid, frames)


def hang_of(rec: RunRecord, store: RunStore | None, hangs: Mapping[str, NodeHang]) -> Failure:
    """The run's failure from its nodes' hang records (at least one): the stacks grouped, saved under
    the run folder (when ``store`` is given and can take them), the odd rank(s) out named first."""
    replies = {h: v.stacks for h, v in hangs.items() if v.stacks}
    taken = stack_dumps.take(rec, connect=lambda host: _Replay(host.name, replies))  # type: ignore[arg-type,return-value]
    taken.at = max((v.at for v in hangs.values()), default=taken.at) or taken.at
    saved = None
    if taken.procs and store is not None:
        try:
            saved = str(stack_dumps.save(store, taken))
        except Exception:  # noqa: BLE001 - the stacks are still told; only the copy on disk is missing
            saved = None
    groups = stack_dumps.group(taken.procs)
    kept = tuple(HangGroup(g.odd, stack_dumps.summary(g.procs[0].main) if g.procs[0].main else "(no stack)",
                           tuple(_rank(p) for p in g.procs[:MAX_HANG_RANKS])) for g in groups[:MAX_HANG_GROUPS])
    first = next((v for v in hangs.values() if v.decided_by == v.host), None)
    lead = first or max(hangs.values(), key=lambda v: v.silent_s)
    missing = tuple((h, (hangs[h].note if h in hangs else None) or why) for h, why in taken.unanswered.items())
    missing += tuple((n.host, "no hang record there (its watchdog did not see the stall, or was not running)")
                     for n in rec.nodes if n.host not in hangs and n.host not in taken.unanswered)
    hang = Hang(timeout=lead.timeout, silent_s=lead.silent_s, decided_by=lead.decided_by, groups=kept,
                stacks_dir=saved, missing=missing)
    head = f"hang: no rank made progress for {lead.silent_s:.0f}s (stall timeout {lead.timeout:g}s)"
    odd = [g for g in groups if g.odd]
    if odd:
        p = odd[0].procs[0]
        who = ", ".join(f"rank {q.rank} ({q.host} local {q.local_rank})" for g in odd for q in g.procs)
        summary = f"{head}; {who} not where the others are: {stack_dumps.summary(p.main)}"
        host, rank, local = p.host, p.rank, p.local_rank
    elif groups and groups[0].procs[0].main:
        summary = (
            f"{head}; every rank stands at {stack_dumps.summary(groups[0].procs[0].main)}"
            if len(groups) == 1
            else f"{head}; the ranks stand in groups of the same size, none the odd one out"
        )
        host, rank, local = lead.decided_by if lead.decided_by in rec.hosts else lead.host, None, None
    else:
        summary = f"{head}; no rank's stacks could be read"
        host, rank, local = lead.host, None, None
    others = tuple((h, "ended by the stall watchdog" if h in hangs else "no hang record")
                   for h in rec.hosts if h != host)
    return Failure(host=host, kind="hang", summary=clip(summary, 2000), rank=rank, local_rank=local,
                   others=others, hang=hang)


def read_one(t: Transport, host: str, node: ssh_plan.NodeLaunch) -> NodeRecords:
    """The hang and idle records of ``host`` (the run's name for it), in one command (:func:`records_command`)
    in ``node``'s control folder, through ``t``."""
    return parse_records(host, t.run(records_command(node), timeout=READ_TIMEOUT).stdout)


def read(fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], rec: RunRecord) -> dict[str, NodeRecords]:
    """Every node's hang and idle records, from the nodes that may answer (a node that does not is left out)."""
    return dict(each(fleet, postmortem.askable(nodes, rec), lambda n, t: read_one(t, n.host.name, n)).succeeded)


def failure_of(rec: RunRecord, store: RunStore | None, records: Mapping[str, NodeRecords]) -> Failure | None:
    """The run's failure from its nodes' records: a hang when a node's watchdog left its record, else the
    idle policy when the nodes' samplers stopped it (:func:`clusterddp.metrics.idle.idle_of`), else None."""
    hangs = {h: r.hang for h, r in records.items() if r.hang is not None}
    if hangs:
        return hang_of(rec, store, hangs)
    return idle_of(rec, {h: r.idle for h, r in records.items() if r.idle is not None})


def explain(fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], rec: RunRecord, store: RunStore) -> Failure:
    """Why the run failed: a hang when a node's watchdog left its record, the idle policy when the nodes'
    samplers stopped it (:mod:`clusterddp.metrics.idle`), both read in one command per node (:func:`read`),
    else the failed rank (:func:`clusterddp.postmortem.explain`)."""
    found = failure_of(rec, store, read(fleet, nodes, rec))
    return found if found is not None else postmortem.explain(fleet, nodes, rec, store)
