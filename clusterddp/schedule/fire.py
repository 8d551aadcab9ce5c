"""What a schedule's crontab line runs (``clusterddp schedule fire SPEC``): take the schedule's lock
without waiting (held: the previous run still runs, so the caller records a skip and exits
:data:`SKIP_EXIT`), then start its `clusterddp up` holding that lock."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from .. import envfile, files
from ..errors import ClusterDDPError, LockTimeout
from ..files import lock_polled, read_bounded
from .spec import ScheduleSpec, search_path, up_argv

SKIP_EXIT = 75  # the previous run still holds the lock (EX_TEMPFAIL)


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
