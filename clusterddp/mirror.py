"""Checkpoints that survive the loss of any one node, with no shared filesystem.

While an attached run goes on, :class:`Mirror` brings the newest complete checkpoint of its rank 0's
node back to this machine as it appears, verified, into ``<run>/artifacts/<host>/<path>`` (where
``collect`` puts it: the end-of-run collect then finds it whole and fetches only the rest), and keeps
``<run>/mirror.json``, the list of what it holds. Before a new attempt starts, :func:`seed_all` sends
that checkpoint to every node of it (hosts that stay and hosts that come in alike; the same path under
its run folder), after a last look at rank 0 when its host stays (:meth:`Mirror.last_look`), so every
rank resumes from the same point (``clusterddp.train.load_latest``, or a script's own
``torch.load("snapshot.pt")``).

It reuses the collect protocol (:mod:`clusterddp.node.collect`): every ``interval_s`` one command on
rank 0's node lists the checkpoint files the job wrote with their sizes and modification times
(``"list"``: nothing is read or hashed there), and a checkpoint that is new or changed is fetched by
path into ``<run>/mirror.incoming``, streamed and hashed in one pass. A copy is taken only when it is
consistent: each file unchanged (inode, size, time) from before its read to after it (the node's
"stable" flag), last modified at least QUIET_S before the read (a writer pausing mid-save is not done),
and whole for its format (:func:`whole_problem`: a ``torch.save`` zip's end record, a safetensors
header's length); a file rewritten while read is fetched again, up to FETCH_TRIES times a look. So a
snapshot overwritten in place every few seconds by a plain ``torch.save`` is taken, and a half-written
one never is. What is held is what came (its size and sha256), even when the file changed between the
look and the fetch. A checkpoint of several files (a folder per step) is taken only once two looks in a
row list it alike, so a folder still filling up is never taken.

What a checkpoint is (:func:`checkpoint_globs`): ``up --checkpoints`` globs, else the inventory's
``checkpoints:``, else :data:`DEFAULT_GLOBS` (files that look like checkpoints, anywhere in the run
folder, written by the job: modified since the script's folder was unpacked). The first part of a path
after its glob's literal folders that holds a number makes the checkpoint's step: ``step-48.pt``,
``ckpt_000100.pt``, ``checkpoint-500/`` (all the files under it, as Hugging Face's Trainer writes),
``global_step100/`` (DeepSpeed), ``iter_0001000/`` (Megatron). Names alike but for their numbers are
one *series* (``step-#.pt``); of each series only the highest step is the newest. A file with no
number (``snapshot.pt``) is a series of its own, mirrored whenever it has changed.

Bounded: one look every ``interval_s`` (a shell and a python start on the node), each answer bounded
by the collect protocol's limits and a per-chunk timeout, at most MAX_FILES files in one checkpoint,
never more than the free space here allows (DISK_MARGIN kept free; checked against the sizes the node
sends), local copies of older checkpoints of a series removed once the node has removed them. A mirror
that fails never changes the run's outcome: each problem is said once, as one warning line, and the
mirror carries on trying.

Not protected: a ``--detach``ed run, which has no launcher watching it (:func:`unprotected` says so at
detach), and checkpoints written on a node other than rank 0's (DDP ranks hold the same weights: rank
0's checkpoint is the run's, and its copy here survives the loss of rank 0's host).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from . import plan as ssh_plan
from .errors import ClusterDDPError, FileRefused, HostError, MirrorError
from .files import read_bounded
from .node.collect import HEX, Receiver, StreamError, glob_parts, matches, path_problem, sha256_file
from .nodescript import q, qpath
from .sizes import human_size as human_bytes
from .store import utcnow
from .transport import Tail

if TYPE_CHECKING:
    from .fleet import Fleet
    from .plan import LaunchPlan, NodeLaunch
    from .store import RunStore
    from .transport import CommandResult, Transport

# What a checkpoint is for a run that says nothing (`checkpoints:` in the inventory or `up --checkpoints`
# say otherwise): the files the job writes under its run folder that look like one. checkpoints/** is
# clusterddp.train.save_checkpoint's folder; checkpoint*/ is Hugging Face's and Lightning's; the
# suffixes are torch.save's, Lightning's and safetensors' usual ones; snapshot* is the PyTorch DDP
# tutorial's. Only files modified since the script's folder was unpacked count ("written").
DEFAULT_GLOBS = ("checkpoints/**", "**/checkpoint*/**", "**/*.pt", "**/*.pth", "**/*.ckpt", "**/*.safetensors",
                 "**/snapshot*")
QUIET_S = 1.0           # a file modified less than this before it is read is not taken (its writer may pause)
FETCH_TRIES = 3         # fetches of a checkpoint that keeps changing, in one look (QUIET_S apart)
INTERVAL_S = 10.0       # between two looks at rank 0's checkpoints
INTERVAL_ENV = "CLUSTERDDP_MIRROR_INTERVAL"  # another interval, in seconds; 0: no mirror
LIST_TIMEOUT_S = 60.0   # the longest wait for a chunk of a list answer
FETCH_TIMEOUT_S = 120.0  # ... of a fetch (the collect protocol ticks every 5 s while it works)
STOP_WAIT_S = 15.0      # how long stop() waits for the mirror's thread (an aborted transfer) to end
MAX_FILES = 10000       # files in one checkpoint
DISK_MARGIN = 1 << 30   # bytes left free here after a checkpoint is fetched
MAX_INDEX = 4 << 20     # bytes of mirror.json
INDEX_VERSION = 1

_NUMBER = re.compile(r"\d+")
INCOMING = "mirror.incoming"  # <run>/mirror.incoming/<host>/<path>: a checkpoint being fetched, until whole
_REMOVE = "remove the file: the mirror writes it again with its next checkpoint"


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint on a node: its series (``checkpoints/step-#.pt``), its step (the numbers of the
    part that names it; () for a file without one) and its files (path, size, mtime in ns), sorted."""

    series: str
    step: tuple[int, ...]
    files: tuple[tuple[str, int, int], ...]

    @property
    def size(self) -> int:
        return sum(s for _, s, _ in self.files)

    @property
    def name(self) -> str:
        """What a person calls it: the file, or the folder all its files are in."""
        paths = [p for p, _, _ in self.files]
        if len(paths) == 1:
            return paths[0]
        head = paths[0].split("/")
        for p in paths[1:]:
            parts = p.split("/")
            n = 0
            while n < min(len(head), len(parts)) and head[n] == parts[n]:
                n += 1
            head = head[:n]
        return "/".join(head) + "/"


def _literal(parts: list[str]) -> int:
    """How many leading parts of a glob are plain folder names (not the last part, the file itself)."""
    n = 0
    while n < len(parts) - 1 and not any(c in parts[n] for c in "*?["):
        n += 1
    return n


def series_of(path: str, globs: Iterable[str]) -> tuple[str, tuple[int, ...], str] | None:
    """(series, step, the checkpoint's own prefix) of a path the ``globs`` match, or None when none
    does. The step comes from the first part after the literal folders of the matching glob that
    holds a number (the glob with most literal folders wins); a path without one is a series (and a
    checkpoint) of its own, with step ()."""
    names = path.split("/")
    skip = -1
    for g in globs:
        parts = glob_parts(g)
        if parts is not None and matches(parts, names):
            skip = max(skip, _literal(parts))
    if skip < 0:
        return None
    for i in range(skip, len(names)):
        numbers = _NUMBER.findall(names[i])
        if numbers:
            series = "/".join([*names[:i], _NUMBER.sub("#", names[i]), *(["*"] if i < len(names) - 1 else [])])
            return series, tuple(int(n) for n in numbers), "/".join(names[:i + 1])
    return path, (), path


def groups(listing: Mapping[str, tuple[int, int]], globs: Iterable[str]) -> list[Checkpoint]:
    """Every checkpoint among the listed files (path -> (size, mtime in ns)) that ``globs`` match."""
    globs = tuple(globs)
    files: dict[tuple[str, str], list[tuple[str, int, int]]] = {}
    steps: dict[tuple[str, str], tuple[int, ...]] = {}
    for path, (size, mtime) in listing.items():
        found = series_of(path, globs)
        if found is not None:
            series, step, own = found
            files.setdefault((series, own), []).append((path, size, mtime))
            steps[(series, own)] = step
    return [Checkpoint(k[0], steps[k], tuple(sorted(v))) for k, v in files.items()]


def checkpoint_globs(plan: LaunchPlan) -> tuple[str, ...]:
    """What a checkpoint is for this run: ``up --checkpoints`` globs, else the inventory's
    ``checkpoints:`` (:func:`clusterddp.runspec.resolve`), else :data:`DEFAULT_GLOBS`."""
    return plan.spec.checkpoints or DEFAULT_GLOBS


def ranked(listing: Mapping[str, tuple[int, int]], globs: Iterable[str],
           before: Mapping[str, tuple[int, int]] | None = None) -> dict[str, list[Checkpoint]]:
    """Every complete checkpoint among the listed files, by series, newest first (what :func:`choose`
    picks from; the mirror falls back along a series when its newest cannot be copied whole)."""
    found = groups(listing, globs)
    if before is not None:
        settled = set(groups(before, globs))
        found = [c for c in found if len(c.files) == 1 or c in settled]
    by: dict[str, list[Checkpoint]] = {}
    for c in sorted(found, key=lambda c: (c.step, max(m for _, _, m in c.files)), reverse=True):
        by.setdefault(c.series, []).append(c)
    return {k: by[k] for k in sorted(by)}


def choose(listing: Mapping[str, tuple[int, int]], globs: Iterable[str],
           before: Mapping[str, tuple[int, int]] | None = None) -> list[Checkpoint]:
    """The newest complete checkpoint of each series among the listed files (path -> (size, mtime in
    ns)) that ``globs`` match, sorted by series. Complete, when ``before`` (the previous look) is given:
    a checkpoint of several files (a folder) must be listed there alike (the same files, sizes and
    times), so a folder still filling up is passed over for the newest one that is not; a checkpoint of
    one file is whole when a copy of it is consistent (:meth:`Mirror.look`), however often it is
    rewritten. Newest: the highest step; between two of one step (``step-08.pt``, ``step-8.pt``), the
    one modified last."""
    return [series[0] for series in ranked(listing, globs, before).values()]


def interval_from(env: Mapping[str, str]) -> tuple[float, str | None]:
    """The mirror's interval from ``CLUSTERDDP_MIRROR_INTERVAL`` (seconds, 1 to 3600; 0 turns it off),
    and the problem with the value given, if any (then the default)."""
    given = env.get(INTERVAL_ENV)
    if given is None or not given.strip():
        return INTERVAL_S, None
    try:
        value = float(given)
    except ValueError:
        value = -1.0
    if value == 0 or 1 <= value <= 3600:
        return value, None
    return INTERVAL_S, (f"mirror: {INTERVAL_ENV}={given!r} is not 0 (off) or a number of seconds from 1 to 3600: "
                        f"every {INTERVAL_S:g}s instead")


def whole_problem(path: Path) -> str | None:
    """Why the file at ``path`` is not a whole checkpoint, when its format says so (None: it is, or its
    format is not one known here). A zip (``torch.save``'s format since torch 1.6) must end with its
    end-of-central-directory record, which is written last; a ``.safetensors`` file must be as long as
    its header says. A copy of a file cut off while written fails here even when it did not change
    while read."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
            size = os.fstat(f.fileno()).st_size
            if head[:4] == b"PK\x03\x04":
                tail_at = max(0, size - (65536 + 22))
                f.seek(tail_at)
                tail = f.read()
                at = tail.rfind(b"PK\x05\x06")
                if at < 0 or len(tail) - at < 22:
                    return "a zip (torch.save) without its end record: cut off while written"
                return None
            if path.name.endswith(".safetensors"):
                if len(head) < 8:
                    return "a safetensors file shorter than its header"
                n = int.from_bytes(head, "little")
                if n > min(size - 8, 100 << 20):
                    return "a safetensors file shorter than its header says"
                header = json.loads(f.read(n))
                ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
                if 8 + n + max(ends, default=0) != size:
                    return f"a safetensors file of {size} bytes, not the {8 + n + max(ends, default=0)} its header says"
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError) as e:
        return f"cannot be read as its format: {type(e).__name__}"
    return None


# ---- mirror.json: what the mirror holds ----

@dataclass(frozen=True)
class Held:
    """A checkpoint the mirror holds here, whole: fetched from ``host``, each file (path, size, sha256)
    at ``<run>/artifacts/<host>/<path>``; ``mtimes``: the node's times of those files then."""

    series: str
    step: tuple[int, ...]
    host: str
    at: str
    files: tuple[tuple[str, int, str], ...]
    mtimes: tuple[int, ...] = ()

    @property
    def size(self) -> int:
        return sum(s for _, s, _ in self.files)

    def same(self, chk: Checkpoint, host: str) -> bool:
        """Whether this is ``chk`` as ``host`` lists it now (names, sizes, times)."""
        return (host == self.host and tuple((p, s) for p, s, _ in self.files) == tuple((p, s) for p, s, _ in chk.files)
                and self.mtimes == tuple(m for _, _, m in chk.files))

    def to_json(self) -> dict:
        return {"series": self.series, "step": list(self.step), "host": self.host, "at": self.at,
                "files": [{"path": p, "size": s, "sha256": h} for p, s, h in self.files], "mtimes": list(self.mtimes)}

    @staticmethod
    def from_json(d: object, where: str) -> Held:
        """One entry of mirror.json, checked (it is a file on disk: trusted no more than a node)."""
        def bad(field: str, why: str) -> MirrorError:
            return MirrorError(f"{where}.{field}: {why}" if field else f"{where}: {why}", _REMOVE)
        if not isinstance(d, dict):
            raise bad("", "not an object")
        series, step, host, at, files, mtimes = (d.get(k) for k in ("series", "step", "host", "at", "files", "mtimes"))
        if not isinstance(series, str):
            raise bad("series", "not a string")
        if not isinstance(host, str) or not host or "/" in host or host.startswith("."):
            raise bad("host", "not a host name")
        if not isinstance(at, str):
            raise bad("at", "not a string")
        if not isinstance(files, list) or not files or len(files) > MAX_FILES:
            raise bad("files", f"not a list of 1 to {MAX_FILES} files")
        if not isinstance(step, list) or not all(type(n) is int and n >= 0 for n in step):  # noqa: E721
            raise bad("step", "not a list of numbers")
        if not isinstance(mtimes, list) or not all(type(n) is int for n in mtimes):  # noqa: E721
            raise bad("mtimes", "not a list of numbers")
        out: list[tuple[str, int, str]] = []
        for i, f in enumerate(files):
            p, s, h = (f.get(k) for k in ("path", "size", "sha256")) if isinstance(f, dict) else (None, None, None)
            why = path_problem(p)
            if why is not None or not isinstance(p, str):
                raise bad(f"files[{i}].path", f"{p!r} is refused: {why}")
            if type(s) is not int or s < 0:  # noqa: E721 - a bool is not a size
                raise bad(f"files[{i}].size", "not a number of bytes")
            if not (isinstance(h, str) and len(h) == 64 and HEX.issuperset(h)):
                raise bad(f"files[{i}].sha256", "not 64 lowercase hex digits")
            out.append((p, s, h))
        return Held(series, tuple(step), host, at, tuple(out), tuple(mtimes))


def read_index(store: RunStore, run_id: str) -> list[Held]:
    """What the mirror holds for the run (none: an empty list). A damaged mirror.json is a MirrorError
    naming it."""
    path = store.mirror_index_path(run_id)
    try:
        raw, _ = read_bounded(path, MAX_INDEX, nofollow=True)
    except FileRefused as e:
        if e.reason == "missing":
            return []
        raise MirrorError(str(e), _REMOVE) from None
    try:
        doc = json.loads(raw)
    except ValueError as e:
        raise MirrorError(f"{path}: not JSON ({e})", _REMOVE) from None
    except RecursionError:  # nested deeper than the parser goes: no index the mirror writes
        raise MirrorError(f"{path}: not JSON (nested too deep)", _REMOVE) from None
    if not isinstance(doc, dict) or doc.get("version") != INDEX_VERSION or not isinstance(doc.get("checkpoints"), list):
        raise MirrorError(f"{path}: not a mirror index of version {INDEX_VERSION}", _REMOVE)
    return [Held.from_json(d, f"{path}: checkpoints[{i}]") for i, d in enumerate(doc["checkpoints"])]


def _write_index(store: RunStore, run_id: str, held: Iterable[Held]) -> None:
    doc = {"version": INDEX_VERSION, "checkpoints": [h.to_json() for h in sorted(held, key=lambda h: h.series)]}
    store.write_mirror_index(run_id, (json.dumps(doc, indent=1) + "\n").encode())


def _describe(h: Held) -> str:
    paths = [p for p, _, _ in h.files]
    what = paths[0] if len(paths) == 1 else f"{Checkpoint(h.series, h.step, tuple((p, 0, 0) for p in paths)).name} " \
                                           f"({len(paths)} files)"
    return f"{what}, {human_bytes(h.size)}"


# ---- the mirror of a running attempt ----

class _Stopped(Exception):
    """stop() was called while a transfer went on. Private control flow."""


class _NoRoom(Exception):
    """The files a fetch is about to send do not fit here. Private control flow."""


class Mirror:
    """Brings rank 0's newest complete checkpoints back while the run goes on (``start``/``stop``).

    ``warn(line)`` gets each problem once (the run goes on whatever it says). A local run (``up
    local``) writes its checkpoints on this machine already: nothing to do."""

    def __init__(self, fleet: Fleet, plan: LaunchPlan, store: RunStore, *,
                 warn: Callable[[str], None] = lambda line: None, interval_s: float | None = None) -> None:
        self.fleet, self.plan, self.store = fleet, plan, store
        self.warn = warn
        problem = None
        if interval_s is None:
            interval_s, problem = interval_from(os.environ)
        self.interval_s = interval_s
        self.globs = checkpoint_globs(plan)
        self.node = next((n for n in plan.nodes if n.node_rank == 0), None)
        self.fetched = 0  # checkpoints brought back so far
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._said: set[str] = set()
        self._failing: str | None = None  # the last look's problem, said when the next look has it too
        self._held: dict[str, Held] = {}
        self._replaced: list[Held] = []  # held once, replaced since: their local copies go once the node's do
        self._before: dict[str, tuple[int, int]] | None = None  # the previous look's listing
        if problem and self.active:
            self._say(problem)

    @property
    def active(self) -> bool:
        return not self.plan.local and self.node is not None and self.interval_s > 0

    def start(self) -> None:
        if not self.active or self._thread is not None:
            return
        try:
            self._held = {h.series: h for h in read_index(self.store, self.plan.run_id)}  # an earlier attempt's
        except MirrorError as e:
            self._say(f"mirror: {e.message}; starting a new one")
        self._thread = threading.Thread(target=self._loop, name="mirror", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the mirror (a transfer under way is cut off: the end-of-run collect fetches the file)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(STOP_WAIT_S)

    def _say(self, line: str) -> None:
        if line not in self._said and not self._stop.is_set():
            self._said.add(line)
            try:
                self.warn(line)
            except Exception:  # noqa: BLE001 - a closed terminal must not end the mirror or the run
                pass

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.look()
                self._failing = None
            except _Stopped:
                return
            except Exception as e:  # noqa: BLE001 - never the run's outcome: said once, tried again
                why = str(e) if isinstance(e, ClusterDDPError) else f"{type(e).__name__}: {e}"
                if self._failing == why:  # twice in a row: not a passing hiccup (nor a node the run is losing)
                    self._say(f"mirror: the checkpoints of {self.host} are not brought back: {why} "
                              f"(the run goes on; tried again every {self.interval_s:g}s)")
                self._failing = why

    @property
    def host(self) -> str:
        assert self.node is not None
        return self.node.host.name

    def last_look(self) -> None:
        """One look now, at the end of an attempt (its job has ended: what it last wrote is whole),
        with what the mirror holds read back; a problem is said, never raised."""
        if self.node is None or self.plan.local:
            return
        try:
            self._held = {h.series: h for h in read_index(self.store, self.plan.run_id)}
            self.look()
        except Exception as e:  # noqa: BLE001 - the next attempt starts from what the mirror holds
            why = str(e) if isinstance(e, ClusterDDPError) else f"{type(e).__name__}: {e}"
            self._say(f"mirror: the last checkpoint of {self.host} was not brought back: {why}")

    def look(self) -> list[Held]:
        """One look at rank 0's checkpoints; fetch each complete one not held yet. What it fetched."""
        assert self.node is not None
        t = self.fleet.transport(self.node.host)
        listing = self._list(t)
        before, self._before = self._before, listing
        got = []
        for series in ranked(listing, self.globs, before or {}).values():
            # the newest first; one that cannot be copied whole (a file its writer keeps rewriting) gives way
            # to the next newest of its series, down to the one already held
            for chk in series:
                held = self._held.get(chk.series)
                if held is not None and (held.same(chk, self.host) or held.step > chk.step):
                    break
                if len(chk.files) > MAX_FILES:
                    self._say(f"mirror: {chk.name} on {self.host} has {len(chk.files)} files, more than the "
                              f"{MAX_FILES} a checkpoint may have: not brought back")
                    break
                free = shutil.disk_usage(self.store.run_dir(self.plan.run_id)).free
                if chk.size + DISK_MARGIN > free:
                    self._say(f"mirror: {chk.name} on {self.host} ({human_bytes(chk.size)}) is not brought back: "
                              f"{human_bytes(free)} free here, and {human_bytes(DISK_MARGIN)} is kept free")
                    break
                new = self._fetch(t, chk)
                if new is not None:
                    got.append(new)
                    _write_index(self.store, self.plan.run_id, self._held.values())
                    break
        if got:
            self._prune(listing)
        return got

    def _incoming(self, rel: str) -> Path:
        """Where a fetched file waits until its whole checkpoint has come and been checked."""
        base = self.store.run_dir(self.plan.run_id) / INCOMING / self.host
        p = (base / rel).resolve()
        if base.resolve() not in p.parents:
            raise ValueError(f"refusing a path outside the mirror's folder: {rel!r}")
        return p

    def _exchange(self, t: Transport, request: dict, timeout: float) -> Receiver:
        assert self.node is not None
        host, run_id = self.host, self.plan.run_id
        if request.get("paths"):  # a fetch: into mirror.incoming, and only what fits here
            def room(total: int) -> None:
                free = shutil.disk_usage(self.store.run_dir(run_id)).free
                if total + DISK_MARGIN > free:
                    raise _NoRoom(f"{human_bytes(total)} to fetch, {human_bytes(free)} free here, and "
                                  f"{human_bytes(DISK_MARGIN)} is kept free")
            rx = Receiver(self._incoming, on_total=room, request=request)
        else:
            rx = Receiver(self.store.artifact_paths(run_id, host), request=request)

        def feed(chunk: bytes) -> None:
            if self._stop.is_set():
                raise _Stopped()
            rx.feed(chunk)
        err = Tail()
        why = None
        try:
            code = t.stream(ssh_plan.collect_command(self.node), feed, timeout=timeout, stderr_to=err,
                            stdin=json.dumps(request).encode())
            if code != 0:
                lines = err.decode("utf-8", "replace").strip().splitlines()
                why = f"the node's collect program failed: {lines[-1][:300] if lines else f'exit {code}'}"
        except StreamError as e:
            why = f"its answer was refused: {e}"
        except (_Stopped, _NoRoom):
            rx.discard()
            raise
        finally:
            rx.finish(why)
        if why is not None:
            raise HostError(host, why)
        return rx

    def _list(self, t: Transport) -> dict[str, tuple[int, int]]:
        rx = self._exchange(t, {"globs": list(self.globs), "have": {}, "list": True, "written": True},
                            LIST_TIMEOUT_S)
        if rx.unmatched is None:  # the list did not come whole: a part of it could pass for a whole checkpoint
            raise HostError(self.host, "its list of checkpoint files was cut short: " + "; ".join(rx.errors)[:300])
        if rx.errors:
            self._say(f"mirror: {self.host}: " + "; ".join(rx.errors)[:500])
        return rx.listing

    def _fetch(self, t: Transport, chk: Checkpoint) -> Held | None:
        """Bring ``chk``'s files back; the checkpoint held, or None when they were not all taken whole.

        A consistent copy: every file unchanged (inode, size, time) from before its read to after it,
        and modified at least QUIET_S before it (its writer is not just pausing), and whole for its
        format (:func:`whole_problem`); a file that keeps changing is fetched again, up to FETCH_TRIES
        times. The files wait in ``mirror.incoming`` and replace the held copies only once all of them
        are whole; what is held is what came: its size, sha256 and time as the node sent them (a
        checkpoint rewritten since the look is kept as the newer copy, never with the look's size)."""
        paths = [p for p, _, _ in chk.files]
        request = {"paths": paths, "have": {}, "mtimes": True, "quiet": int(QUIET_S * 1e9)}
        for n in range(FETCH_TRIES):
            if n and self._stop.wait(QUIET_S):
                raise _Stopped()
            try:
                rx = self._exchange(t, request, FETCH_TIMEOUT_S)
            except _NoRoom as e:
                self._say(f"mirror: {chk.name} on {self.host} is not brought back: {e}")
                return None
            if rx.missing:
                p, why = rx.missing[0]
                self._say(f"mirror: {chk.name} on {self.host} is not brought back: {p}: {why}")
                self._clear_incoming()
                return None
            if set(rx.fetched) == set(paths):
                problems = [(p, w) for p in paths if (w := whole_problem(self._incoming(p))) is not None]
                if not problems:
                    break
            self._clear_incoming()
        else:
            return None  # kept changing (or cut off while written): the next look tries again
        files = []
        for p in paths:
            local = self.store.artifact_path(self.plan.run_id, self.host, p)
            local.parent.mkdir(parents=True, exist_ok=True)
            os.replace(self._incoming(p), local)
            files.append((p, rx.listing[p][0], rx.digests[p]))
        self._clear_incoming()
        held = Held(chk.series, chk.step, self.host, utcnow(), tuple(files), tuple(rx.listing[p][1] for p in paths))
        old = self._held.get(chk.series)
        self._held[chk.series] = held
        if old is not None:
            self._replaced.append(old)
        self.fetched += 1
        return held

    def _clear_incoming(self) -> None:
        shutil.rmtree(self.store.run_dir(self.plan.run_id) / INCOMING, ignore_errors=True)

    def _prune(self, listing: Mapping[str, object]) -> None:
        """Remove the local copies of checkpoints replaced in the mirror that the node no longer has
        (it keeps its own last few): the mirror's disk use stays that of one checkpoint of each series."""
        keep = {(h.host, p) for h in self._held.values() for p, _, _ in h.files}
        still: list[Held] = []
        for old in self._replaced:
            if old.host != self.host:  # another attempt's node: its copies stay (nothing says it lost them)
                continue
            if any(p in listing for p, _, _ in old.files):
                still.append(old)
                continue
            for p, _, _ in old.files:
                if (old.host, p) not in keep:
                    try:
                        self.store.artifact_path(self.plan.run_id, old.host, p).unlink(missing_ok=True)
                    except (OSError, ValueError):
                        pass
        self._replaced = still


def unprotected(plan: LaunchPlan) -> str | None:
    """The line a ``--detach``ed run says when it asked for restarts: nothing mirrors its checkpoints
    while no launcher watches it (None for a run that did not ask, or a local one)."""
    if plan.local or (plan.spec.max_restarts <= 0 and not getattr(plan.inventory, "spares", ())):
        return None
    rank0 = next((n.host.name for n in plan.nodes if n.node_rank == 0), "rank 0's node")
    return (f"detached: nothing mirrors this run's checkpoints while no launcher watches it: they are on "
            f"{rank0}'s disk only, and lost with it (an attached `up` mirrors them: "
            f"docs/machine-dies.md, \"Checkpoints that survive any one machine\")")


# ---- a new attempt's rank 0 ----

def seed(fleet: Fleet, node: NodeLaunch, store: RunStore, run_id: str) -> str | None:
    """Put the newest mirrored checkpoint of each series on ``node`` (the same path under its run
    folder) before an attempt starts, each file written beside its place and renamed there only once
    its sha256 on the node is the mirror's (a file the node already has, with that sha256, is not sent
    again); a one-line description of what was sent, or None when nothing was mirrored.

    Raises :class:`~clusterddp.errors.HostError` when the node cannot be reached or does not take a
    file whole, :class:`~clusterddp.errors.MirrorError` when the copies here are damaged (mirror.json,
    or a file that no longer has its sha256)."""
    held = read_index(store, run_id)
    if not held:
        return None
    return _seed(fleet, node, store, run_id, held)


def put(t: Transport, node: NodeLaunch, rel: str, local: Path, digest: str, timeout: float, what: str) -> None:
    """Write the file ``local`` to ``rel`` under ``node``'s run folder with :func:`seed_command` (renamed
    into place there only once its sha256 is ``digest``): the one transfer of a checkpoint to a node, for
    a new attempt (the mirror's) and a resumed run (:mod:`clusterddp.resume`). HostError when the node
    does not take it whole."""
    res = t.run(seed_command(node, rel, digest), stdin=local, timeout=timeout)
    if res.exit_code != 0:
        raise _refused(node, f"cannot put {what} {rel} there", res)


def _refused(node: NodeLaunch, what: str, res: CommandResult) -> HostError:
    """``what`` failed on ``node``: the last line the node said, else its exit code."""
    detail = res.stderr.decode("utf-8", "replace").strip().splitlines()
    return HostError(node.host.name, what + (f": {detail[-1][:300]}" if detail else f" (exit {res.exit_code})"))


def _seed(fleet: Fleet, node: NodeLaunch, store: RunStore, run_id: str, held: list[Held]) -> str:
    t = fleet.transport(node.host)
    wanted = [(h, p, s, digest) for h in held for p, s, digest in h.files]
    res = t.run(seed_have_command(node, [p for _, p, _, _ in wanted]), timeout=600)
    if res.exit_code != 0:
        raise _refused(node, "cannot make its run folder for the mirrored checkpoints", res)
    have = res.stdout.decode("ascii", "replace").split("\n")
    sent = kept = 0
    for i, (h, p, s, digest) in enumerate(wanted):
        if i < len(have) and have[i].strip() == digest:
            kept += 1
            continue
        local = store.artifact_path(run_id, h.host, p)
        try:
            ok = local.stat().st_size == s and sha256_file(local) == digest
        except OSError:
            ok = False
        if not ok:
            raise MirrorError(f"the mirrored copy {local} ({h.host}'s {p}) is missing or no longer has the "
                              f"sha256 it was brought back with: not sent to {node.host.name}",
                              f"remove {store.mirror_index_path(run_id)} to start the attempt without it")
        put(t, node, p, local, digest, 600, "the mirrored checkpoint")
        sent += 1
    steps = [_describe(h) + f" from {h.host} at {h.at}" for h in held]
    how = "sha256 checked there" + (f"; {kept} file{'s' if kept > 1 else ''} already there" if kept else "")
    return (f"{node.host.name} seeded with the mirrored checkpoint{'s' if len(held) > 1 else ''} "
            f"{'; '.join(steps)} ({how})")


def seed_all(fleet: Fleet, nodes: Iterable[NodeLaunch], store: RunStore, run_id: str
             ) -> tuple[list[str], list[str]]:
    """Before a new attempt starts: every one of its ``nodes`` gets the newest mirrored checkpoint of
    each series at its path under the run folder, hosts that stay and hosts that come in alike (a file
    a staying host holds that differs, older or newer, is replaced: every rank resumes from the same
    point), all nodes at once. (lines to say, warnings): a node that could not be seeded is a warning
    naming it, as is a damaged mirror (then no node is seeded)."""
    try:
        held = read_index(store, run_id)
    except MirrorError as e:
        return [], [f"mirror: {e}; this attempt starts from what its hosts hold"]
    if not held:
        return [], []
    nodes = list(nodes)
    by = {n.host.name: n for n in nodes}
    done = fleet.each(lambda h, t: _seed(fleet, by[h.name], store, run_id, held), [n.host for n in nodes])
    said = [done.succeeded[n.host.name] for n in nodes if n.host.name in done.succeeded]
    warned = [f"mirror: the newest checkpoint was not sent to {name}: {e}; that host starts from what it holds"
              for name, e in done.failed.items()]
    return said, warned


def local_copies(store: RunStore, run_id: str) -> list[Path]:
    """Where the mirror's checkpoints are on this machine."""
    return [store.artifact_path(run_id, h.host, p) for h in read_index(store, run_id) for p, _, _ in h.files]


# ---- the node side of a seed (moved from plan.py) ----

SEED_NO_FOLDER, SEED_MISMATCH = 3, 4  # how a seed_command says it failed (exit codes)


def seed_command(node: NodeLaunch, rel: str, sha256: str) -> str:
    """Write standard input to ``<run folder>/<rel>`` on the node (a mirrored checkpoint, before an
    attempt starts: :func:`clusterddp.mirror.seed`): into a hidden temp file beside it, renamed into
    place only when its sha256 is ``sha256``, so a cut-off or damaged upload never leaves a file that
    looks like a checkpoint (the temp file is removed). Exits SEED_NO_FOLDER when the folder cannot be
    made or written, SEED_MISMATCH when the copy does not match. ``rel``: a normalised relative path
    (the mirror checks it); ``sha256``: 64 hex digits."""
    assert len(sha256) == 64 and all(c in "0123456789abcdef" for c in sha256), sha256
    folder, name = posixpath.split(rel)
    where = posixpath.join(node.run_dir, folder) if folder else node.run_dir
    tmp = q(posixpath.join(folder, "." + name)) + ".$$.seed"
    return (f"mkdir -p {qpath(where)} && cd {qpath(node.run_dir)} || exit {SEED_NO_FOLDER}; t={tmp}; "
            f"cat > \"$t\" || {{ rm -f \"$t\"; exit {SEED_NO_FOLDER}; }}; h=$(sha256sum < \"$t\"); "
            f"if [ \"${{h%% *}}\" = {sha256} ]; then "
            f"mv -f \"$t\" {q(rel)} || {{ rm -f \"$t\"; exit {SEED_NO_FOLDER}; }}; "
            f"else rm -f \"$t\"; echo \"the copy received has sha256 ${{h%% *}}, not the mirror's\" >&2; "
            f"exit {SEED_MISMATCH}; fi")


def seed_have_command(node: NodeLaunch, rels: Sequence[str]) -> str:
    """Print the sha256 of each of ``rels`` under the node's run folder, one line each in order (an
    empty line for a file it does not have), creating the run folder: what a node already holds of the
    mirrored checkpoints before they are sent (:func:`clusterddp.mirror.seed`)."""
    words = " ".join(q(r) for r in rels)
    return (f"mkdir -p {qpath(node.run_dir)} && cd {qpath(node.run_dir)} || exit {SEED_NO_FOLDER}; "
            f"for p in {words}; do h=; [ -f \"$p\" ] && [ ! -L \"$p\" ] && h=$(sha256sum < \"$p\" 2>/dev/null); "
            "echo \"${h%% *}\"; done")
