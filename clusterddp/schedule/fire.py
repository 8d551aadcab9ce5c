"""What a schedule's crontab line runs (``clusterddp schedule fire SPEC``): take the schedule's lock
without waiting, then start its `clusterddp up` holding that lock; and what each firing came to.

A firing's outcome (:class:`Firing`, recorded in runs.db's ``firings`` table, shown by `schedule list`):
the status of the run it started (``succeeded``, ``failed``, ``stopped``), or one of two skips, told
apart by their exit codes as well as their words:

* :data:`LOCK_HELD` (exit :data:`LOCK_HELD_EXIT`): the schedule's previous run still holds its lock, so
  nothing was started (:func:`skipped`);
* :data:`SLOTS_BUSY` (exit :data:`BUSY_EXIT`, `up`'s own): `up` found the GPU slots it needs taken (or a
  host quarantined) and started nothing; a schedule added with ``--wait`` waits in the queue instead.

A firing that failed before its run was recorded (bad input, the preflight) is ``failed`` with no run:
only a run that `clusterddp runs` lists is ever named (:func:`ended`).
"""

from __future__ import annotations

import os
import subprocess
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from .. import envfile, files
from ..errors import ClusterDDPError, LeaseBusy, LockTimeout
from ..files import lock_polled, read_bounded
from .spec import ScheduleSpec, lock_path, search_path, up_argv

LOCK_HELD_EXIT = 3  # the schedule's previous run still holds its lock: nothing started
BUSY_EXIT = LeaseBusy.exit_code  # 75 (EX_TEMPFAIL), `up`'s: the GPU slots were taken, nothing started
INTERRUPTED_EXIT = 130
LOCK_HELD, SLOTS_BUSY = "skipped: lock held", "skipped: slots busy"
SUCCEEDED, FAILED, STOPPED = "succeeded", "failed", "stopped"  # as RunStatus says them


@dataclass(frozen=True)
class Firing:
    """What one firing of a schedule came to (see the module docstring)."""

    outcome: str
    at: str                      # when it fired (UTC, ISO 8601)
    run_id: str | None = None    # the run it started, once recorded (`clusterddp runs` lists it)
    holder: str | None = None    # LOCK_HELD: the previous run, still running, when known
    reason: str | None = None    # in words, for the log and `schedule run`

    def says(self) -> str:
        """The firing in one line: ``skipped: slots busy: ...``, ``failed (run X)``."""
        return (self.outcome + (f" (run {self.run_id})" if self.run_id else "")
                + (f": {self.reason}" if self.reason else ""))


def skipped(name: str, runs_dir: str, at: str, holder: str | None) -> Firing:
    """The firing that found the schedule's lock held (by its run ``holder``, when known)."""
    return Firing(LOCK_HELD, at, holder=holder,
                  reason=f"the previous run{' ' + holder if holder else ''} still holds {lock_path(runs_dir, name)}")


def ended(spec: ScheduleSpec, at: str, rc: int, run: dict | None) -> Firing:
    """The firing that ran `up` (at ``at``): its outcome from ``run``, the run of the schedule that
    `up` recorded since (None: it recorded none), else from `up`'s exit code ``rc``."""
    if run is not None:
        return Firing(str(run["status"]), at, run_id=str(run["run_id"]))
    if rc == 0:  # `up` records every run it starts: this one started none (nothing to name)
        return Firing(SUCCEEDED, at)
    if rc == BUSY_EXIT:
        return Firing(SLOTS_BUSY, at, reason="the GPU slots it needs were taken, or a host it needs is quarantined "
                      "(its log says by whom); nothing was started"
                      + ("" if spec.wait else "; to wait in the queue instead, add the schedule again with --wait "
                         f"(`clusterddp schedule add {spec.name} ... --replace --wait`)"))
    if rc == INTERRUPTED_EXIT:
        return Firing(STOPPED, at, reason="`clusterddp up` was interrupted before its run was recorded")
    return Firing(FAILED, at, reason=f"`clusterddp up` exited {rc} before its run was recorded "
                  "(bad input, or the preflight check: its log says why); nothing was started")


def run_since(runs_dir: str, name: str, since: str) -> dict | None:
    """The newest run of schedule ``name`` recorded at or after ``since`` (the firing's run: the
    schedule's lock keeps a second firing from starting one meanwhile), or None."""
    from ..store import RunStore
    last = RunStore(runs_dir).last_run(name)
    try:
        if last is None or datetime.fromisoformat(str(last["started_at"])) < datetime.fromisoformat(since):
            return None
    except ValueError:  # a hand-edited index: not this firing's run
        return None
    return last


def last_firing(store: Any, name: str) -> dict | None:
    """Schedule ``name``'s newest firing in ``store`` (a RunStore), as its ``firings`` row: the last one
    recorded, or the newest run of the schedule when that started after it (a firing still running,
    or one whose `schedule fire` was killed). A recorded firing's run shows its status now. Its run
    is the one it started or, for a skip because the lock was held, the one that held it
    (``holder``): either is a run that `clusterddp runs` lists."""
    from ..store import when_of
    recorded = next(iter(store.firings(name, 1)), None)
    run = store.last_run(name)
    if run is None:
        return recorded
    if recorded is not None and run["run_id"] == recorded["run_id"]:
        return {**recorded, "outcome": str(run["status"])}
    if recorded is None or when_of(run["started_at"]) > when_of(recorded["at"]):
        return {"schedule": name, "at": run["started_at"], "outcome": str(run["status"]), "run_id": run["run_id"],
                "holder": None, "reason": None}
    return recorded


def record_firing(runs_dir: str, name: str, firing: Firing) -> dict:
    """Record ``firing`` in the runs folder's index (StoreError when it cannot be written)."""
    from ..store import RunStore
    return RunStore(runs_dir).record_firing(name, firing.outcome, firing.at, run_id=firing.run_id,
                                            holder=firing.holder, reason=firing.reason)


def lock_holder(path: str) -> tuple[int, str] | None:
    """Who holds the lock file ``path``, from the pid its holder wrote into it (see :func:`lock_within`):
    the pid and "pid N (its command line)", or None if that is unknown or the process is gone."""
    try:
        pid = int(read_bounded(path, 64)[0].split()[0])
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except (OSError, ClusterDDPError, ValueError, IndexError):
        return None
    return pid, f"pid {pid} ({cmd[:120]})"


def open_lock(path: str) -> int:
    """A lock file's descriptor (made 0600 if missing; a symlink in its place is refused)."""
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)


def _mark_held(fd: int) -> None:
    """Write our pid into a lock file we hold, for :func:`lock_holder`."""
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def lock_within(fd: int, path: str, deadline: float, what: str) -> None:
    """Take the exclusive lock on ``fd`` (the file ``path``), waiting at most ``deadline`` seconds;
    past it, :class:`LockTimeout` names the file and its holder."""
    def timed_out() -> LockTimeout:
        holder = lock_holder(path)
        return LockTimeout(f"{what}: {path} is still locked after {deadline:g}s, "
                           f"by {holder[1] if holder else 'a process that did not say'}",
                           "wait for it to finish; if it hangs, end it"
                           f"{f' (kill {holder[0]})' if holder else ''} and try again")
    lock_polled(fd, time.monotonic() + deadline, timed_out)
    _mark_held(fd)


def try_lock(spec: ScheduleSpec) -> int | None:
    """The schedule's lock, taken without waiting: its file descriptor, or None when the
    previous run still holds it. Pass the descriptor on to the run (:func:`start_up`): the lock
    lasts as long as the run does, even if the process that took it dies first."""
    try:
        fd = open_lock(spec.lock_path)
    except OSError as e:
        raise ClusterDDPError(f"schedule {spec.name}: cannot open its lock {spec.lock_path}: {e.strerror}") from None
    if not files.try_lock(fd):
        os.close(fd)
        return None
    _mark_held(fd)
    return fd


def start_up(spec: ScheduleSpec, lock_fd: int) -> subprocess.Popen:
    """Start the schedule's `clusterddp up`: in the launch folder, with
    this environment's bin first on PATH and the agent socket, output to ours, holding the lock."""
    env = {**os.environ, "PATH": search_path(spec.bin_dir)}
    if spec.agent_socket:
        env["SSH_AUTH_SOCK"] = spec.agent_socket
    fds = [lock_fd]
    env_file = None
    if spec.run.env:  # the values go through a memory-only file this process hands on, never argv
        fd = os.memfd_create(f"clusterddp-{spec.name}-env", 0)  # not CLOEXEC: only up gets it (pass_fds)
        os.write(fd, envfile.render(spec.run.env))
        fds.append(fd)
        env_file = f"/dev/fd/{fd}"
    argv = up_argv(spec, env_file)
    try:
        return subprocess.Popen(argv, cwd=spec.launch_dir, env=env, pass_fds=tuple(fds))
    except OSError as e:
        where = f"launch_dir {spec.launch_dir}" if not os.path.isdir(spec.launch_dir) else argv[0]
        raise ClusterDDPError(f"schedule {spec.name}: cannot start `clusterddp up`: {where}: {e.strerror}",
                              f"its spec is {spec.spec_path}; add the schedule again from a folder that "
                              "exists, with this environment's clusterddp") from None
    finally:
        for fd in fds[1:]:
            os.close(fd)
