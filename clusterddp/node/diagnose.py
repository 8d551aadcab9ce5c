"""``diagnose``: the node program that says what a node knows about a failure, and the launcher's reader.

Run by ``plan.diagnose_command`` with the run's control folder and a JSON request:

- ``{"mode": "joined", "master": [addr, port]}``: did this node's torchrun join the rendezvous
  (it makes ``errors/<id>/attempt_<n>/`` under the control folder, its ``--log-dir``, only when
  it starts workers, i.e. after the rendezvous), and can this node open a TCP connection to the
  master's port (``ok``, ``refused``, ``timed out`` or the error)?
- ``{"mode": "report"}``: the same ``joined``, the per-rank error files torchrun's workers
  wrote there (``TORCHELASTIC_ERROR_FILE``), the kernel log lines about the OOM killer and GPU
  Xid errors (``dmesg``, else ``journalctl -k``: each line keeps its stamp, seconds since boot) with
  when the node booted and when its job started and ended (wall time: the control folder's ``pid`` and
  ``exit_code`` files), so the launcher counts only what happened during the job, and on a node with
  ``nvidia-smi``, its snapshot.

It answers with one JSON line. Everything is bounded on this side (the limits below), and
:func:`read_answer` trusts none of it on the launcher: sizes, types and counts are checked again.
"""

from __future__ import annotations

import errno
import json
import os
import re
import select
import socket
import stat
import subprocess
import sys
import time

TYPE_CHECKING = False
if TYPE_CHECKING:  # for type checkers only: see clusterddp/node/__init__.py
    from typing import Any

ERRORS = "errors"                # under the control folder: torchrun's --log-dir
MAX_ERROR_FILES = 64             # error files sent (a node runs at most a few dozen ranks per attempt)
MAX_ERROR_BYTES = 64 << 10       # of one error file; a traceback is a few KiB
MAX_KERNEL_LINES = 200
MAX_LINE_CHARS = 1000
MAX_SMI_BYTES = 64 << 10
MAX_LOG = 128 << 10             # bytes at the end of node.log sent (torchrun's failure table is there)
MAX_ANSWER = 8 << 20             # bytes of the whole answer, which the reader refuses beyond
CONNECT_S = 3.0
CONNECT_TRIES = 2
COMMAND_S = 20.0
# The kernel's words for the OOM killer at work, and for an NVIDIA GPU error (an "Xid").
_KERNEL = re.compile(r"Out of memory|oom-kill|oom_reaper|Killed process|NVRM: Xid")


def joined(ctl: str) -> bool:
    base = os.path.join(ctl, ERRORS)
    try:
        runs = os.listdir(base)
    except OSError:
        return False
    for r in runs:
        try:
            if any(a.startswith("attempt_") for a in os.listdir(os.path.join(base, r))):
                return True
        except OSError:
            continue
    return False


def reach(addr: str, port: int) -> str:
    """Whether a TCP connection to ``addr:port`` opens: ``ok``, ``refused``, ``timed out`` (after
    :data:`CONNECT_TRIES` tries of :data:`CONNECT_S` each: a master too busy to accept, its accept queue
    full, drops a connection and takes the next) or the error."""
    got = "timed out"
    for _ in range(CONNECT_TRIES):
        got = connect_once(addr, port)
        if got != "timed out":
            break
    return got


def connect_once(addr: str, port: int) -> str:
    """One try. The wait is the kernel's (select) and the verdict the socket's own error after it:
    socket.create_connection checks its deadline before it looks, so on a loaded node (a process not
    run for seconds) it called a port that had answered at once "timed out"."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
    except (OSError, IndexError) as e:
        return (getattr(e, "strerror", None) or str(e))[:MAX_LINE_CHARS]
    s = socket.socket(family, kind, proto)
    try:
        s.setblocking(False)
        err = s.connect_ex(where)
        if err in (errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            _, ready, _ = select.select([], [s], [], CONNECT_S)
            if not ready:
                _, ready, _ = select.select([], [s], [], 0)  # it may have answered as the wait ended
            err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) if ready else errno.ETIMEDOUT
    except OSError as e:
        err = e.errno or errno.EIO
    finally:
        s.close()
    if err == 0:
        return "ok"
    if err == errno.ECONNREFUSED:
        return "refused"
    if err == errno.ETIMEDOUT:
        return "timed out"
    return os.strerror(err)[:MAX_LINE_CHARS]


def _read_bounded(path: str, limit: int) -> "tuple[bytes, bool] | None":
    """Up to ``limit`` bytes of a regular file reached through no link; (data, whether it was longer)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    return data[:limit], len(data) > limit


def _tail_of(path: str, limit: int) -> "bytes | None":
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        size = os.fstat(fd).st_size
        os.lseek(fd, max(0, size - limit), os.SEEK_SET)
        return os.read(fd, limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def error_files(ctl: str) -> "list[dict]":
    """``errors/<id>/attempt_<n>/<local_rank>/error.json``, newest attempt first, at most MAX_ERROR_FILES."""
    base = os.path.join(ctl, ERRORS)
    found = []  # type: list[dict]
    try:
        runs = sorted(os.listdir(base))
    except OSError:
        return []
    for r in runs:
        try:
            attempts = [a for a in os.listdir(os.path.join(base, r)) if re.fullmatch(r"attempt_\d{1,6}", a)]
        except OSError:
            continue
        for a in sorted(attempts, key=lambda a: -int(a[8:])):
            try:
                ranks = [x for x in os.listdir(os.path.join(base, r, a)) if re.fullmatch(r"\d{1,6}", x)]
            except OSError:
                continue
            for lr in sorted(ranks, key=int):
                if len(found) >= MAX_ERROR_FILES:
                    return found
                got = _read_bounded(os.path.join(base, r, a, lr, "error.json"), MAX_ERROR_BYTES)
                if got is not None:
                    found.append({"attempt": int(a[8:]), "local_rank": int(lr),
                                  "data": got[0].decode("utf-8", "replace"), "truncated": got[1]})
    return found


def _command(argv: "list[str]", limit: int) -> "tuple[str | None, str | None]":
    """(output, None) or (None, why not): at most ``limit`` bytes of its end."""
    try:
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
                           timeout=COMMAND_S)
    except FileNotFoundError:
        return None, "not found"
    except subprocess.TimeoutExpired:
        return None, "timed out after %gs" % COMMAND_S
    except OSError as e:
        return None, str(e)[:MAX_LINE_CHARS]
    if p.returncode != 0:
        err = p.stderr.decode("utf-8", "replace").strip().splitlines()
        return None, (err[-1] if err else "exit %d" % p.returncode)[:MAX_LINE_CHARS]
    return p.stdout[-limit:].decode("utf-8", "replace"), None


def kernel_lines() -> "dict":
    """The kernel log's lines about the OOM killer and GPU errors, each with its ``[seconds since boot]``
    stamp (journalctl's short-monotonic has the same), and when this node booted (wall time)."""
    out, why = _command(["dmesg"], 4 << 20)
    if out is None:  # a user may not read dmesg (kernel.dmesg_restrict) but may read the journal
        out, also = _command(["journalctl", "-k", "-o", "short-monotonic", "-q", "--no-pager", "-n", "20000"],
                             4 << 20)
        if out is None:
            return {"error": "dmesg: %s; journalctl -k: %s" % (why, also)}
    lines = [line[:MAX_LINE_CHARS] for line in out.splitlines() if _KERNEL.search(line)]
    return {"lines": lines[-MAX_KERNEL_LINES:], "boot": time.time() - time.monotonic()}


def job_times(ctl: str) -> "dict":
    """When this node's job started (its ``pid`` file, written as it starts) and ended (its ``exit_code``
    file), wall time; absent when not known."""
    out = {}  # type: dict
    for key, name in (("started", "pid"), ("ended", "exit_code")):
        try:
            out[key] = os.stat(os.path.join(ctl, name)).st_mtime
        except OSError:
            pass
    return out


def main(argv: "list[str]", stdout: "Any" = None) -> int:
    out = stdout or sys.stdout
    ctl, request = argv[0], json.loads(argv[1])
    answer = {"joined": joined(ctl)}  # type: dict
    if request.get("master"):
        addr, port = request["master"]
        answer["reach"] = reach(addr, int(port))
    if request.get("mode") == "report":
        answer["errors"] = error_files(ctl)
        got = _tail_of(os.path.join(ctl, "node.log"), MAX_LOG)
        answer["log"] = got.decode("utf-8", "replace") if got is not None else None
        answer["kernel"] = kernel_lines()
        answer["job"] = job_times(ctl)
        smi = None
        for d in os.environ.get("PATH", "").split(os.pathsep):
            if d and os.access(os.path.join(d, "nvidia-smi"), os.X_OK):
                smi = os.path.join(d, "nvidia-smi")
                break
        if smi:
            text, why = _command([smi], MAX_SMI_BYTES)
            answer["nvidia_smi"] = text if text is not None else "nvidia-smi failed: " + str(why)
    out.write(json.dumps(answer) + "\n")
    out.flush()
    return 0


# ---- the launcher's side ----

class AnswerError(Exception):
    """An answer that is not one this program gives."""


def _str(v: object, limit: int, what: str) -> str:
    if not isinstance(v, str):
        raise AnswerError(what + ": not a string")
    return v[:limit]


def _time(v: object) -> "float | None":
    """A wall time a node sent: a finite number of seconds since the epoch (before 5138, the year), else None."""
    if isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v < 1e11:
        return float(v)
    return None


def read_answer(data: bytes) -> "dict":
    """The node's answer, checked: {"joined": bool, "reach": str | None, "errors": [{attempt,
    local_rank, data, truncated}], "kernel_lines": [str], "kernel_error": str | None,
    "kernel_boot", "job_started", "job_ended": wall time (seconds since the epoch) or None,
    "nvidia_smi": str | None, "log": str | None (the end of node.log)}.
    Raises :class:`AnswerError` for anything else."""
    if len(data) > MAX_ANSWER:
        raise AnswerError("answer longer than %d bytes" % MAX_ANSWER)
    lines = data.decode("utf-8", "replace").strip().splitlines()
    if not lines:
        raise AnswerError("no answer")
    try:
        a = json.loads(lines[-1])
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than Python recurses
        raise AnswerError("not JSON: " + lines[-1][:80]) from None
    if not isinstance(a, dict) or not isinstance(a.get("joined"), bool):
        raise AnswerError("not an answer object")
    out = {"joined": a["joined"], "reach": None, "errors": [], "kernel_lines": [], "kernel_error": None,
           "kernel_boot": None, "job_started": None, "job_ended": None, "nvidia_smi": None, "log": None}  # type: dict
    if a.get("log") is not None:
        out["log"] = _str(a["log"], MAX_LOG, "log")
    if a.get("reach") is not None:
        out["reach"] = _str(a["reach"], MAX_LINE_CHARS, "reach")
    errors = a.get("errors", [])
    if not isinstance(errors, list):
        raise AnswerError("errors: not a list")
    for e in errors[:MAX_ERROR_FILES]:
        if not isinstance(e, dict):
            raise AnswerError("errors: not an object")
        attempt, lr = e.get("attempt"), e.get("local_rank")
        if not all(isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 10 ** 6 for x in (attempt, lr)):
            raise AnswerError("errors: bad attempt or local rank")
        out["errors"].append({"attempt": attempt, "local_rank": lr,
                              "data": _str(e.get("data"), MAX_ERROR_BYTES, "errors.data"),
                              "truncated": bool(e.get("truncated"))})
    kernel = a.get("kernel")
    if isinstance(kernel, dict):
        if isinstance(kernel.get("lines"), list):
            out["kernel_lines"] = [_str(x, MAX_LINE_CHARS, "kernel.lines") for x in kernel["lines"][-MAX_KERNEL_LINES:]]
        elif kernel.get("error") is not None:
            out["kernel_error"] = _str(kernel["error"], MAX_LINE_CHARS, "kernel.error")
        out["kernel_boot"] = _time(kernel.get("boot"))
    job = a.get("job")
    if isinstance(job, dict):
        out["job_started"], out["job_ended"] = _time(job.get("started")), _time(job.get("ended"))
    if a.get("nvidia_smi") is not None:
        out["nvidia_smi"] = _str(a["nvidia_smi"], MAX_SMI_BYTES, "nvidia_smi")
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
