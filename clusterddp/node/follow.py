"""``follow``: the node program that streams a job's ``node.log`` to the launcher until the job ends.

``plan.follow_command`` runs :func:`main` on the node for ``up``'s live output and ``logs
--follow``. It writes the log's raw bytes from a given line on and returns (exit 0) once the job
has ended and the log is drained. The end is the ``exit_code`` file (launch.sh writes it last),
or the job's shell gone or a zombie: ``tail --pid`` treats an unreaped zombie as alive, and an
orphan's reaping can lag by seconds, so tail would hold every run's end back. The launcher then
reads the exit code with ``plan.status_command`` (``plan.follow_status_command`` runs it right after
this program, on the same channel).

Between polls it waits on a pidfd of the job's shell where the node has them (Linux 5.3,
Python 3.9): the shell's exit (just after it wrote ``exit_code``) ends the wait at once, instead of
every run's end waiting up to a whole poll interval.

Followed from its first line to a job that ended (``exit_code`` there), the whole log has gone
out: it then writes, on standard error, one :data:`WHOLE_MARK` line with the size and sha256 of what
it sent, so the launcher can tell that its own copy is the node's without fetching it again
(``artifacts.keep_streamed``).
"""

from __future__ import annotations

import hashlib
import os
import select
import sys
import time

# In the control folder (plan.CONTROL), as launch.sh and plan.start_command write them.
LOG, PID, EXIT_CODE = "node.log", "pid", "exit_code"
WHOLE_MARK = "CLUSTERDDP_LOG_WHOLE "  # then "<size> <sha256 hex>": the whole log was sent, this is it


def main(argv: list[str], stdout=None, stderr=None) -> int:
    """argv: the control folder, the first log line wanted (1-based), the poll interval in seconds.
    The log goes to ``stdout`` (binary), the :data:`WHOLE_MARK` line to ``stderr`` (text); the
    process's own when not given."""
    ctl, line, poll = argv[0], int(argv[1]), float(argv[2])
    out = stdout if stdout is not None else sys.stdout.buffer
    whole = hashlib.sha256() if line == 1 else None
    sent = 0
    with open(os.path.join(ctl, PID)) as f:
        pid = int(f.read().strip() or 0)
    exit_code = os.path.join(ctl, EXIT_CODE)
    pidfd = _pidfd(pid)

    def wait() -> None:
        if pidfd is None:
            time.sleep(poll)
        else:
            select.select([pidfd], [], [], poll)

    def ended() -> bool:
        if os.path.exists(exit_code):
            return True
        if pidfd is not None:  # readable once the shell has exited, zombie or reaped; immune to pid reuse
            return bool(select.select([pidfd], [], [], 0)[0])
        try:
            with open("/proc/%d/stat" % pid) as f:
                return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
        except (OSError, IndexError):
            return True
    try:
        with open(os.path.join(ctl, LOG), "rb") as log:
            while line > 1:  # skip to the first line wanted, waiting for it if needed
                pos, text = log.tell(), log.readline()
                if text.endswith(b"\n"):
                    line -= 1
                    continue
                log.seek(pos)
                if ended():
                    return 0
                wait()
            while True:
                done = ended()
                chunk = log.read(1 << 16)
                if chunk:
                    out.write(chunk)
                    out.flush()
                    sent += len(chunk)
                    if whole is not None:
                        whole.update(chunk)
                elif done:
                    if whole is not None and os.path.exists(exit_code):
                        err = stderr if stderr is not None else sys.stderr
                        err.write("%s%d %s\n" % (WHOLE_MARK, sent, whole.hexdigest()))
                        err.flush()
                    return 0
                else:
                    wait()
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _pidfd(pid: int) -> int | None:
    """A pidfd of the job's shell, or None: Python < 3.9, Linux < 5.3, or no such process (ended then)."""
    try:
        return os.pidfd_open(pid) if pid > 0 else None
    except (AttributeError, OSError):
        return None


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
