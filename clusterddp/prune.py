"""Removing old runs: their folders on the nodes and on this machine (`clusterddp prune`, and `up`
after each run when the inventory sets ``keep_runs``).

Which runs go is decided from the run records alone (:func:`select`); how a node folder goes is
:func:`prune_command`, one command per host for all its folders. Two guards keep a
running job's files: a run whose record says running is never chosen, and on the node a folder is
left alone while any process carries the run's marker, whatever the record says. A run's local
folder (its record) goes only once every node folder is gone: it is the only pointer to them, so
a node that cannot be reached now is pruned by a later `prune`.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

from .errors import RecordError, UsageError
from .fleet import Fleet
from .inventory import RunNode
from .nodeops import Reach
from .nodescript import CONTROL, MARKED_FN, MARKER, marker_word, q, qpath
from .plan import NodeLaunch
from .record import NodeRecord, RunRecord, RunStatus
from .store import RunStore
from .transport import connect as default_connect

PRUNE_TIMEOUT = 600.0  # seconds for one node's removals: rm -rf of big checkpoint folders takes a while

_AGE_RE = re.compile(r"([0-9]{1,30}(?:\.[0-9]{1,30})?)\s*([smhdw])", re.I | re.ASCII)  # no "٣", no 1e400 (inf)
_AGES_RE = re.compile(r"(?:\s*[0-9]{1,30}(?:\.[0-9]{1,30})?\s*[smhdw])+\s*", re.I | re.ASCII)
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def parse_age(text: str, flag: str = "--older-than") -> float:
    """``30m``, ``12h``, ``7d``, ``2w`` (or ``1d12h``) as seconds; bad input is a UsageError naming ``flag``."""
    # The whole text first: findall alone tries every position, quadratic in a long number (64 KiB: a minute)
    if not _AGES_RE.fullmatch(text):
        raise UsageError(f"{flag} {text!r}: not an age", f"e.g. {flag} 7d, 12h, 30m or 2w")
    return sum(float(n) * _UNIT[u.lower()] for n, u in _AGE_RE.findall(text))


@dataclass(frozen=True)
class Policy:
    """Which runs go: those outside the newest ``keep`` (when given) that also ended more than
    ``older_than`` seconds ago (when given), among the runs of ``inventory`` (an absolute path, or
    ``local``; None: every run). A run either rule keeps is kept."""

    keep: int | None = None
    older_than: float | None = None
    inventory: str | None = None


@dataclass(frozen=True)
class Selection:
    remove: tuple[RunRecord, ...]     # oldest first
    running: tuple[str, ...]          # would go, but their records say running: never removed
    damaged: tuple[str, ...]          # records that cannot be read: left alone, with why
    kept: int                         # runs the policy keeps


def _when(rec: RunRecord) -> datetime | None:
    try:
        t = datetime.fromisoformat(rec.ended_at or rec.started_at)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def select(store: RunStore, policy: Policy, now: datetime | None = None) -> Selection:
    """The runs ``policy`` removes, from the store's records (nothing is touched)."""
    now = now or datetime.now(timezone.utc)
    rows = [r for r in store.list() if policy.inventory is None or r["inventory"] == policy.inventory]
    remove, running, damaged, kept = [], [], [], 0
    for i, row in enumerate(rows):  # newest first
        if policy.keep is not None and i < policy.keep:
            kept += 1
            continue
        try:
            rec = store.load(row["run_id"])
        except RecordError as e:
            damaged.append(f"{row['run_id']}: {str(e).partition(chr(10))[0]}")
            continue
        when = _when(rec)
        if policy.older_than is not None and (when is None or (now - when).total_seconds() < policy.older_than):
            kept += 1
            continue
        if rec.status is RunStatus.RUNNING:
            running.append(rec.run_id)
            continue
        remove.append(rec)
    return Selection(tuple(reversed(remove)), tuple(running), tuple(damaged), kept)


@dataclass(frozen=True)
class NodeResult:
    """One node folder: ``word`` is :func:`prune_command`'s (removed, would, missing, running,
    refused, failed), or ``unreachable`` / ``damaged`` (the record's path was refused: ``detail``)."""

    host: str
    word: str
    kib: int | None = None
    detail: str | None = None


GONE = frozenset({"removed", "missing"})
WOULD_GO = frozenset({"would", "missing", "shared"})  # shared: every host of the run would let go of it


@dataclass(frozen=True)
class RunResult:
    """What pruning one run did (or, in a dry run, would do)."""

    record: RunRecord
    nodes: tuple[NodeResult, ...]
    local_bytes: int | None     # the local run folder's disk usage
    removed: bool               # the whole run went (dry run: would go)
    why_kept: str | None = None

    @property
    def run_id(self) -> str:
        return self.record.run_id

    @property
    def bytes(self) -> int:
        return (self.local_bytes or 0) + sum((n.kib or 0) * 1024 for n in self.nodes)

    @property
    def freed(self) -> int:
        """Bytes this prune removed (dry run: would remove): the whole run's when it went, else
        those of the node folders that went while others stayed (prune never reports less)."""
        if self.removed:
            return self.bytes
        return sum((n.kib or 0) * 1024 for n in self.nodes if n.word == "removed")


def disk_usage(path: Path) -> int | None:
    """Bytes a local folder takes on disk (as ``du``), links not followed; None if unreadable."""
    total = 0
    try:
        total += os.lstat(path).st_blocks * 512
        for folder, dirs, files in os.walk(path, onerror=None):
            for name in dirs + files:
                try:
                    total += os.lstat(os.path.join(folder, name)).st_blocks * 512
                except OSError:
                    pass
    except OSError:
        return None
    return total


def _local_job_running(marker: str) -> bool:
    """Whether a process on this machine carries ``marker`` (an ``up local`` job still going)."""
    needle = f"{MARKER}={marker}".encode()
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if needle in env.read_bytes().split(b"\0"):
                return True
        except OSError:
            pass
    return False


def parse_reply(text: str, count: int) -> dict[int, tuple[str, int | None]]:
    """:func:`prune_command`'s lines as ``{index: (word, KiB)}``; lines that are not one are skipped."""
    out: dict[int, tuple[str, int | None]] = {}
    for line in text.splitlines():
        m = re.fullmatch(r"([0-9]{1,9}) (removed|would|missing|running|refused|failed|shared)(?: ([0-9]{1,15}|-))?"
                         r"(?: \S+)?", line.strip(), re.ASCII)
        if m and int(m.group(1)) < count:
            kib = m.group(3)
            out[int(m.group(1))] = (m.group(2), int(kib) if kib and kib != "-" else None)
    return out


PRUNE_COMMAND_MAX = 64 * 1024  # bytes of one node command: the kernel takes at most 128 KiB in one argument


def batches(targets: list[tuple[str, str, str, tuple[str, ...]]]) -> Iterator[list[int]]:
    """Indexes of ``targets`` in groups whose :func:`prune_command` stays under PRUNE_COMMAND_MAX
    (``bash -c`` gets it as one argument; 1,100 runs on one host were over the limit)."""
    base = len(prune_command([]))
    group: list[int] = []
    size = base
    for i, t in enumerate(targets):
        n = len(prune_command([t])) - base + 1
        if group and size + n > PRUNE_COMMAND_MAX:
            yield group
            group, size = [], base
        group.append(i)
        size += n
    if group:
        yield group


_CONTROL_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _control_name(run_dir: str, control_dir: str) -> str:
    """The name of a host's control folder in ``<run folder>/.clusterddp``, or "" when the record
    holds another layout (then nothing of it is treated as shared)."""
    name = control_dir.rpartition("/")[2]
    ok = _CONTROL_NAME.fullmatch(name) and control_dir == f"{run_dir}/{CONTROL}/{name}"
    return name if ok else ""


_Target = tuple[str, str, str, tuple[str, ...]]


def _rounds(targets: dict[RunNode, list[tuple[str, _Target]]]) -> Iterator[list[RunNode]]:
    """Hosts in groups with distinct names (a Fleet keys its connections by name; two records may hold
    different settings under one name)."""
    left = list(targets)
    while left:
        this: dict[str, RunNode] = {}
        for h in left:
            this.setdefault(h.name, h)
        left = [h for h in left if this[h.name] is not h]
        yield list(this.values())


def _run_on_nodes(targets: dict[RunNode, list[tuple[str, _Target]]], dry_run: bool, fanout: int, connect: Callable,
                  results: dict[tuple[str, str], NodeResult]) -> None:
    """:func:`prune_command` for each host's targets (in :func:`batches`), answers into ``results``."""
    for hosts in _rounds(targets):
        by_name = {h.name: h for h in hosts}

        def one(h: RunNode, t, by_name: dict[str, RunNode] = by_name) -> list[tuple[str, str]]:
            todo = [target for _, target in targets[by_name[h.name]]]
            out = []
            for group in batches(todo):
                r = t.run(prune_command([todo[i] for i in group], dry_run), timeout=PRUNE_TIMEOUT)
                out.append((r.stdout.decode("utf-8", "replace"), r.stderr.decode("utf-8", "replace")))
            return out
        with Fleet(hosts, fanout=fanout, connect=connect) as fleet:
            done = fleet.each(one, hosts)
        for name, res in done.items():
            todo = targets[by_name[name]]
            if isinstance(res, Exception):
                for run_id, _ in todo:
                    results[(run_id, name)] = NodeResult(name, "unreachable", detail=str(res).partition("\n")[0])
                continue
            groups = list(batches([target for _, target in todo]))
            for group, (stdout, stderr) in zip(groups, res, strict=True):
                said = parse_reply(stdout, len(group))
                for j, i in enumerate(group):
                    run_id = todo[i][0]
                    word, kib = said.get(j, ("failed", None))
                    detail = None if j in said else (stderr.strip().splitlines() or ["no answer"])[-1][:200]
                    if word == "shared":
                        detail = "one folder of a shared workdir, which another host of the run may still use"
                    results[(run_id, name)] = NodeResult(name, word, kib, detail)


def _node_folders(records: tuple[RunRecord, ...], dry_run: bool, connect: Callable,
                  ) -> dict[tuple[str, str], NodeResult]:
    """Every node folder of ``records`` removed (or looked at), one command per host (or per
    :func:`batches` of its folders): {(run id, host): result}.

    Hosts whose workdirs are one shared folder (an NFS home) share the run folder, each with its
    control folder inside. A host whose job has ended lets go of its control folder, and removes
    the run folder only when no other host of the run holds one there (``shared`` otherwise): a
    host whose link died may still run its job in it, and only that host can see its processes.
    When every host has let go (the hosts ran at once, each saw the others), one of them is asked
    again, and removes it."""
    results: dict[tuple[str, str], NodeResult] = {}
    targets: dict[RunNode, list[tuple[str, _Target]]] = {}
    for rec in records:
        if rec.local:  # its control folder is inside the local run folder; the run folder is the launch directory
            marker = rec.nodes[0].marker if rec.nodes else ""
            if marker and _local_job_running(marker):
                results[(rec.run_id, rec.nodes[0].host)] = NodeResult(rec.nodes[0].host, "running")
            continue
        names = {n.host: _control_name(n.run_dir, n.control_dir) for n in rec.nodes}
        for n in rec.nodes:
            problem = prune_target_problem(rec.run_id, n.settings.workdir, n.run_dir, n.control_dir)
            if problem:
                results[(rec.run_id, n.host)] = NodeResult(n.host, "damaged", detail=problem)
                continue
            others = tuple(v for h, v in names.items() if h != n.host and v and v != names[n.host])
            targets.setdefault(n.settings, []).append((rec.run_id, (n.run_dir, n.marker, names[n.host], others)))
    fanout = min((r.fanout for r in records), default=1)
    _run_on_nodes(targets, dry_run, fanout, connect, results)
    shared = {}  # run id -> the host asked again (dry run: the one whose size counts)
    for rec in records:
        words = [results.get((rec.run_id, n.host)) for n in rec.nodes]
        if all(w is not None and w.word in GONE | {"shared"} for w in words) and any(
                w is not None and w.word == "shared" for w in words):
            shared[rec.run_id] = next(n for n, w in zip(rec.nodes, words, strict=True)
                                      if w is not None and w.word == "shared")
    if not dry_run and shared:
        again: dict[RunNode, list[tuple[str, _Target]]] = {}
        for run_id, n in shared.items():
            again.setdefault(n.settings, []).append(next(x for x in targets[n.settings] if x[0] == run_id))
        _run_on_nodes(again, dry_run, fanout, connect, results)
    for rec in records:
        if rec.run_id not in shared:
            continue
        first = shared[rec.run_id].host
        gone = results[(rec.run_id, first)].word in GONE
        for n in rec.nodes:
            r = results[(rec.run_id, n.host)]
            if n.host != first and r.word == "shared":  # one size for the one folder
                results[(rec.run_id, n.host)] = NodeResult(n.host, "missing" if gone else "shared", None, r.detail)
    return results


def _node_record(n: NodeLaunch) -> NodeRecord:
    """A node as its backend reaches it, in the record's words (what :func:`_node_folders` reads)."""
    return NodeRecord(n.host.name, n.host.address, n.node_rank, n.nproc, n.run_dir, n.control_dir, n.marker, n.host)


IN_USE_WHY = "in use: its `up` or a `collect` still works on it (a later prune removes it)"


def prune(store: RunStore, selection: Selection, dry_run: bool = False,
          connect: Callable = default_connect, reach: Callable[[RunRecord], Reach] | None = None) -> list[RunResult]:
    """Remove (``dry_run``: only look at) every run of ``selection``: node folders, then, once they
    are all gone, the local run folder and its row in runs.db.

    ``reach(rec)``: how the run's backend reaches its nodes (the CLI and keep_runs pass the
    backend's :meth:`~clusterddp.backends.base.Backend.reach`); a run it refuses keeps its folders
    and record, with the backend's words as why. Without it, the recorded hosts through ``connect``.

    A run whose in-use lock another process holds (:meth:`.RunStore.hold`: the `up` that ran it has not
    exited, or a `collect` brings it back) is left whole, said as :data:`IN_USE_WHY`; the others' locks are
    held until their removal is over, so no `collect` starts on a run being removed."""
    refused: dict[str, str] = {}
    held = []
    try:
        for rec in selection.remove:
            try:
                lock = store.hold(rec.run_id, exclusive=True)
            except UsageError as e:  # its folder cannot be written here: nor removed
                refused[rec.run_id] = str(e).replace("\n", "; ")
                continue
            if lock is None:
                refused[rec.run_id] = IN_USE_WHY
            else:
                held.append(lock)
        return _prune(store, selection, dry_run, connect, reach, refused)
    finally:
        for lock in held:
            lock.close()


def _prune(store: RunStore, selection: Selection, dry_run: bool, connect: Callable,
           reach: Callable[[RunRecord], Reach] | None, refused: dict[str, str]) -> list[RunResult]:
    connect_of: dict[RunNode, Callable] = {}
    reaches: list[Reach] = []
    reached: dict[str, RunRecord] = {}  # run id -> its record with its nodes as its backend reaches them
    try:
        for rec in selection.remove:
            if reach is None or rec.local or rec.run_id in refused:
                continue
            try:
                reaches.append(reach(rec))
            except Exception as e:  # noqa: BLE001 - refused by its backend (UsageError), or its login host unreachable
                refused[rec.run_id] = "; ".join(line.strip() for line in str(e).splitlines())
                continue
            connect_of.update({n.host: reaches[-1].connect for n in reaches[-1].nodes})
            reached[rec.run_id] = replace(rec, nodes=tuple(_node_record(n) for n in reaches[-1].nodes))
        node_results = _node_folders(tuple(reached.get(r.run_id, r) for r in selection.remove
                                           if r.run_id not in refused), dry_run,
                                     lambda h: connect_of.get(h, connect)(h))
    finally:
        for r in reaches:
            r.close()
    ok = WOULD_GO if dry_run else GONE
    out = []
    for rec in selection.remove:
        if rec.run_id in refused:
            out.append(RunResult(rec, (), disk_usage(store.run_dir(rec.run_id)), False, refused[rec.run_id]))
            continue
        nodes = tuple(node_results[(rec.run_id, n.host)] for n in reached.get(rec.run_id, rec).nodes
                      if (rec.run_id, n.host) in node_results)
        size = disk_usage(store.run_dir(rec.run_id))
        stuck = [n for n in nodes if n.word not in ok]
        if stuck:
            why = "; ".join(f"{n.host} {n.word}" + (f" ({n.detail})" if n.detail else "") for n in stuck)
            out.append(RunResult(rec, nodes, size, False, why))
            continue
        if dry_run:
            out.append(RunResult(rec, nodes, size, True))
            continue
        try:
            gone = store.remove(rec.run_id, lambda now: now.status is not RunStatus.RUNNING)
        except UsageError as e:  # a StoreError or a record damaged meanwhile: this run only
            out.append(RunResult(rec, nodes, size, False, str(e).replace("\n", "; ")))
            continue
        out.append(RunResult(rec, nodes, size, gone, None if gone else "its record says running"))
    return out


# ---- the node side: removing old runs' node folders (moved from plan.py) ----

_RUN_ID_SHAPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def prune_target_problem(run_id: str, workdir: str, run_dir: str, control_dir: str) -> str | None:
    """Why a recorded node folder is not one ``prune`` may delete, or None when it is.

    run.json is data a person (or a bug) can damage, so the folder must have exactly the shape
    :func:`build_plan` gives it, ``<workdir>/runs/<run_id>`` with the control folder inside, and
    no component that climbs (``..``) or hides (``.``, an empty one). On the node,
    :func:`prune_command` also refuses a folder that is a symlink or holds no ``.clusterddp``."""
    if not _RUN_ID_SHAPE.fullmatch(run_id):
        return f"the run id {run_id!r} is not one clusterddp makes"
    if run_dir != posixpath.join(workdir, "runs", run_id):
        return f"run folder {run_dir!r} is not <workdir>/runs/{run_id} (workdir {workdir!r})"
    if not control_dir.startswith(run_dir + "/"):
        return f"control folder {control_dir!r} is not inside the run folder {run_dir!r}"
    parts = run_dir.split("/")
    if parts[0] == "":  # absolute
        parts = parts[1:]
    elif parts[0] == "~":  # the remote home, as qpath expands it
        parts = parts[1:]
    bad = [p for p in parts if p in ("", ".", "..")]
    if bad or any(c in run_dir for c in "\0\n\r"):
        return f"run folder {run_dir!r} has an empty, '.' or '..' component or a control character"
    return None


_PRUNE_FN = r"""cddp_prune() {  # $1 index, $2 run folder, $3 the job's marker, $4 "dry": look only (else "go"),
  # $5 this host's control folder name in $2/.clusterddp (or ""), then the run's other hosts' names
  if [ -n "$(cddp_marked "$3")" ]; then echo "$1 running"; return; fi
  if [ ! -e "$2" ] && [ ! -L "$2" ]; then echo "$1 missing"; return; fi
  if [ -L "$2" ] || [ ! -d "$2" ] || [ -L "$2/.clusterddp" ] || [ ! -d "$2/.clusterddp" ]; then
    echo "$1 refused"; return
  fi
  local i=$1 d=$2 dry=$4 own=$5 o kb; shift 5
  kb=$(du -sk -- "$d" 2>/dev/null | cut -f1)
  for o in "$@"; do  # another host of the run shares this folder (one NFS workdir) and has not let go of it
    if [ -e "$d/.clusterddp/$o" ] || [ -L "$d/.clusterddp/$o" ]; then
      if [ "$dry" != dry ] && [ -n "$own" ]; then rm -rf -- "$d/.clusterddp/$own" 2>/dev/null; fi
      echo "$i shared ${kb:--} $o"; return
    fi
  done
  if [ "$dry" = dry ]; then echo "$i would ${kb:--}"; return; fi
  rm -rf -- "$d" 2>/dev/null
  if [ -e "$d" ]; then echo "$i failed ${kb:--}"; else echo "$i removed ${kb:--}"; fi
}"""


def prune_command(targets: Sequence[tuple[str, str] | tuple[str, str, str, Sequence[str]]],
                  dry_run: bool = False) -> str:
    """Remove run folders on one node: ``targets`` are (run folder, marker[, this host's control
    folder name, the run's other hosts' control folder names]), each already accepted by
    :func:`prune_target_problem`. One line per target, ``<index> <word> [KiB]``: ``removed`` (or
    ``would`` with ``dry_run``: nothing is touched), ``missing`` (nothing there), ``running`` (a
    process still carries the run's marker: left alone, whatever the record says), ``shared
    <KiB> <host>`` (another host's control folder is in it: the folder is one shared workdir's and
    that host may still use it; this host's own control folder is let go of, the rest is left),
    ``refused`` (a symlink, or not a folder holding ``.clusterddp``) or ``failed``."""
    lines = [MARKED_FN, _PRUNE_FN]
    for i, t in enumerate(targets):
        run_dir, marker = t[0], t[1]
        own, others = (t[2], t[3]) if len(t) == 4 else ("", ())
        lines.append(" ".join([f"cddp_prune {i} {qpath(run_dir)} {marker_word(marker)}",
                               "dry" if dry_run else "go", q(own), *map(q, others)]))
    return "\n".join(lines)
