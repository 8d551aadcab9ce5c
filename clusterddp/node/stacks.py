"""``stacks``: the current Python stack of every thread of every rank of one node's job (and of
torchrun's agent), for ``clusterddp stacks``.

Node side, :func:`main`: the job's processes are found by their ``CLUSTERDDP_JOB`` marker (as
teardown finds them). A rank is one whose environment has ``RANK`` and whose parent's has not (a
data loader's worker, forked from a rank, has its rank's environment too); the agent is the
``torch.distributed.run`` process. Each one hooked by ``stackhook`` (its dump file's header names it
and ``/proc/PID/status`` shows it catches the signal: the signal's default action would end it, so an
unhooked process is never signalled) is sent the signal, all at once, once its threads have stayed the
same between two looks (:func:`calm`: a dump taken while a thread starts or ends can crash it; one whose
threads keep changing is not signalled, and says so); each dump is read from where its file ended
before, once it has stopped growing, within ``wait`` seconds. A process not hooked
(started by an older clusterddp, or by ``python -E``/``-I``, which ignore ``PYTHONPATH``) is dumped
by ``py-spy dump`` where the node has py-spy and ptrace rights, written in faulthandler's format;
otherwise its entry says why there is none. One line: :data:`MARK` and a JSON object.
Python 3.8 grammar, standard library only.

Launcher side, :func:`parse_reply` (that line, every value checked: the node is not trusted) and
:func:`parse_dump` (faulthandler's text as threads and frames; never raises).
"""

from __future__ import annotations

import json
import os
import re
import sys
import time

MARK = "CLUSTERDDP_STACKS "
OFFSET = 6                       # stackhook's: the signal is SIGRTMIN + OFFSET
HEADER = re.compile(r"CLUSTERDDP_STACKS pid=(\d+) main=0x([0-9a-f]+)\n")
MOST_DUMP = 256 * 1024           # bytes of one process's dump sent
MOST_PROCS = 256                 # processes of one node's job reported
MOST_REPLY = MOST_PROCS * (MOST_DUMP + 4096) + 65536
SETTLE = 0.1                     # seconds a dump file must stay the same size to be whole
CALM_LOOK = 0.05                 # seconds between two looks at a process's threads (calm)
CALM_MOST = 3.0                  # seconds at most that take waits for a process's threads to stay the same
PY_SPY_TIMEOUT = 10.0


def read_head(path: str, most: int = 1 << 20) -> bytes:
    """The first ``most`` bytes of ``path``; nothing when it cannot be read (the ``where`` program's reader too)."""
    try:
        with open(path, "rb") as f:
            return f.read(most)
    except OSError:
        return b""


def _environ(pid: int) -> dict:
    env = {}
    for entry in read_head("/proc/%d/environ" % pid).split(b"\0"):
        k, sep, v = entry.partition(b"=")
        if sep:
            env[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return env


def _ppid(pid: int) -> int:
    try:
        return int(read_head("/proc/%d/stat" % pid).rsplit(b")", 1)[1].split()[1])
    except (IndexError, ValueError):
        return 0


def _catches(pid: int, sig: int) -> bool:
    """Whether process ``pid`` has a handler for ``sig`` (SigCgt in /proc/PID/status)."""
    for line in read_head("/proc/%d/status" % pid).split(b"\n"):
        if line.startswith(b"SigCgt:"):
            try:
                return bool(int(line.split()[1], 16) >> (sig - 1) & 1)
            except (IndexError, ValueError):
                return False
    return False


def job_processes(marker: str) -> list:
    """The job's ranks and agent: dicts of pid, role (``rank``/``agent``), rank, local_rank."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        env = _environ(int(name))
        if env.get("CLUSTERDDP_JOB") == marker:
            found[int(name)] = env
    out = []
    for pid in sorted(found):
        env = found[pid]
        cmd = read_head("/proc/%d/cmdline" % pid).split(b"\0")
        if "RANK" in env:
            parent = found.get(_ppid(pid))
            if parent is not None and "RANK" in parent:
                continue  # a rank's child (a data loader worker): its rank answers for it
            out.append({"pid": pid, "role": "rank", "rank": _int(env.get("RANK")),
                        "local_rank": _int(env.get("LOCAL_RANK"))})
        elif b"torch.distributed.run" in cmd or os.path.basename(cmd[0]) == b"torchrun":
            out.append({"pid": pid, "role": "agent", "rank": None, "local_rank": None})
    return out[:MOST_PROCS]


def _int(text) -> object:
    return int(text) if text is not None and text.isdigit() and len(text) < 10 else None


def _hooked(folder: str, pid: int, sig: int) -> object:
    """The main thread's id (hex) when ``pid`` is hooked: its file's header names it, it catches ``sig``."""
    m = HEADER.match(read_head(os.path.join(folder, "%d.txt" % pid), 200).decode("ascii", "replace"))
    if m is None or int(m.group(1)) != pid or not _catches(pid, sig):
        return None
    return m.group(2)


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def threads_of(pid: int) -> object:
    """The ids of ``pid``'s threads now (``/proc/PID/task``), a frozenset; None once it is gone."""
    try:
        return frozenset(os.listdir("/proc/%d/task" % pid))
    except OSError:
        return None


def steady(pids: list, before: dict) -> tuple:
    """Those of ``pids`` whose threads now are the very threads ``before`` (pid -> :func:`threads_of`) holds,
    and every pid's threads now (``before`` for the next look). faulthandler's all-thread dump reads each
    thread's state without the GIL: a thread made or ending meanwhile can crash the process (SIGSEGV, seen
    as a rank set up DDP under load), so only a process steady since the previous look is signalled."""
    now = dict((pid, threads_of(pid)) for pid in pids)
    return set(pid for pid, t in now.items() if t is not None and before.get(pid) == t), now


def calm(pids: list, most: float = CALM_MOST, look: float = CALM_LOOK) -> set:
    """Those of ``pids`` found :func:`steady` between two looks ``look`` s apart, looking again (up to
    ``most`` s) at those whose threads changed. A process gone is not in the answer."""
    _, before = steady(pids, {})
    waiting = set(pid for pid, t in before.items() if t is not None)
    found = set()  # type: set
    deadline = time.monotonic() + most
    while waiting and time.monotonic() < deadline:
        time.sleep(look)
        safe, now = steady(sorted(waiting), before)
        found |= safe
        waiting -= safe | set(pid for pid, t in now.items() if t is None)
        before.update(now)
    return found


def take(folder: str, procs: list, sig: int, wait: float, py_spy: bool = True, settle: bool = True) -> None:
    """Signal every hooked process of ``procs`` at once, then read each one's dump (set in place:
    ``how``, ``main``, ``dump``, ``note``); with ``py_spy``, py-spy's dump of those not hooked, and of
    those whose threads never stayed the same (:func:`calm`, with ``settle``; a caller that has looked at
    their threads itself, as the rank sampler does across its samples, passes False), which are not signalled."""
    pending = {}
    for p in procs:
        p["main"] = _hooked(folder, p["pid"], sig)
        p["how"], p["dump"], p["note"] = "none", "", ""
    hooked = [p["pid"] for p in procs if p["main"] is not None]
    busy = set(hooked) - calm(hooked, min(CALM_MOST, wait / 3)) if settle else set()
    for p in procs:
        if p["pid"] in busy:
            p["main"] = None  # py-spy's turn, if the node has it (it reads, it does not signal)
        if p["main"] is None:
            continue
        path = os.path.join(folder, "%d.txt" % p["pid"])
        before = _size(path)
        try:
            os.kill(p["pid"], sig)
        except OSError as e:
            p["note"] = "could not signal it: %s" % e.strerror
            continue
        pending[p["pid"]] = [p, path, before, before, 0.0]
    deadline = time.monotonic() + wait
    while pending and time.monotonic() < deadline:
        time.sleep(0.02)
        now = time.monotonic()
        for pid in list(pending):
            p, path, before, last, since = pending[pid]
            size = _size(path)
            if size != last:
                pending[pid][3:] = [size, now]
            elif size > before and now - since >= SETTLE:
                p["how"], p["dump"] = "faulthandler", _dump_of(path, before)
                del pending[pid]
    for p, path, before, last, _ in pending.values():
        if last > before:  # still growing at the deadline: what it wrote so far
            p["how"], p["dump"] = "faulthandler", _dump_of(path, before)
            p["note"] = "dump still being written after %gs" % wait
        else:
            p["note"] = "no dump within %gs (the process is stopped or not running Python)" % wait
    for p in procs:
        if py_spy and p["main"] is None and not p["note"]:
            _py_spy(p, p["pid"] in busy)
        if p["pid"] in busy and p["how"] == "none":
            p["note"] = ("not signalled: its threads kept starting or ending for %gs (faulthandler's dump meanwhile "
                         "can crash a process); ask again" % min(CALM_MOST, wait / 3)
                         + ("; " + p["note"] if p["note"] else ""))


def _dump_of(path: str, start: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(start)
            data = f.read(MOST_DUMP)
    except OSError:
        return ""
    return data.decode("utf-8", "replace")


def _py_spy(p: dict, busy: bool = False) -> None:
    """A process not hooked (or, ``busy``, one not signalled: its threads kept changing): its stacks from
    py-spy, where the node has it, as faulthandler writes them."""
    import shutil
    import subprocess
    exe = shutil.which("py-spy") or shutil.which(os.path.join(os.path.dirname(sys.executable), "py-spy"))
    why = "" if busy else "not hooked (started by an older clusterddp, by python -E/-I, or with PYTHONPATH replaced); "
    if exe is None:
        p["note"] = why + "py-spy is not installed on this node"
        return
    try:
        r = subprocess.run([exe, "dump", "--json", "--pid", str(p["pid"])], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=PY_SPY_TIMEOUT)
        threads = json.loads(r.stdout.decode("utf-8", "replace")) if r.returncode == 0 else None
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        p["note"] = why + "py-spy failed: %s" % e
        return
    if not isinstance(threads, list):
        err = r.stderr.decode("utf-8", "replace").strip().splitlines()
        p["note"] = why + "py-spy failed (ptrace rights?): %s" % (err[-1][:300] if err else "exit %d" % r.returncode)
        return
    p["how"], p["dump"], p["main"] = ("py-spy",) + _as_faulthandler(threads, p["pid"])


def _as_faulthandler(threads: list, pid: int) -> tuple:
    """py-spy's JSON threads as faulthandler's text, and the main thread's id (hex) or None."""
    out, main = [], None
    for t in threads:
        if not isinstance(t, dict):
            continue
        tid = t.get("thread_id")
        tid = tid if isinstance(tid, int) and 0 <= tid < 1 << 64 else 0
        if t.get("os_thread_id") == pid or t.get("thread_name") == "MainThread":
            main = "%x" % tid
        out.append("Thread 0x%016x (most recent call first):" % tid)
        for fr in t.get("frames") or []:
            if isinstance(fr, dict):
                out.append('  File "%s", line %s in %s' % (fr.get("filename"), fr.get("line"), fr.get("name")))
        out.append("")
    return "\n".join(out)[:MOST_DUMP], main


def locked(folder: str):
    """``folder``'s lock file (``.lock``), held until closed; None where it cannot be (no folder: no dumps)."""
    try:
        import fcntl
        fd = os.open(os.path.join(folder, ".lock"), os.O_WRONLY | os.O_CREAT, 0o600)
    except (ImportError, OSError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:
        os.close(fd)
        return None
    return fd


def main(argv: list) -> int:
    """``stacks JSON``: {"ctl": the job's control folder, "marker": its CLUSTERDDP_JOB, "wait": s}."""
    import signal
    args = json.loads(argv[0])
    ctl = args["ctl"]
    folder = os.path.join(ctl, "stacks")
    reply = {"time": time.time(), "host": os.uname()[1], "state": "running", "exit_code": None, "procs": []}
    code = read_head(os.path.join(ctl, "exit_code"), 16).strip()
    if not os.path.isdir(ctl):
        reply["state"] = "missing"
    else:
        procs = job_processes(args["marker"])
        lock = locked(folder)  # the node program ``where`` cuts dump files back under this lock
        try:
            take(folder, procs, int(signal.SIGRTMIN) + OFFSET, float(args.get("wait", 3.0)))
        finally:
            if lock is not None:
                os.close(lock)
        reply["procs"] = procs
        if not procs:
            reply["state"] = "ended"
            reply["exit_code"] = int(code) if code.isdigit() and len(code) <= 3 else None
    sys.stdout.write(MARK + json.dumps(reply) + "\n")
    sys.stdout.flush()
    return 0


# ---- launcher side ----

THREAD = re.compile(r"^(Current thread|Thread) 0x([0-9a-fA-F]{1,16})(?: \[[^\]]*\])? \(most recent call first\):$")
FRAME = re.compile(r'^  File "(.*)", line (\d+|\?\?\?) in (.*)$')
MOST_THREADS = 1000
MOST_FRAMES = 1000


def parse_dump(text: str) -> list:
    """faulthandler's dump as ``[(thread id, current?, [(file, line or None, function)...])]``,
    innermost frame first, as it writes them. Lines that are none of its forms are skipped; never raises."""
    threads = []  # type: list
    for line in text.split("\n")[: MOST_THREADS * (MOST_FRAMES + 2)]:
        line = line.rstrip("\r")
        m = THREAD.match(line)
        if m is not None:
            if len(threads) >= MOST_THREADS:
                break
            threads.append((int(m.group(2), 16), m.group(1) == "Current thread", []))
            continue
        f = FRAME.match(line)
        if f is not None and threads and len(threads[-1][2]) < MOST_FRAMES:
            ln = f.group(2)
            threads[-1][2].append((f.group(1), int(ln) if ln.isdigit() and len(ln) < 10 else None, f.group(3)))
    return threads


def parse_reply(stdout: bytes) -> dict:
    """The node's answer, checked: ReplyError (a ValueError) naming what is wrong, never another error."""
    from .reply import ReplyError, last_marked_json, one_line
    if len(stdout) > MOST_REPLY:
        raise ReplyError("a reply of over %d bytes" % MOST_REPLY)
    r = last_marked_json(stdout, MARK)
    if r is None:
        raise ReplyError("no %s line in the node's answer" % MARK.strip())
    if not isinstance(r, dict):
        raise ReplyError("the answer is not a JSON object")

    def field(d: dict, key: str, types: tuple, where: str):  # a checked value, of one of ``types``
        v = d.get(key)
        if not isinstance(v, types) or isinstance(v, bool) and bool not in types:
            raise ReplyError("%s%s: a %s, not what the node program sends" % (where, key, type(v).__name__))
        return v
    at = field(r, "time", (int, float), "")
    if not 0 <= at <= 1e11:  # inf and 10**400 too
        raise ReplyError("time: not a time")
    out = {"time": float(at), "host": field(r, "host", (str,), "")[:255],
           "state": field(r, "state", (str,), ""), "exit_code": field(r, "exit_code", (int, type(None)), "")}
    if out["exit_code"] is not None and not 0 <= out["exit_code"] <= 255:
        raise ReplyError("exit_code: not 0-255")
    if out["state"] not in ("running", "ended", "missing"):
        raise ReplyError("state %r is not running, ended or missing" % out["state"][:50])
    procs = field(r, "procs", (list,), "")
    if len(procs) > MOST_PROCS:
        raise ReplyError("over %d processes" % MOST_PROCS)
    out["procs"] = []
    for i, p in enumerate(procs):
        w = "procs[%d]." % i
        if not isinstance(p, dict):
            raise ReplyError("procs[%d] is not an object" % i)
        q = {"pid": field(p, "pid", (int,), w), "role": field(p, "role", (str,), w),
             "rank": field(p, "rank", (int, type(None)), w), "local_rank": field(p, "local_rank", (int, type(None)), w),
             "how": field(p, "how", (str,), w), "main": field(p, "main", (str, type(None)), w),
             "dump": field(p, "dump", (str,), w), "note": one_line(field(p, "note", (str,), w)[:1000])}
        if q["role"] not in ("rank", "agent") or q["how"] not in ("faulthandler", "py-spy", "none"):
            raise ReplyError("%srole/how %r/%r unknown" % (w, q["role"][:20], q["how"][:20]))
        ranks = (q["rank"], q["local_rank"])
        if not 0 < q["pid"] < 1 << 31 or any(x is not None and not 0 <= x < 1 << 24 for x in ranks):
            raise ReplyError("%spid or rank out of range" % w)
        if q["main"] is not None and not re.fullmatch(r"[0-9a-f]{1,16}", q["main"]):
            raise ReplyError("%smain %r is not a thread id" % (w, q["main"][:40]))
        if len(q["dump"]) > MOST_DUMP:
            raise ReplyError("%sdump of over %d characters" % (w, MOST_DUMP))
        out["procs"].append(q)
    return out


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
