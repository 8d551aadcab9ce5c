"""The run store: the only writer of ``<runs-dir>/<run_id>/`` and ``<runs-dir>/runs.db``.

``run.json`` is the full record of a run (a :class:`~clusterddp.record.RunRecord`: enough to
reconnect to its nodes later without the inventory); ``runs.db`` (SQLite, WAL) indexes every run for
listing and is kept in step with each ``run.json``. Several launchers (a cron run and a person) may write at once.

Run records hold the ``-e`` values (tokens), so everything here is private to its owner whatever
the umask: the runs folder and run folders 0700, run.json, runs.db (and its -wal/-shm), logs and
lock files 0600. A runs folder that others could read (made by an older clusterddp) is made 0700
on the first write, with a warning. Listings only read: they work on a read-only runs folder.
A damaged, foreign or locked runs.db, or a runs folder that cannot be written, is a
:class:`StoreError` (exit 2) naming the file and what to do, raised before anything is started.
"""

from __future__ import annotations

import builtins
import json
import logging
import os
import secrets
import shutil
import sqlite3
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from contextlib import closing, contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from .errors import ClusterDDPError, FileRefused, RecordError, RunNotFound, StoreError, UsageError
from .files import lock_polled, make_folders, make_private, read_bounded, replacing, write_private
from .record import RUN_ID_RE, RunRecord

DB_TIMEOUT = 30.0      # seconds a write waits for another launcher's write to runs.db
LOCK_TIMEOUT = 60.0    # seconds `update` waits for another process's read-change-write of one run.json
MAX_RECORD_BYTES = 16 << 20  # a run.json is a few KiB; anything near this is not one
DIR_MODE, FILE_MODE = 0o700, 0o600
IN_USE = ".in-use.lock"  # in a run folder: who works on the run holds it (RunStore.hold)

# Printed on stderr by logging's last-resort handler (message only) unless the caller configures logging.
log = logging.getLogger("clusterddp")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, name TEXT, inventory TEXT, script TEXT, hosts TEXT,
  status TEXT NOT NULL, exit_code INTEGER, started_at TEXT, ended_at TEXT,
  failed_host TEXT, schedule TEXT, updated_at TEXT, resumed_from TEXT
)"""
# A cron run that found its previous run still going (flock held) starts nothing; it leaves a row here.
_SKIPS_SCHEMA = """
CREATE TABLE IF NOT EXISTS skips (
  schedule TEXT NOT NULL, at TEXT NOT NULL, holder TEXT, reason TEXT
)"""
_SKIP_COLUMNS = ("schedule", "at", "holder", "reason")
# What each firing of a schedule came to (clusterddp.schedule.fire): every outcome, the skips included;
# older runs.db files have their skips (all of them: the lock held) in the table above, read as such.
_FIRINGS_SCHEMA = """
CREATE TABLE IF NOT EXISTS firings (
  schedule TEXT NOT NULL, at TEXT NOT NULL, outcome TEXT NOT NULL, run_id TEXT, holder TEXT, reason TEXT
)"""
_FIRING_COLUMNS = ("schedule", "at", "outcome", "run_id", "holder", "reason")
LOCK_HELD = "skipped: lock held"  # the outcome of an older runs.db's skip
_COLUMNS = ("run_id", "name", "inventory", "script", "hosts", "status", "exit_code", "started_at",
            "ended_at", "failed_host", "schedule", "updated_at", "resumed_from")
# columns an older runs.db lacks: added on the next write (read as NULL until then)
_ADDED_LATER = {"schedule": "TEXT", "updated_at": "TEXT", "resumed_from": "TEXT"}


def new_run_id(now: datetime | None = None, token: str | None = None) -> str:
    """A run id that sorts by time and is safe as a folder name: ``20261129-181500-3f9a``."""
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%d-%H%M%S-") + (token or secrets.token_hex(2))


def utcnow(timespec: str = "seconds") -> str:
    """Now, in UTC, as ISO 8601; ``timespec`` as :meth:`datetime.isoformat` takes it. A run's
    ``started_at`` has milliseconds (:func:`clusterddp.backends.base.new_record`): runs started in
    one second are listed in the order they started, not by their ids' random ends."""
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


class RunStore:
    """Run folders and the run database under one runs directory.

    ``read_only``: for commands that only look (``logs`` on a runs folder it cannot write): the
    local log copies are left as they are instead of refreshed.
    """

    def __init__(self, runs_dir: str | Path, read_only: bool = False) -> None:
        self.root = Path(runs_dir).expanduser().absolute()
        self.read_only = read_only
        self._lock = threading.Lock()
        self._logs: dict[tuple[str, str], Any] = {}
        self._root_ready = False

    @property
    def db_path(self) -> Path:
        return self.root / "runs.db"

    # ---- the runs folder ----
    def _cannot_write(self, e: OSError, what: Path | None = None) -> StoreError:
        where = e.filename or what or self.root
        return StoreError(f"cannot write {where}: {e.strerror or e}",
                          f"make {self.root} writable, or pass another --runs-dir (or set CLUSTERDDP_RUNS_DIR); "
                          "`clusterddp runs` still lists a read-only one")

    def _prepare_root(self) -> None:
        """The runs folder, made private: created 0700, or tightened to 0700 (with a warning) when
        others could read it, since its run records hold the -e values."""
        if self._root_ready:
            return
        if self.read_only:
            raise StoreError(f"{self.root} was opened read-only", "pass a writable --runs-dir")
        try:
            make_folders(self.root.parent)  # any folder made above it: 0700 too, whatever the umask
            try:
                self.root.mkdir(mode=DIR_MODE)
                os.chmod(self.root, DIR_MODE)  # mkdir's mode is cut by the umask; 0700 whatever it is
            except FileExistsError:
                st = os.stat(self.root)
                if not stat.S_ISDIR(st.st_mode):
                    raise StoreError(f"{self.root} is not a folder", "pass a folder as --runs-dir") from None
                if stat.S_IMODE(st.st_mode) & 0o077 and st.st_uid == os.geteuid():
                    os.chmod(self.root, DIR_MODE)
                    if self.db_path.exists() or any(self.root.glob("*/run.json")):  # secrets were exposed: say so
                        log.warning("warning: %s was open to other users (mode %04o); made it 0700: its run "
                                    "records hold the -e values", self.root, stat.S_IMODE(st.st_mode))
        except OSError as e:
            raise self._cannot_write(e) from None
        self._root_ready = True

    def check_writable(self, run_id: str | None = None, index: bool = True) -> None:
        """Raise :class:`StoreError` now, before any work, if its outcome could not be recorded: the
        run's folder not writable or its record locked by a stuck update, or (``index``) runs.db
        damaged, foreign, locked or read-only. Without ``index``: only the run folder's files
        (what `collect` writes)."""
        if index:
            with closing(self._write_db()) as con:
                try:  # another writer stuck mid-write shows now, not after the work
                    con.execute("BEGIN IMMEDIATE")
                    con.execute("ROLLBACK")
                except sqlite3.Error as e:
                    raise self._db_error(e, writing=True) from None
        if run_id is not None:
            lock, path = self._open_lock(run_id)  # made if missing: the run folder takes files
            with lock:
                if index:  # taken and given back: a process stuck in an update of this run shows now
                    lock_polled(lock, time.monotonic() + LOCK_TIMEOUT, lambda: self._still_locked(path))

    def can_write(self, run_id: str) -> bool:
        """Whether this user can change files in the run's folder (its log copies)."""
        logs = self.run_dir(run_id) / "logs"
        return not self.read_only and os.access(logs if logs.is_dir() else logs.parent, os.W_OK)

    # ---- database ----
    def _db_error(self, e: sqlite3.Error, writing: bool) -> StoreError:
        path = self.db_path
        name = getattr(e, "sqlite_errorname", "") or ""
        text = str(e)
        if name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")) or "locked" in text:
            return StoreError(f"{path}: still locked by another process after {DB_TIMEOUT:g}s ({text})",
                              f"wait for the other clusterddp command to end and try again; `fuser {path}` names it")
        if writing and (name.startswith(("SQLITE_READONLY", "SQLITE_CANTOPEN", "SQLITE_PERM"))
                        or "readonly" in text or "unable to open" in text):
            return StoreError(f"cannot write {path}: {text}",
                              f"make {self.root} and {path.name} writable, or pass another --runs-dir "
                              "(or set CLUSTERDDP_RUNS_DIR)")
        return StoreError(f"{path}: not a usable clusterddp run index: {text}",
                          f"move it aside (mv {path} {path}.damaged); the next `clusterddp up` rebuilds it "
                          "from the run folders, and `clusterddp runs` lists them meanwhile")

    def _wrong_schema(self, what: str) -> StoreError:
        return self._db_error(sqlite3.DatabaseError(what), writing=False)

    def _check_schema(self, con: sqlite3.Connection, writable: bool) -> dict[str, list[str]]:
        """The clusterddp tables present and their columns; refuses another program's database."""
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if tables and not tables & {"runs", "skips", "firings"}:
            raise self._wrong_schema(f"it holds tables {', '.join(sorted(tables)[:5])}, not clusterddp's runs")
        cols = {t: [r[1] for r in con.execute(f"PRAGMA table_info({t})")] for t in ("runs", "skips", "firings")
                if t in tables}
        for table, want in (("runs", set(_COLUMNS) - set(_ADDED_LATER)), ("skips", set(_SKIP_COLUMNS)),
                            ("firings", set(_FIRING_COLUMNS))):
            missing = sorted(want - set(cols.get(table, want)))
            if missing:
                raise self._wrong_schema(f"its table {table} has no column {', '.join(missing)}")
        if writable:
            con.execute(_SCHEMA)
            con.execute(_SKIPS_SCHEMA)
            con.execute(_FIRINGS_SCHEMA)
            have = cols.get("runs", list(_COLUMNS))
            for col, tp in _ADDED_LATER.items():
                if col not in have:
                    con.execute(f"ALTER TABLE runs ADD COLUMN {col} {tp}")
            cols = {"runs": list(_COLUMNS), "skips": list(_SKIP_COLUMNS), "firings": list(_FIRING_COLUMNS)}
        return cols

    def _write_db(self) -> sqlite3.Connection:
        """runs.db open for writing, its schema checked (and created or brought up to date).

        A db made just now is filled from the run folders' records, so moving a damaged one aside
        loses no run (skips excepted)."""
        self._prepare_root()
        path = self.db_path
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, FILE_MODE)
        except OSError as e:
            raise self._cannot_write(e, path) from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise self._wrong_schema("not a regular file")
            fresh = st.st_size == 0
            make_private(fd, st)
        finally:
            os.close(fd)
        for side in ("-wal", "-shm"):  # SQLite gives them runs.db's mode when it makes them; fix older ones
            try:
                make_private(str(path) + side)
            except OSError:
                pass
        con = None
        try:
            con = sqlite3.connect(path, timeout=DB_TIMEOUT, isolation_level=None)
            con.execute(f"PRAGMA busy_timeout = {int(DB_TIMEOUT * 1000)}")
            _into_wal(con)
            # WAL + NORMAL cannot corrupt the index; a power cut may lose its last row, as it may the
            # run.json rename beside it (neither is fsynced: the index can be rebuilt from the folders)
            con.execute("PRAGMA synchronous = NORMAL")
            self._check_schema(con, writable=True)
            if fresh:
                self._rebuild(con)
        except sqlite3.Error as e:
            if con is not None:
                con.close()
            raise self._db_error(e, writing=True) from None
        except BaseException:
            if con is not None:
                con.close()
            raise
        return con

    def _read_db(self) -> tuple[sqlite3.Connection, dict[str, list[str]]] | None:
        """runs.db open for reading only, or None when there is no index to read. Nothing is written
        (in a writable folder SQLite may leave its empty -wal/-shm files, 0600, for the next writer to
        remove). A runs folder we cannot write is read in SQLite's ``immutable`` mode: a WAL database
        needs its -shm file, which only a writer can make."""
        path = self.db_path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreError(f"cannot read {path}: {e.strerror or e}", f"make {self.root} readable") from None
        if not stat.S_ISREG(st.st_mode):
            raise self._wrong_schema("not a regular file")
        if st.st_size == 0:
            return None
        if not os.access(path, os.R_OK):
            raise StoreError(f"cannot read {path}: permission denied", f"make {path} readable by this user")
        uri = "file:" + urllib.parse.quote(str(path))
        for mode in ("mode=ro", "immutable=1"):
            con = sqlite3.connect(f"{uri}?{mode}", uri=True, timeout=DB_TIMEOUT, isolation_level=None)
            try:
                con.execute(f"PRAGMA busy_timeout = {int(DB_TIMEOUT * 1000)}")
                cols = self._check_schema(con, writable=False)
            except BaseException as e:
                con.close()
                if not isinstance(e, sqlite3.Error):
                    raise
                if mode == "mode=ro" and (getattr(e, "sqlite_errorname", "").startswith("SQLITE_CANTOPEN")
                                          or "unable to open" in str(e)):
                    continue
                raise self._db_error(e, writing=False) from None
            if "runs" not in cols:
                con.close()
                return None
            return con, cols
        return None  # not reached: immutable mode opens any readable file

    def _select(self, sql_tail: str, args: tuple = ()) -> list[dict] | None:
        """Rows of the runs table (``None``: no index to read), columns missing from an old db as None."""
        opened = self._read_db()
        if opened is None:
            return None
        con, cols = opened
        have = set(cols["runs"])
        select = ",".join(c if c in have else f"NULL AS {c}" for c in _COLUMNS)
        try:
            with closing(con):
                rows = con.execute(f"SELECT {select} FROM runs {sql_tail}", args).fetchall()
        except sqlite3.Error as e:
            raise self._db_error(e, writing=False) from None
        return [_row(dict(zip(_COLUMNS, r, strict=True))) for r in rows]

    def _index(self, con: sqlite3.Connection, rec: dict, verb: str = "INSERT OR REPLACE") -> None:
        row = {k: rec.get(k) for k in _COLUMNS}
        row["hosts"] = ",".join(n["host"] for n in rec["nodes"])
        row["resumed_from"] = (rec.get("resumed_from") or {}).get("run")  # the run id: `status` shows the rest
        con.execute(f"{verb} INTO runs ({','.join(_COLUMNS)}) "
                    f"VALUES ({','.join('?' * len(_COLUMNS))})", [row[k] for k in _COLUMNS])

    def _rebuild(self, con: sqlite3.Connection) -> None:
        """Index every run folder's record. Under the write lock, since every writer replaces a
        run.json only while holding it (:meth:`_commit`), the records cannot change meanwhile; rows
        already there were written by such a writer and are kept."""
        con.execute("BEGIN IMMEDIATE")
        try:
            for rec, _ in self._scan():
                if rec is not None:
                    self._index(con, rec.to_json(), "INSERT OR IGNORE")
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise

    def _scan(self) -> Iterator[tuple[RunRecord | None, str | None]]:
        """Every run folder's record, read from its run.json: (record, None) or (None, what is wrong)."""
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError:
            return
        except OSError as e:
            raise StoreError(f"cannot read {self.root}: {e.strerror or e}", f"make {self.root} readable") from None
        for name in names:
            if name.startswith(".") or not os.path.lexists(self.record_path(name)):
                continue
            try:
                yield self.load(name), None
            except UsageError as e:
                yield None, str(e).partition("\n")[0]

    # ---- run folders ----
    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id

    def record_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "run.json"

    def create(self, record: RunRecord) -> RunRecord:
        """Create the run folder, its first ``run.json`` and its row in runs.db, as one step.

        runs.db is opened (and checked) first, so a damaged or locked index or a read-only runs
        folder fails here, before any job starts; a failure half-way removes the run folder, so
        no run is left recorded as running that never ran."""
        d = self.run_dir(record.run_id)
        try:
            self._prepare_root()
        except StoreError as e:
            raise StoreError(f"cannot create the run folder {d}: {e.message}", e.hint) from None
        con = self._write_db()
        with closing(con):
            try:
                d.mkdir(mode=DIR_MODE)
            except OSError as e:
                raise StoreError(f"cannot create the run folder {d}: {e.strerror or e}",
                                 "pass a writable --runs-dir (or set CLUSTERDDP_RUNS_DIR)") from None
            try:
                os.chmod(d, DIR_MODE)
                (d / "logs").mkdir(mode=DIR_MODE)
                os.chmod(d / "logs", DIR_MODE)
                record = self._commit(con, record)
            except BaseException as e:
                shutil.rmtree(d, ignore_errors=True)
                if isinstance(e, sqlite3.Error):
                    raise self._db_error(e, writing=True) from None
                if isinstance(e, OSError):
                    raise self._cannot_write(e, d) from None
                raise
        return record

    def _commit(self, con: sqlite3.Connection, record: RunRecord) -> RunRecord:
        """Index ``record`` and replace its run.json in one database transaction: when the index
        cannot be written, run.json is left as it was. Returns the record as written: stamped with
        the time of this write (its ``updated_at``: what a running run's record says is as of then)."""
        record = replace(record, updated_at=utcnow())
        rec = record.to_json()
        path = self.record_path(record.run_id)
        RunRecord.from_json(rec, str(path))  # never write a record that could not be read back
        text = (json.dumps(rec, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
        con.execute("BEGIN IMMEDIATE")
        try:
            self._index(con, rec)
            write_private(path, text, fsync=False)  # rebuilt from the folders if lost: see _write_db
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        return record

    def hold(self, run_id: str, exclusive: bool = False) -> BinaryIO | None:
        """The run's in-use lock (``.in-use.lock`` in its folder), taken without waiting: shared by the
        commands that work on a run that has ended (an `up` from its record's first write to its exit, which
        takes in its end-of-run collect; a `collect`), ``exclusive`` by `prune` before it removes anything,
        so that neither pulls the run's folders from under the other. Returns the open lock file (closing it
        lets go), or None when another process holds it the other way."""
        import fcntl
        path = self.run_dir(run_id) / IN_USE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError as e:
            raise self._cannot_write(e, path) from None
        f = os.fdopen(fd, "r+b")
        try:
            fcntl.flock(f, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            return None
        except OSError as e:
            f.close()
            raise self._cannot_write(e, path) from None
        return f

    def _open_lock(self, run_id: str) -> tuple[Any, Path]:
        path = self.run_dir(run_id) / ".run.json.lock"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
        except OSError as e:
            raise self._cannot_write(e, path) from None
        return os.fdopen(fd, "r+b"), path

    def update(self, run_id: str, change: Callable[[RunRecord], RunRecord]) -> RunRecord:
        """Replace run.json with ``change(record)`` and re-index; return the new record.

        Read-change-write runs under a file lock, so an attached `up` and a `stop` or `status`
        in another process never lose each other's update: ``change`` gets the record as it is
        on disk now, and should decide from that (it may run while another process waits).
        The wait is bounded by :data:`LOCK_TIMEOUT`; then a :class:`StoreError` names the lock file.
        """
        self.load(run_id)  # a clear RunNotFound (or RecordError) before any lock file is made
        deadline = time.monotonic() + LOCK_TIMEOUT
        with closing(self._write_db()) as con:
            lock, lock_path = self._open_lock(run_id)
            with lock:
                if not self._lock.acquire(timeout=LOCK_TIMEOUT):
                    raise self._still_locked(lock_path)
                try:
                    lock_polled(lock, deadline, lambda: self._still_locked(lock_path))
                    new = change(self.load(run_id))
                    if new.run_id != run_id:
                        raise ValueError(f"an update of run {run_id} returned run {new.run_id}")
                    try:
                        return self._commit(con, new)
                    except sqlite3.Error as e:
                        raise self._db_error(e, writing=True) from None
                    except OSError as e:
                        raise self._cannot_write(e) from None
                finally:
                    self._lock.release()

    def remove(self, run_id: str, may_remove: Callable[[RunRecord], bool]) -> bool:
        """Delete run ``run_id``: its row in runs.db and its folder, if ``may_remove(record)`` says so
        (asked under the run's lock, with the record as it is now: a `status` or `stop` in another
        process cannot change it meanwhile). Returns whether it was removed.

        The folder is first renamed to a hidden name (never listed, never resolved), then its row is
        deleted; only then is it deleted. A failure before that leaves the run as it was."""
        d = self.run_dir(run_id)
        if d.is_symlink():
            raise StoreError(f"{d} is a symlink, not a run folder", "remove it by hand if it is not needed")
        self.load(run_id)
        with closing(self._write_db()) as con:
            lock, lock_path = self._open_lock(run_id)
            with lock:
                lock_polled(lock, time.monotonic() + LOCK_TIMEOUT, lambda: self._still_locked(lock_path))
                if not may_remove(self.load(run_id)):
                    return False
                gone = self.root / f".{run_id}.removing-{secrets.token_hex(4)}"
                try:
                    os.rename(d, gone)
                except OSError as e:
                    raise self._cannot_write(e, d) from None
                try:
                    con.execute("BEGIN IMMEDIATE")
                    con.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
                    con.execute("COMMIT")
                except BaseException as e:
                    if con.in_transaction:
                        con.execute("ROLLBACK")
                    os.rename(gone, d)
                    if isinstance(e, sqlite3.Error):
                        raise self._db_error(e, writing=True) from None
                    raise
        left: list[str] = []
        shutil.rmtree(gone, onerror=lambda fn, path, e: left.append(f"{path}: {e[1]}"))
        if left:
            raise StoreError(f"run {run_id} is no longer listed, but {len(left)} item(s) of its folder could not "
                             f"be deleted (first: {left[0]})", f"delete {gone} by hand")
        return True

    def _still_locked(self, path: Path) -> StoreError:
        return StoreError(f"{path}: still locked by another process after {LOCK_TIMEOUT:g}s",
                          f"another clusterddp command is updating this run; wait for it to end and try again "
                          f"(`fuser {path}` names it)")

    def load(self, run_id: str) -> RunRecord:
        """The run's record; :class:`RunNotFound` if there is none, :class:`RecordError` if it is damaged."""
        path = self.record_path(run_id)
        try:  # non-blocking, regular files only, bounded: a FIFO planted as run.json must not hang the reader
            raw, _ = read_bounded(path, MAX_RECORD_BYTES)
        except FileRefused as e:
            if e.reason == "missing":
                raise RunNotFound(f"no run {run_id!r} in {self.root}",
                                  "list runs with `clusterddp runs`, or pass --runs-dir") from None
            if e.reason == "unreadable":
                raise RecordError(str(path), None, e.problem, "make it readable by this user") from None
            if e.reason == "too_large":
                raise RecordError(str(path), None, f"too large for a run record ({e.problem})") from None
            raise RecordError(str(path), None, e.problem) from None
        try:
            data = json.loads(raw.decode("utf-8"))
        except UnicodeDecodeError as e:
            raise RecordError(str(path), None, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise RecordError(str(path), None, f"not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
        except (ValueError, RecursionError) as e:  # a 5,000-digit number; nesting deeper than Python recurses
            raise RecordError(str(path), None, f"not a run record: {str(e)[:100] or type(e).__name__}") from None
        rec = RunRecord.from_json(data, str(path))
        if rec.run_id != run_id:
            raise RecordError(str(path), "run_id", f"{rec.run_id!r} is not the name of its folder {run_id!r}")
        return rec

    def resolve(self, given: str) -> str:
        """The run id that ``given`` names uniquely: the whole id, or a unique prefix or suffix of it. Every
        id starts with its date, so the random part at its end (``3f9a`` of ``20261129-181500-3f9a``) is
        the short way to name a run; an id that both starts and ends with ``given`` is one match."""
        # Only what a run id may be (record.RUN_ID_RE, a file name): a 64 KiB prefix took seconds to glob
        if len(given) > 255 or not RUN_ID_RE.fullmatch(given) or given in (".", ".."):
            raise RunNotFound(f"{given!r} is not a run id", "list runs with `clusterddp runs`")
        try:
            # any run.json, even one that is not a file: `load` then says what is wrong with it
            if os.path.lexists(self.record_path(given)):
                return given
            word = glob_escape(given)
            ids = sorted({p.name for pattern in (f"{word}*", f"*{word}") for p in self.root.glob(pattern)
                          if not p.name.startswith(".") and os.path.lexists(p / "run.json")}
                         ) if self.root.is_dir() else []
        except OSError as e:
            raise StoreError(f"cannot read {self.root}: {e.strerror or e}", f"make {self.root} readable") from None
        if not ids:
            raise RunNotFound(f"no run matches {given!r} in {self.root} (as a run id, or its start or end)",
                              "list runs with `clusterddp runs`, or pass --runs-dir")
        if len(ids) > 1:
            raise RunNotFound(f"{given!r} matches {len(ids)} runs: {', '.join(ids[:5])}"
                              + (" ..." if len(ids) > 5 else ""), "give more of the run id")
        return ids[0]

    def list(self) -> list[dict]:
        """Every run, newest first: from runs.db (less the rows whose run folder is gone), or, where
        there is none, from the run folders (damaged records are skipped with a warning)."""
        rows = self._select("ORDER BY started_at DESC, run_id DESC")
        if rows is not None:
            # a run folder deleted by hand leaves its row: the run is gone, so is it from the listing
            # (prune and keep_runs read this list, and would stop at a run they cannot load)
            return [r for r in rows if os.path.lexists(self.record_path(str(r["run_id"])))]
        rows = []
        for rec, problem in self._scan():
            if rec is None:
                log.warning("warning: skipped %s", problem)
            else:
                rows.append(_record_row(rec))
        return sorted(rows, key=lambda r: (r["started_at"] or "", r["run_id"]), reverse=True)

    # ---- scheduled runs ----
    def last_run(self, schedule: str) -> dict | None:
        """The newest run started by ``schedule``, or None."""
        rows = self._select("WHERE schedule = ? ORDER BY started_at DESC, run_id DESC LIMIT 1", (schedule,))
        if rows is None:
            rows = [r for r in self.list() if r["schedule"] == schedule]
        return rows[0] if rows else None

    def record_firing(self, schedule: str, outcome: str, at: str | None = None, *, run_id: str | None = None,
                      holder: str | None = None, reason: str | None = None) -> dict:
        """Record what a firing of ``schedule`` (at ``at``, default now) came to: ``outcome`` (a run's
        status, or a skip: clusterddp.schedule.fire says which), the run it started (``run_id``: only
        a recorded one), the run that held its lock (``holder``) and why, in words (``reason``)."""
        row = {"schedule": schedule, "at": at or utcnow(), "outcome": outcome, "run_id": run_id, "holder": holder,
               "reason": reason}
        with closing(self._write_db()) as con:
            try:
                con.execute(f"INSERT INTO firings ({','.join(_FIRING_COLUMNS)}) VALUES (?, ?, ?, ?, ?, ?)",
                            [row[k] for k in _FIRING_COLUMNS])
            except sqlite3.Error as e:
                raise self._db_error(e, writing=True) from None
        return row

    def firings(self, schedule: str, limit: int | None = None) -> builtins.list[dict]:  # `list`: RunStore.list
        """The recorded firings of ``schedule``, newest first (at most ``limit``); the skips an older
        clusterddp recorded are among them, as :data:`LOCK_HELD`."""
        opened = self._read_db()
        if opened is None:
            return []
        con, tables = opened
        out: builtins.list[dict] = []
        try:
            with closing(con):
                if "firings" in tables:
                    cur = con.execute(f"SELECT {','.join(_FIRING_COLUMNS)} FROM firings WHERE schedule = ? "
                                      "ORDER BY at DESC, rowid DESC",
                                      (schedule,))
                    out += [dict(zip(_FIRING_COLUMNS, r, strict=True)) for r in cur]
                if "skips" in tables:
                    cur = con.execute(f"SELECT {','.join(_SKIP_COLUMNS)} FROM skips WHERE schedule = ? "
                                      "ORDER BY at DESC, rowid DESC", (schedule,))
                    out += [{**dict(zip(_SKIP_COLUMNS, r, strict=True)), "outcome": LOCK_HELD, "run_id": None}
                            for r in cur]
        except sqlite3.Error as e:
            raise self._db_error(e, writing=False) from None
        out.sort(key=lambda f: when_of(f["at"]), reverse=True)  # stable: rows of one second keep their order
        return out[:limit] if limit is not None else out

    def skips(self, schedule: str) -> builtins.list[dict]:
        """The firings of ``schedule`` that started nothing (a skip, whatever its reason), newest first."""
        return [f for f in self.firings(schedule) if str(f["outcome"]).startswith("skipped")]

    # ---- logs and artifacts ----
    def log_path(self, run_id: str, host: str) -> Path:
        return self.run_dir(run_id) / "logs" / f"{host}.log"

    def append_log(self, run_id: str, host: str, data: bytes) -> None:
        key = (run_id, host)
        f = self._logs.get(key)
        if f is None:
            path = self.log_path(run_id, host)
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
            except OSError as e:
                raise self._cannot_write(e, path) from None
            make_private(fd)
            f = self._logs[key] = os.fdopen(fd, "ab")
        f.write(data)
        f.flush()

    def set_logs_aside(self, run_id: str, attempt: int, hosts: Iterable[str]) -> None:
        """Before a run's next attempt: move ``hosts``' local logs of attempt ``attempt`` to
        ``logs/attempt-<attempt>/<host>.log`` (0700 folder), so the next attempt's copies, which the
        end of the run replaces with the nodes' own, never overwrite them. A log that is not there is
        no error."""
        self.close_logs()
        folder = self.run_dir(run_id) / "logs" / f"attempt-{int(attempt)}"
        try:
            folder.mkdir(mode=DIR_MODE, exist_ok=True)
            os.chmod(folder, DIR_MODE)
            for host in hosts:
                try:
                    os.replace(self.log_path(run_id, host), folder / f"{host}.log")
                except FileNotFoundError:
                    pass
        except OSError as e:
            raise self._cannot_write(e, folder) from None

    def note(self, run_id: str, name: str, line: str) -> None:
        """Append one line to ``<run>/<name>`` (0600), e.g. notify.log: what a notification could not do."""
        assert "/" not in name and name.endswith(".log"), name
        path = self.run_dir(run_id) / name
        try:
            fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, FILE_MODE)
        except OSError as e:
            raise self._cannot_write(e, path) from None
        try:
            make_private(fd)
            os.write(fd, f"{utcnow()} {line}\n".encode("utf-8", "replace"))
        finally:
            os.close(fd)

    def copy_log(self, run_id: str, host: str, src: Path) -> None:
        """Replace the local log with the file ``src`` (a log on a shared folder), copied in chunks.
        Raises FileNotFoundError when there is none; a read-only store keeps the old copy."""
        with open(src, "rb") as f:
            if self.read_only:
                return
            with self.log_writer(run_id, host) as dst:
                shutil.copyfileobj(f, dst, 1 << 20)

    @contextmanager
    def log_writer(self, run_id: str, host: str) -> Iterator[BinaryIO]:
        """A private temp file beside the local log, written as the node's copy arrives (a log is
        never held whole in memory) and renamed over the log when the block ends without an
        exception; removed otherwise, so the old copy stays. Writers at once each leave a whole copy."""
        path = self.log_path(run_id, host)
        try:
            path.parent.mkdir(mode=DIR_MODE, exist_ok=True)
            with replacing(path, fsync=False) as f:  # a log copy is fetched again if lost
                yield f
        except OSError as e:
            raise self._cannot_write(e, path) from None

    def close_logs(self) -> None:
        for f in self._logs.values():
            f.close()
        self._logs.clear()

    def write_evidence(self, run_id: str, kind: str, host: str, rel: str, data: bytes) -> Path:
        """``<run>/<kind>/<host>/<rel>``, 0600 in 0700 folders: what a node left at failure (``errors``: its
        ranks' error files; ``forensics``: nvidia-smi, kernel lines; ``stacks``: each call's dumps, by time;
        ``where``: the rank sampler's samples, ``clusterddp.stragglers``).
        ``rel`` is made here, never by a node."""
        assert kind in ("errors", "forensics", "stacks", "flight", "where") and ".." not in rel.split("/"), (kind, rel)
        base = self.run_dir(run_id)
        path = base / kind / host / rel
        try:
            for d in reversed((path.parent, *path.parent.parents)):
                if base in d.parents:
                    d.mkdir(mode=DIR_MODE, exist_ok=True)
            write_private(path, data, fsync=False)
        except OSError as e:
            raise self._cannot_write(e, path) from None
        return path

    def failure_of(self, run_id: str) -> dict | None:
        """The run's recorded ``failure`` (as run.json holds it, checked), or None: none, or an unreadable record."""
        try:
            rec = self.load(run_id)
        except ClusterDDPError:
            return None
        return rec.failure.to_json() if rec.failure else None

    def mirror_index_path(self, run_id: str) -> Path:
        """``<run>/mirror.json``: the checkpoints the mirror holds (clusterddp.mirror)."""
        return self.run_dir(run_id) / "mirror.json"

    def write_mirror_index(self, run_id: str, data: bytes) -> None:
        """Replace ``mirror.json`` atomically (0600, fsynced: a new attempt's checkpoint depends on it)."""
        path = self.mirror_index_path(run_id)
        try:
            write_private(path, data)
        except OSError as e:
            raise self._cannot_write(e, path) from None

    def artifacts_dir(self, run_id: str, host: str) -> Path:
        return (self.run_dir(run_id) / "artifacts" / host).resolve()

    def artifact_path(self, run_id: str, host: str, rel: str) -> Path:
        return self.artifact_paths(run_id, host)(rel)

    def artifact_paths(self, run_id: str, host: str) -> Callable[[str], Path]:
        """:meth:`artifact_path` for one host's files, its folder resolved once (a collect of many
        small files resolved it twice a file: a third of the receiver's CPU besides the writes)."""
        base = self.artifacts_dir(run_id, host)

        def path(rel: str) -> Path:
            p = (base / rel).resolve()
            if base not in p.parents:  # a remote name must never write outside the run folder
                raise ValueError(f"refusing artifact path outside the run folder: {rel!r}")
            return p
        return path


_NEVER = datetime.min.replace(tzinfo=timezone.utc)


def when_of(stamp: object) -> datetime:
    """A stored time (ISO 8601) to compare by; anything else (an index edited by hand) sorts last."""
    try:
        t = datetime.fromisoformat(stamp) if isinstance(stamp, str) else _NEVER
    except ValueError:
        return _NEVER
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _row(row: dict) -> dict:
    """A runs row as the CLI prints it: text columns as text, whatever a hand-edited db holds."""
    return {k: (v if v is None or (k == "exit_code" and isinstance(v, int)) or isinstance(v, str) else str(v))
            for k, v in row.items()}


def _record_row(rec: RunRecord) -> dict:
    data = rec.to_json()
    row = {k: data.get(k) for k in _COLUMNS}
    row["hosts"] = ",".join(rec.hosts)
    row["resumed_from"] = rec.resumed_from.run if rec.resumed_from else None
    return row


def glob_escape(s: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in s)


def _into_wal(con: sqlite3.Connection) -> None:
    """``PRAGMA journal_mode = WAL``, waiting like every other statement. Turning a fresh runs.db
    into WAL needs it to itself, and SQLite answers "database is locked" at once, without its busy
    handler, while another launcher opens the same fresh file: two first runs in a new runs folder
    (two schedules firing together) failed one of them."""
    deadline = time.monotonic() + DB_TIMEOUT
    while True:
        try:
            con.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)
