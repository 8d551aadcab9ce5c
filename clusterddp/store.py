"""The run store: the only writer of ``<runs-dir>/<run_id>/`` and ``<runs-dir>/runs.db``.

``run.json`` is the full record of a run (a :class:`~clusterddp.record.RunRecord`: enough to
reconnect to its nodes later without the inventory); ``runs.db`` (SQLite, WAL) indexes every run for listing and is kept in step
with each ``run.json``. Several launchers (a cron run and a person) may write at once.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import sqlite3
import threading
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from .errors import RunNotFound, UsageError
from .record import RecordError, RunRecord

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
  run_id TEXT PRIMARY KEY, name TEXT, inventory TEXT, script TEXT, hosts TEXT,
  status TEXT NOT NULL, exit_code INTEGER, started_at TEXT, ended_at TEXT,
  failed_host TEXT, schedule TEXT
)"""
# A cron run that found its previous run still going (flock held) starts nothing; it leaves a row here.
_SKIPS_SCHEMA = """
CREATE TABLE IF NOT EXISTS skips (
  schedule TEXT NOT NULL, at TEXT NOT NULL, holder TEXT, reason TEXT
)"""
_SKIP_COLUMNS = ("schedule", "at", "holder", "reason")
_COLUMNS = ("run_id", "name", "inventory", "script", "hosts", "status", "exit_code", "started_at",
            "ended_at", "failed_host", "schedule")


def new_run_id(now: datetime | None = None, token: str | None = None) -> str:
    """A run id that sorts by time and is safe as a folder name: ``20261129-181500-3f9a``."""
    now = now or datetime.now(timezone.utc)
    return now.strftime("%Y%m%d-%H%M%S-") + (token or secrets.token_hex(2))


def utcnow() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class RunStore:
    """Run folders and the run database under one runs directory."""

    def __init__(self, runs_dir: str | Path) -> None:
        self.root = Path(runs_dir).expanduser().absolute()
        self._lock = threading.Lock()
        self._logs: dict[tuple[str, str], Any] = {}

    # ---- database ----
    def _db(self) -> sqlite3.Connection:
        self.root.mkdir(parents=True, exist_ok=True)
        con = sqlite3.connect(self.root / "runs.db", timeout=30, isolation_level=None)
        con.execute("PRAGMA busy_timeout = 30000")
        con.execute("PRAGMA journal_mode = WAL")
        con.execute(_SCHEMA)
        con.execute(_SKIPS_SCHEMA)
        return con

    def _index(self, rec: dict) -> None:
        row = {k: rec.get(k) for k in _COLUMNS}
        row["hosts"] = ",".join(n["host"] for n in rec["nodes"])
        with closing(self._db()) as con:
            con.execute(f"INSERT OR REPLACE INTO runs ({','.join(_COLUMNS)}) "
                        f"VALUES ({','.join('?' * len(_COLUMNS))})", [row[k] for k in _COLUMNS])

    # ---- run folders ----
    def run_dir(self, run_id: str) -> Path:
        return self.root / run_id

    def record_path(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "run.json"

    def create(self, record: RunRecord) -> RunRecord:
        """Create the run folder and its first ``run.json``; index it."""
        d = self.run_dir(record.run_id)
        try:
            (d / "logs").mkdir(parents=True, exist_ok=False)
        except OSError as e:
            raise UsageError(f"cannot create the run folder {d}: {e.strerror or e}",
                             "pass a writable --runs-dir (or set CLUSTERDDP_RUNS_DIR)") from None
        self._write(record)
        return record

    def _write(self, record: RunRecord) -> None:
        rec = record.to_json()
        path = self.record_path(record.run_id)
        tmp = path.with_suffix(f".json.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(rec, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, path)
        self._index(rec)

    def update(self, run_id: str, change: Callable[[RunRecord], RunRecord]) -> RunRecord:
        """Replace run.json with ``change(record)`` and re-index; return the new record.

        Read-change-write runs under a file lock, so an attached `up` and a `stop` or `status`
        in another process never lose each other's update: ``change`` gets the record as it is
        on disk now, and should decide from that (it may run while another process waits).
        """
        self.load(run_id)  # a clear RunNotFound (or RecordError) before any lock file is made
        with self._lock, open(self.run_dir(run_id) / ".run.json.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            new = change(self.load(run_id))
            if new.run_id != run_id:
                raise ValueError(f"an update of run {run_id} returned run {new.run_id}")
            self._write(new)
            return new

    def load(self, run_id: str) -> RunRecord:
        """The run's record; :class:`RunNotFound` if there is none, :class:`RecordError` if it is damaged."""
        path = self.record_path(run_id)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise RunNotFound(f"no run {run_id!r} in {self.root}",
                              "list runs with `clusterddp runs`, or pass --runs-dir") from None
        except UnicodeDecodeError as e:
            raise RecordError(str(path), None, f"not UTF-8 text ({e.reason} at byte {e.start})") from None
        except json.JSONDecodeError as e:
            raise RecordError(str(path), None, f"not valid JSON (line {e.lineno} column {e.colno}: {e.msg})") from None
        return RunRecord.from_json(data, str(path))

    def resolve(self, prefix: str) -> str:
        """The run id that ``prefix`` names uniquely."""
        if (self.run_dir(prefix) / "run.json").is_file():
            return prefix
        ids = sorted(p.name for p in self.root.glob(f"{glob_escape(prefix)}*") if (p / "run.json").is_file()) \
            if self.root.is_dir() and prefix else []
        if not ids:
            raise RunNotFound(f"no run matches {prefix!r} in {self.root}",
                              "list runs with `clusterddp runs`, or pass --runs-dir")
        if len(ids) > 1:
            raise RunNotFound(f"{prefix!r} matches {len(ids)} runs: {', '.join(ids[:5])}"
                              + (" ..." if len(ids) > 5 else ""), "give more of the run id")
        return ids[0]

    def list(self) -> list[dict]:
        """Every indexed run, newest first."""
        if not (self.root / "runs.db").exists():
            return []
        with closing(self._db()) as con:
            cur = con.execute(f"SELECT {','.join(_COLUMNS)} FROM runs ORDER BY started_at DESC, run_id DESC")
            return [dict(zip(_COLUMNS, row)) for row in cur]

    # ---- scheduled runs ----
    def last_run(self, schedule: str) -> dict | None:
        """The newest run started by ``schedule``, or None."""
        if not (self.root / "runs.db").exists():
            return None
        with closing(self._db()) as con:
            row = con.execute(f"SELECT {','.join(_COLUMNS)} FROM runs WHERE schedule = ? "
                              "ORDER BY started_at DESC, run_id DESC LIMIT 1", (schedule,)).fetchone()
        return dict(zip(_COLUMNS, row)) if row else None

    def record_skip(self, schedule: str, reason: str, holder: str | None = None) -> dict:
        """Record that ``schedule`` fired while its previous run (``holder``, if known) still ran."""
        row = {"schedule": schedule, "at": utcnow(), "holder": holder, "reason": reason}
        with closing(self._db()) as con:
            con.execute(f"INSERT INTO skips ({','.join(_SKIP_COLUMNS)}) VALUES (?, ?, ?, ?)",
                        [row[k] for k in _SKIP_COLUMNS])
        return row

    def skips(self, schedule: str) -> list[dict]:
        """Every recorded skip of ``schedule``, newest first."""
        if not (self.root / "runs.db").exists():
            return []
        with closing(self._db()) as con:
            cur = con.execute(f"SELECT {','.join(_SKIP_COLUMNS)} FROM skips WHERE schedule = ? "
                              "ORDER BY at DESC, rowid DESC", (schedule,))
            return [dict(zip(_SKIP_COLUMNS, r)) for r in cur]

    # ---- logs and artifacts ----
    def log_path(self, run_id: str, host: str) -> Path:
        return self.run_dir(run_id) / "logs" / f"{host}.log"

    def append_log(self, run_id: str, host: str, data: bytes) -> None:
        key = (run_id, host)
        f = self._logs.get(key)
        if f is None:
            f = self._logs[key] = open(self.log_path(run_id, host), "ab")
        f.write(data)
        f.flush()

    def write_log(self, run_id: str, host: str, data: bytes) -> None:
        """Replace the local log with the node's complete copy."""
        path = self.log_path(run_id, host)
        tmp = path.with_suffix(".log.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def close_logs(self) -> None:
        for f in self._logs.values():
            f.close()
        self._logs.clear()

    def artifacts_dir(self, run_id: str, host: str) -> Path:
        return (self.run_dir(run_id) / "artifacts" / host).resolve()

    def artifact_path(self, run_id: str, host: str, rel: str) -> Path:
        base = self.artifacts_dir(run_id, host)
        p = (base / rel).resolve()
        if base not in p.parents:  # a remote name must never write outside the run folder
            raise ValueError(f"refusing artifact path outside the run folder: {rel!r}")
        return p


def glob_escape(s: str) -> str:
    return "".join(f"[{c}]" if c in "*?[" else c for c in s)

