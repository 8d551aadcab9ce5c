"""`up --resume RUN`: a new run's nodes start with the newest checkpoint an earlier run left.

Each run of an inventory runs in a folder of its own on each node (``<workdir>/runs/<run_id>/``), so a
script that keeps its snapshot at a relative path (``snapshot.pt``) starts over on the next `up`.
With ``--resume RUN``, before the job starts, the newest checkpoint of each series that RUN left is put
on *every* node of the new run, at the same relative path under its run folder, and the run records it
(``resumed_from`` in run.json).

What counts as a checkpoint: the files :data:`clusterddp.mirror.DEFAULT_GLOBS` (the default rule) or
RUN's collect globs match (:func:`globs_of`); series, steps and "newest" are the mirror's
(:func:`clusterddp.mirror.choose`). Where they are looked for (:func:`local_found`, :func:`node_found`):
RUN's mirror on this machine (``mirror.json``, each copy's sha256 checked), what was collected from
its nodes (``<run>/artifacts/<host>/``), and RUN's nodes themselves (a ``list`` request of the collect
protocol; a node that does not answer is said and passed over). Of all, the newest (:func:`newest`:
the highest step, then the latest modification; a tie goes to a copy already here). One found only on
a node is first brought here through the collect protocol, verified (:func:`fetch`), into RUN's
artifacts, as ``clusterddp collect`` would. Then each file goes to every node with
:func:`clusterddp.mirror.seed_command` (the mirror's transfer: written beside its place and renamed
there only once its sha256 on the node is the one here; :func:`send`).

RUN: a run id (or its unique start or end, as every command takes it), ``last`` (the newest earlier
run of this script with this inventory), or ``previous`` (the run a schedule started last: a
schedule's spec records ``--resume previous``). It must be an ended run of the same script (by file
name) and inventory, of the SSH backend; else, and when it left no checkpoint, a UsageError (exit 2)
says why. A schedule's first firing has no previous run: it starts from scratch (:func:`resolve`
returns None).

:func:`hint` is the line `up` says when it starts without ``--resume`` and the newest earlier run of
the same script and inventory left a checkpoint here (its mirror, or collected).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import plan as ssh_plan
from .artifacts import exchange
from .errors import HostError, MirrorError, UsageError
from .fleet import Fleet
from .mirror import DEFAULT_GLOBS, MAX_FILES, Checkpoint, choose, put, read_index
from .node.collect import Receiver, StreamError, path_problem, sha256_file
from .nodeops import nodes_of
from .record import ResumedFrom, RunRecord, RunStatus
from .sizes import human_size

if TYPE_CHECKING:
    from .store import RunStore
    from .transport import Transport

LAST = "last"          # --resume last: the newest earlier run of this script with this inventory
PREVIOUS = "previous"  # --resume previous: the previous run of the schedule that starts this one
MIRROR, COLLECTED, NODE = "mirror", "collected", "node"
_PREFERRED = (MIRROR, COLLECTED, NODE)  # on a tie, a copy here (and checked) before one to fetch
MAX_WALK = 100_000     # files of a run's artifacts looked at, at most
SEND_TIMEOUT_S = 600.0  # one file to one node


@dataclass(frozen=True)
class Found:
    """A checkpoint of the run, found in one place: ``source`` (:data:`MIRROR`, :data:`COLLECTED`,
    :data:`NODE`) on or from ``host``; its files (path under the run folder, size, mtime in ns);
    ``sha256``: each file's, where known already (the mirror's)."""

    source: str
    host: str
    checkpoint: Checkpoint
    sha256: tuple[tuple[str, str], ...] = ()

    @property
    def where(self) -> str:
        return f"{NODE} {self.host}" if self.source == NODE else self.source

    @property
    def said(self) -> str:
        """Where it came from, in a sentence."""
        return {MIRROR: "its mirror", COLLECTED: "its collected files"}.get(self.source, self.host)


def globs_of(rec: RunRecord) -> tuple[str, ...]:
    """What counts as a checkpoint of ``rec``: the default rule, and the run's collect globs."""
    return tuple(dict.fromkeys((*DEFAULT_GLOBS, *rec.collect)))


# ---- which run ----

def resolve(store: RunStore, given: str, *, inventory: str, script: str, schedule: str | None) -> RunRecord | None:
    """The run ``given`` names, checked (:func:`refused`): an ended run of ``script`` (same file name)
    with ``inventory`` (its absolute path; the caller checks that its backend is its own); None for
    ``previous`` when the schedule has no run yet. A UsageError (exit 2) names what is wrong and what
    to do."""
    name = Path(script).name
    if inventory == "local":
        raise UsageError("--resume: `up local` runs in this folder, where a checkpoint at a relative path is "
                         "already where the next run looks for it",
                         "leave --resume out (it is for inventories, whose runs have a folder of their own)")
    if given == PREVIOUS:
        if schedule is None:
            raise UsageError("--resume previous: means the previous run of a schedule, and this run is not a "
                             "schedule's", "give a run id (`clusterddp runs` lists them), or `last`")
        row = store.last_run(schedule)
        if row is None:
            return None
        run_id = str(row["run_id"])
    elif given == LAST:
        run_id = _last(store, inventory, name)
    else:
        run_id = store.resolve(given)
    rec = store.load(run_id)
    problem = refused(rec, inventory, name)
    if problem:
        raise UsageError(f"--resume {given}: run {run_id} {problem}",
                         "give a run of this script and inventory (`clusterddp runs` lists them), or leave "
                         "--resume out to start from scratch")
    return rec


def refused(rec: RunRecord, inventory: str, script_name: str) -> str | None:
    """Why a new run of ``script_name`` with ``inventory`` cannot resume from ``rec``, or None."""
    if rec.local or rec.inventory == "local":
        return "ran with `up local`, in the launch folder: its checkpoints are there already"
    if rec.inventory != inventory:
        return f"ran with another inventory ({rec.inventory})"
    if Path(rec.script).name != script_name:
        return f"ran another script ({rec.script})"
    if rec.status is RunStatus.RUNNING:
        return (f"is still running (as of its record): its checkpoints still change; `clusterddp stop "
                f"{rec.run_id}` first, or `clusterddp status {rec.run_id}` if it has ended")
    return None


def _last(store: RunStore, inventory: str, script_name: str) -> str:
    for row in store.list():  # newest first
        if row.get("inventory") == inventory and Path(str(row.get("script") or "")).name == script_name \
                and row.get("status") != RunStatus.RUNNING.value:
            return str(row["run_id"])
    raise UsageError(f"--resume last: no earlier run of {script_name} with {inventory} in {store.root}",
                     "give a run id (`clusterddp runs` lists them), or leave --resume out")


# ---- where its checkpoints are ----

def newest(found: Iterable[Found]) -> list[Found]:
    """The newest checkpoint of each series among ``found``, sorted by series: the highest step, then
    the one modified last; on a tie, the copy that needs no transfer (mirror, then collected, then a
    node). Pure."""
    best: dict[str, Found] = {}
    for f in found:
        s = f.checkpoint.series
        if s not in best or _rank(f) > _rank(best[s]):
            best[s] = f
    return [best[s] for s in sorted(best)]


def _rank(f: Found) -> tuple:
    c = f.checkpoint
    return c.step, max((m for _, _, m in c.files), default=0), -_PREFERRED.index(f.source)


def local_found(store: RunStore, rec: RunRecord, globs: Sequence[str],
                warn: Callable[[str], None] = lambda line: None, verify: bool = True) -> list[Found]:
    """The checkpoints of ``rec`` on this machine: its mirror's (each copy with the sha256 it was
    brought back with; one that no longer has it is passed over: the end-of-run collect may have
    replaced it; ``verify`` False: only its size is checked) and the newest of each series among its
    collected files (mtimes: when collected)."""
    run_id = rec.run_id
    out: list[Found] = []
    mirrored: set[tuple[str, str]] = set()
    try:
        held = read_index(store, run_id)
    except MirrorError as e:
        warn(f"resume: run {run_id}'s mirror is not used: {e.message}")
        held = []
    for h in held:
        ok = True
        for p, s, digest in h.files:
            local = store.artifact_path(run_id, h.host, p)
            try:
                ok = ok and local.stat().st_size == s and (not verify or sha256_file(local) == digest)
            except OSError:
                ok = False
        if ok:
            mt = h.mtimes if len(h.mtimes) == len(h.files) else (0,) * len(h.files)
            chk = Checkpoint(h.series, h.step, tuple((p, s, m) for (p, s, _), m in zip(h.files, mt, strict=True)))
            out.append(Found(MIRROR, h.host, chk, tuple((p, d) for p, _, d in h.files)))
            mirrored.update((h.host, p) for p, _, _ in h.files)
    for host in sorted({n.host for n in (*rec.nodes, *rec.lost)}):
        listing = _walk(store.artifacts_dir(run_id, host))
        listing = {p: v for p, v in listing.items() if (host, p) not in mirrored}
        out += [Found(COLLECTED, host, c) for c in choose(listing, globs)]
    return out


def _walk(base: Path) -> dict[str, tuple[int, int]]:
    """Every regular file under ``base`` (path relative to it -> (size, mtime in ns)), links not
    followed, half-received ``.part`` files and names the collect protocol refuses left out; at most
    MAX_WALK."""
    out: dict[str, tuple[int, int]] = {}
    if not base.is_dir() or base.is_symlink():
        return out
    for root, dirs, names in os.walk(base):
        dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(root, d))]
        for n in names:
            if n.endswith(".part"):
                continue
            p = Path(root, n)
            try:
                st = p.lstat()
            except OSError:
                continue
            if p.is_symlink() or not p.is_file():
                continue
            rel = p.relative_to(base).as_posix()
            if path_problem(rel) is None:  # not the run's control folder, nor a name too long to send
                out[rel] = (st.st_size, st.st_mtime_ns)
            if len(out) >= MAX_WALK:
                return out
    return out


def node_found(fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], globs: Sequence[str],
               warn: Callable[[str], None] = lambda line: None) -> list[Found]:
    """The newest checkpoint of each series still on each of ``nodes`` (a run's, from its record),
    listed through the collect protocol (nothing read or hashed there). A node that does not answer,
    or whose list does not come whole, is said and passed over."""
    # "written": only files the job wrote (modified since the script's folder was unpacked), as the mirror
    # asks: a *.pt that came with the upload is no checkpoint (a node program that predates it ignores it)
    request = {"globs": list(globs), "have": {}, "list": True, "written": True}

    def ask(n: ssh_plan.NodeLaunch, t: Transport) -> dict[str, tuple[int, int]]:
        rx = Receiver(lambda rel: Path(os.devnull), request=request)
        why = None
        try:
            _exchange(t, n, rx, request)
        except HostError as e:
            why = str(e)
        finally:
            rx.finish(why)
        if why is not None or rx.unmatched is None:
            raise HostError(n.host.name, why or "its list of checkpoint files was cut short")
        return rx.listing
    got = fleet.each(lambda h, t: ask(next(n for n in nodes if n.host.name == h.name), t),
                     [n.host for n in nodes])
    out: list[Found] = []
    for n in nodes:
        r = got.get(n.host.name)
        if isinstance(r, Exception):
            warn(f"resume: {n.host.name} was not asked for its checkpoints: {r}")
        elif r is not None:
            out += [Found(NODE, n.host.name, c) for c in choose(r, globs)]
    return out


def _exchange(t: Transport, node: ssh_plan.NodeLaunch, rx: Receiver, request: dict) -> None:
    try:
        exchange(t, node, rx, request)
    except StreamError as e:
        raise HostError(node.host.name, f"its answer was refused: {e}") from None


def fetch(fleet: Fleet, node: ssh_plan.NodeLaunch, store: RunStore, run_id: str, f: Found) -> Found:
    """A checkpoint found on ``node`` brought here into its run's artifacts (as `collect` puts it),
    each file verified (size, sha256, unchanged while read); HostError when one is not taken whole."""
    paths = [p for p, _, _ in f.checkpoint.files]
    request = {"paths": paths, "have": {}}
    rx = Receiver(store.artifact_paths(run_id, node.host.name), request=request)
    why = None
    try:
        _exchange(fleet.transport(node.host), node, rx, request)
    except HostError as e:
        why = str(e)
    finally:
        rx.finish(why)
    if why is not None:
        raise HostError(node.host.name, f"cannot bring {f.checkpoint.name} back: {why}")
    if rx.missing:
        p, reason = rx.missing[0]
        raise HostError(node.host.name, f"cannot bring {p} back: {reason}")
    if set(rx.fetched) != set(paths):
        raise HostError(node.host.name, f"{f.checkpoint.name} changed while it was read: not taken")
    return Found(NODE, f.host, f.checkpoint, tuple((p, rx.digests[p]) for p in paths))


def find(store: RunStore, rec: RunRecord, warn: Callable[[str], None] = lambda line: None,
         connect: Callable | None = None) -> list[Found]:
    """The newest checkpoint of each series that ``rec`` left, each here on this machine (fetched from
    its node when only that held it). A UsageError when it left none anywhere."""
    globs = globs_of(rec)
    found = local_found(store, rec, globs, warn)
    nodes = nodes_of(rec)
    with Fleet([n.host for n in nodes], fanout=rec.fanout, **({"connect": connect} if connect else {})) as fleet:
        found += node_found(fleet, nodes, globs, warn)
        chosen: list[Found] = []
        for series in sorted({f.checkpoint.series for f in found}):
            for f in sorted((f for f in found if f.checkpoint.series == series), key=_rank, reverse=True):
                if len(f.checkpoint.files) > MAX_FILES:
                    warn(f"resume: {f.checkpoint.name} ({f.where}) has {len(f.checkpoint.files)} files, more than "
                         f"the {MAX_FILES} a checkpoint may have: not used")
                    continue
                if f.source != NODE:
                    chosen.append(f)
                    break
                try:
                    chosen.append(fetch(fleet, next(n for n in nodes if n.host.name == f.host), store, rec.run_id, f))
                    break
                except HostError as e:  # an older copy of the series may still be had
                    warn(f"resume: {e}; looking at older copies")
    if not chosen:
        raise UsageError(f"--resume {rec.run_id}: that run left no checkpoint: none in its mirror, among its "
                         f"collected files or on its nodes that answered, by the rule {' '.join(globs)}",
                         "leave --resume out to start from scratch, or give the run that saved one")
    return chosen


# ---- to the new run's nodes ----

def local_path(store: RunStore, run_id: str, f: Found, rel: str) -> Path:
    return store.artifact_path(run_id, f.host, rel)


def paths(chosen: Iterable[Found]) -> set[str]:
    """Every file the resume puts in the run folder (paths under it)."""
    return {p for f in chosen for p, _, _ in f.checkpoint.files}


def send(
    fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], store: RunStore, run_id: str, chosen: Sequence[Found]
) -> None:
    """Put every file of ``chosen`` (run ``run_id``'s, here) on every one of ``nodes`` at the same path
    under its run folder, with :func:`clusterddp.mirror.put` (renamed into place only once its
    sha256 there is the one here). HostError naming the first node that did not take a file whole;
    MirrorError when a copy here no longer has the sha256 it was brought back with."""
    files: list[tuple[str, Path, str]] = []
    for f in chosen:
        known = dict(f.sha256)
        for p, s, _ in f.checkpoint.files:
            local = local_path(store, run_id, f, p)
            try:
                digest = sha256_file(local) if local.stat().st_size == s else None
            except OSError:
                digest = None
            if digest is None or (p in known and known[p] != digest):
                raise MirrorError(f"the copy {local} of run {run_id}'s {p} changed since it was found: not sent",
                                  "run the same command again")
            files.append((p, local, digest))

    def put_all(n: ssh_plan.NodeLaunch, t: Transport) -> None:
        for p, local, digest in files:
            put(t, n, p, local, digest, SEND_TIMEOUT_S, "the checkpoint")
    by_name = {n.host.name: n for n in nodes}
    failed = fleet.each(lambda h, t: put_all(by_name[h.name], t), [n.host for n in nodes]).failed
    for n in nodes:
        if n.host.name in failed:
            e = failed[n.host.name]
            raise e if isinstance(e, HostError) else HostError(n.host.name, f"{type(e).__name__}: {e}")


def record_of(run_id: str, chosen: Sequence[Found]) -> ResumedFrom:
    """run.json's ``resumed_from`` for ``chosen``."""
    steps = [f.checkpoint.step[-1] for f in chosen if f.checkpoint.step]
    return ResumedFrom(run_id, tuple(f.checkpoint.name for f in chosen), max(steps) if steps else None,
                       ", ".join(dict.fromkeys(f.where for f in chosen)))


def describe(run_id: str, chosen: Sequence[Found], hosts: Sequence[str]) -> str:
    """The line `up` says once every node has the checkpoints."""
    what = "; ".join(f"{f.checkpoint.name} ({human_size(f.checkpoint.size)}, from {f.said})" for f in chosen)
    return (f"[clusterddp] resuming from run {run_id}: {what}, put on {', '.join(hosts)} at the same path in the "
            f"run folder (sha256 checked there)")


# ---- the hint ----

def hint(store: RunStore, *, inventory: str, script: str, args: Sequence[str], runs_dir_flag: str = "",
         before: str | None = None, inventory_arg: str | None = None) -> str | None:
    """When the newest earlier run of ``script`` with ``inventory`` (its absolute path; other than run
    ``before``, this one, and than runs still going on) left a checkpoint here (its mirror, or
    collected: nothing is asked of a node), the line that says this run starts without it and how to
    carry on from it (the command with ``inventory_arg``, the inventory as given); else None. Never
    raises: a hint that cannot be worked out is not given."""
    from .errors import ClusterDDPError
    name = Path(script).name
    try:
        for row in store.list():
            run_id = str(row["run_id"])
            if run_id == before or row.get("inventory") != inventory or Path(str(row.get("script") or "")).name != name:
                continue
            rec = store.load(run_id)
            if rec.status is RunStatus.RUNNING:  # another run going on beside this one: the one before it
                continue
            if refused(rec, inventory, name):
                return None
            chosen = newest(local_found(store, rec, globs_of(rec), verify=False))
            if not chosen:
                return None
            command = shlex.join(["clusterddp", "up", inventory_arg or inventory, script, "--resume", run_id])
            rest = f" -- {shlex.join(list(args))}" if args else ""
            return (f"[clusterddp] note: run {run_id} of {name} left {', '.join(f.checkpoint.name for f in chosen)}; "
                    f"this run has a run folder of its own and starts without it. To carry on from it instead, "
                    f"start with the same options and --resume: {command}{runs_dir_flag}{rest}")
    except (ClusterDDPError, OSError, ValueError):
        return None
    return None
