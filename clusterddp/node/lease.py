"""``lease``: the node program that takes, holds and lists a node's GPU slot leases and queue entries,
and the launcher's reader of its replies.

A node's lease folder (``lease_dir``, default ``<workdir>/leases/%h``, %h the node's hostname) holds:

- ``slot-<i>.lock`` and ``port-<p>.lock``: empty files; a slot (or the master port) is taken while a
  process holds an ``flock`` on its file. Never deleted (deleting a lock file races with its next
  taker). The kernel drops a lock when the last process holding its file open ends, so a crashed,
  SIGKILLed or rebooted job holds nothing.
- ``lease-<run>.json``: who holds which slots (run id, launching user, since, host, slots, port,
  state ``starting`` or ``running``), locked by its holder like the slots. Readers try its lock: a
  record whose lock they get has no holder left, and is removed.
- ``queue-<ticket>.json``: a waiting run (``up --wait``), locked by the waiter's process on the node
  for as long as the launcher waits; removed the same way when stale.
- ``.mutex``: taken (briefly, never while waiting for another node) around one node's check and take.

Modes (the request is one JSON object on stdin, the reply JSON lines on stdout):

- ``hold``: take the slots (and, on the master, a port) if the run fits, by the queue's rule (below);
  reply ``{"ok": true, "slots", "port", "capacity"}`` and hold them until the launcher touches the
  ``go`` file (then the state becomes ``running``, ``start`` runs with the lock files open, so the
  job's own processes hold them for its lifetime, and ``{"started": true}`` is printed), removes the
  record (release), or goes away (its channel closes). Or reply ``{"ok": false, ...}`` naming the
  holders and waiters, and exit.
- ``queue``: write and hold a queue entry until it is removed or the launcher goes away.
- ``list``: reply with the node's capacity, live leases and queue.

The queue's rule: a run may take a node's slots only if, after every earlier waiter (smaller ticket)
is given what it needs of that node's free slots, enough are left. So slots freed on a node go to
the earliest waiter that needs them, and a later, smaller run never overtakes a waiting large one.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import select
import stat
import sys
import time

# subprocess and socket are imported where used: a grant's reply is on every run's start path, and the
# two are a third of this program's imports (the job's start, after the grant, has time for them).


def _folder(path):
    # type: (str) -> str
    """The lease folder: ``~`` expanded, ``%h`` as this node's hostname (plan.NODE_HOSTNAME; what
    ``hostname`` prints, as gethostname(2) is uname's nodename)."""
    return os.path.expanduser(path).replace("%h", os.uname().nodename)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

MUTEX = ".mutex"
RUN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
TICKET_RE = re.compile(r"[0-9]{19}-[A-Za-z0-9][A-Za-z0-9._-]{0,127}\Z")
MAX_RECORD = 65536
MAX_SLOTS = 1024
POLL = 0.05
GO_POLL, GO_FAST_S = 0.005, 5.0  # the go file is looked for this often for its first seconds (it comes
                                  # within a fraction of one: each look on the start's path costs it time)
MUTEX_WAIT = 30.0


# ---------------------------------------------------------------- node side

MARK = "CLUSTERDDP_LEASE "  # starts every reply line: a node's login shell may print a banner first


def _emit(obj: dict) -> None:
    sys.stdout.write(MARK + json.dumps(obj) + "\n")
    sys.stdout.flush()


def capacity(fallback: int) -> int:
    """The node's GPU count (``nvidia-smi -L``), or ``fallback`` where it has none (none on its PATH:
    not even started)."""
    if not _on_path("nvidia-smi"):
        return max(1, fallback)
    import subprocess
    try:
        out = subprocess.run(["nvidia-smi", "-L"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             timeout=30).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        out = ""
    n = sum(1 for line in out.splitlines() if line.startswith("GPU "))
    return n if n > 0 else max(1, fallback)


def _on_path(name: str) -> bool:
    return any(os.access(os.path.join(d or ".", name), os.X_OK)
               for d in os.environ.get("PATH", os.defpath).split(os.pathsep))


LOCK_MODE = 0o644  # every user of a shared (1777) lease folder can open (read-only) and flock it


def _open_regular(path: str, flags: int) -> int:
    """``path`` opened without blocking (a FIFO planted there would hang the open, and a reader
    holding the mutex with it) and without following a link; OSError unless it is a regular file."""
    fd = os.open(path, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("%s is not a regular file (remove it)" % path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_lock(path: str) -> int:
    # Read-only is enough for flock, so another user of a shared (1777) lease folder can take a slot
    # file someone else created. A new one gets LOCK_MODE whatever the creator's umask (with umask
    # 077 every other user's hold failed for good): made aside with its mode set, then linked into
    # place, which never replaces a file another user made meanwhile.
    try:
        return _open_regular(path, os.O_RDONLY)
    except FileNotFoundError:
        pass
    tmp = "%s.%d.%s.new" % (path, os.getpid(), os.urandom(4).hex())
    fd = os.open(tmp, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, LOCK_MODE)
    try:
        os.fchmod(fd, LOCK_MODE)
        os.link(tmp, path)
    except FileExistsError:  # another took it meanwhile: theirs is the one
        os.close(fd)
        fd = -1
    except BaseException:
        os.close(fd)
        raise
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    return fd if fd >= 0 else _open_regular(path, os.O_RDONLY)


def _try_lock(path: str) -> int | None:
    try:
        fd = _open_lock(path)
    except OSError as e:
        if os.path.lexists(path) and not isinstance(e, PermissionError):
            return None  # a FIFO, folder or link planted as a slot file: that slot is not to be had
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _mutex(folder: str) -> int:
    fd = _open_lock(os.path.join(folder, MUTEX))
    deadline = time.monotonic() + MUTEX_WAIT
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise OSError("the lease folder's mutex is held by a stuck process (%s)"
                              % os.path.join(folder, MUTEX)) from None
            time.sleep(POLL)


def _write_locked(folder: str, name: str, doc: dict) -> int:
    """Write ``doc`` as ``folder/name``, locked before it appears: no reader ever sees it unheld."""
    # a new name of its own (O_EXCL): a file another user planted under a guessable name could be
    # one whose lock they hold, and a blocking lock here would wait with the mutex held
    tmp = os.path.join(folder, ".%s.%d.%s.tmp" % (name, os.getpid(), os.urandom(4).hex()))
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.write(fd, json.dumps(doc).encode())
        os.fchmod(fd, 0o644)
        os.rename(tmp, os.path.join(folder, name))
    except BaseException:
        os.close(fd)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return fd


def read_live(folder: str, prefix: str) -> list:
    """The live records ``<prefix>*.json`` in ``folder`` (parsed, or ``{"garbled": name}``); removes
    the stale ones (nobody holds their lock)."""
    out = []  # type: list[dict]
    try:
        names = sorted(os.listdir(folder))
    except FileNotFoundError:
        return out
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".json")):
            continue
        path = os.path.join(folder, name)
        try:
            fd = _open_regular(path, os.O_RDONLY)
        except OSError:
            if os.path.lexists(path):  # a FIFO, a folder, a link: never read, but counted
                out.append({"garbled": name})
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:  # held: live
                data = os.read(fd, MAX_RECORD + 1)
                try:
                    doc = json.loads(data.decode("utf-8")) if len(data) <= MAX_RECORD else None
                except (ValueError, RecursionError):
                    doc = None
                out.append(doc if isinstance(doc, dict) else {"garbled": name})
                continue
            try:  # stale: remove it, unless it was replaced since we opened it
                if os.stat(path).st_ino == os.fstat(fd).st_ino:
                    os.unlink(path)
            except OSError:
                pass
        finally:
            os.close(fd)
    return out


def _int_list(v: Any) -> list:
    return [x for x in v if isinstance(x, int) and not isinstance(x, bool)] if isinstance(v, list) else []


def _reserved(queue: list, ticket: str | None, run: str, cap: int) -> tuple:
    """What the waiters before ``ticket`` (all of them for a run without one) claim of this node:
    their fixed slots, and how many slots the others need."""
    fixed, count, ahead = set(), 0, []
    for q in queue:
        t = q.get("ticket")
        if not isinstance(t, str) or q.get("run") == run or (ticket is not None and t >= ticket):
            continue
        ahead.append(q)
        slots = _int_list(q.get("slots"))
        if slots:
            fixed.update(slots)
        else:
            need = q.get("need")
            count += min(cap, need) if isinstance(need, int) and need > 0 else cap
    return fixed, count, ahead


def _hold(req: dict) -> int:
    folder = _folder(req["dir"])
    run = req["run"]
    if not RUN_RE.match(run):
        raise ValueError("bad run id")
    os.makedirs(folder, exist_ok=True)
    cap = capacity(int(req.get("fallback") or 1))
    fixed = req.get("slots")
    need = len(fixed) if fixed else (req.get("need") or cap)
    reply = {"ok": False, "capacity": cap}  # type: dict[str, Any]
    if fixed and any(s >= cap for s in fixed):
        reply.update(never=True, why="slot %d asked for, but the node has %d (0..%d)" % (max(fixed), cap, cap - 1))
        _emit(reply)
        return 0
    if need > cap:
        reply.update(never=True, why="needs %d slots, but the node has %d" % (need, cap))
        _emit(reply)
        return 0
    mutex = _mutex(folder)
    held = []
    try:
        leases = read_live(folder, "lease-")
        queue = read_live(folder, "queue-")
        res_fixed, res_count, ahead = _reserved(queue, req.get("ticket"), run, cap)
        reply.update(holders=leases, waiting=ahead)
        # Every free slot the earlier waiters have not fixed on is locked, to count them; a run fits
        # when, after its own, as many are left as the earlier waiters need.
        got = []
        for i in range(cap):
            if i in res_fixed:
                continue
            fd = _try_lock(os.path.join(folder, "slot-%d.lock" % i))
            if fd is not None:
                got.append((i, fd))
        if fixed:  # its own slots first, exactly those
            mine = set(fixed)
            got.sort(key=lambda x: x[0] not in mine)
            fits = mine <= {i for i, _ in got}
        else:
            fits = True
        if not fits or len(got) - need < res_count:
            for _, fd in got:
                os.close(fd)
            reply["why"] = "busy"
            _emit(reply)
            return 0
        for _, fd in got[need:]:
            os.close(fd)
        got = got[:need]
        held = [fd for _, fd in got]
        port = _port(folder, req.get("port"), held)
        if port is False:
            for fd in held:
                os.close(fd)
            reply["why"] = "port"
            _emit(reply)
            return 0
        doc = {"v": 1, "run": run, "name": req.get("name"), "user": req.get("user"), "host": req.get("host"),
               "since": req.get("since"),
               "slots": [i for i, _ in got], "port": port, "state": "starting", "pid": os.getpid()}
        name = "lease-%s.json" % run
        rec = _write_locked(folder, name, doc)
    finally:
        os.close(mutex)
    _emit({"ok": True, "slots": doc["slots"], "port": port, "capacity": cap})
    import subprocess  # now, while the launcher stages the run: not once the go file is there
    go = os.path.expanduser(req["go"])
    if not _wait(rec, lambda: os.path.exists(go), fast=GO_FAST_S):
        return 0  # released, or the launcher went away: the locks go with this process
    doc["state"] = "running"
    new = _write_locked(folder, name, doc)
    os.close(rec)
    fds = held + [new]
    p = subprocess.run(["bash", "-c", req["start"]], stdin=subprocess.DEVNULL, pass_fds=fds)
    _emit({"started": p.returncode == 0})
    return 0


def _port(folder: str, want: Any, held: list) -> Any:
    """On the master: lock the given port, or the first free one from ``from`` on (None: not the
    master). A port's lock file is held for the job's life, so no two runs ever pick the same port;
    the bind test skips ports other programs use. False when none can be had."""
    if not isinstance(want, dict):
        return None
    if want.get("fixed"):
        fd = _try_lock(os.path.join(folder, "port-%d.lock" % want["fixed"]))
        if fd is None:
            return False
        held.append(fd)
        return want["fixed"]
    import socket
    first = int(want.get("from") or 29500)
    for p in range(first, min(65536, first + int(want.get("span") or 100))):
        fd = _try_lock(os.path.join(folder, "port-%d.lock" % p))
        if fd is None:
            continue
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's TCPStore binds it
            s.bind(("", p))
        except OSError:
            os.close(fd)
            continue
        finally:
            s.close()
        held.append(fd)
        return p
    return False


def _wait(record_fd: int, done: Any, fast: float = 0.0) -> bool:
    """Until ``done()`` (True), or the record is removed or the launcher's channel closes (False).
    Looked at every GO_POLL for the first ``fast`` seconds, then every POLL."""
    poller = select.poll()
    poller.register(1, 0)  # no events asked: only POLLERR/POLLHUP, when the reading end is gone
    fast_until = time.monotonic() + fast
    while True:
        if done():
            return True
        every = GO_POLL if fast and time.monotonic() < fast_until else POLL
        if os.fstat(record_fd).st_nlink == 0 or poller.poll(int(every * 1000)):
            return False


def _queue(req: dict) -> int:
    folder = _folder(req["dir"])
    ticket = req["ticket"]
    if not TICKET_RE.match(ticket):
        raise ValueError("bad ticket")
    os.makedirs(folder, exist_ok=True)
    doc = {"v": 1, "ticket": ticket, "run": req.get("run"), "name": req.get("name"), "user": req.get("user"),
           "host": req.get("host"),
           "since": req.get("since"), "need": req.get("need"), "slots": req.get("slots")}
    fd = _write_locked(folder, "queue-%s.json" % ticket, doc)
    _emit({"queued": True})
    _wait(fd, lambda: False)
    return 0


def _list(req: dict) -> int:
    folder = _folder(req["dir"])
    _emit({"capacity": capacity(int(req.get("fallback") or 1)), "holders": read_live(folder, "lease-"),
           "waiting": read_live(folder, "queue-")})
    return 0


# ---------------------------------------------------------------- launcher side: reading a reply

MAX_REPLY = 1 << 20   # a node with a thousand leases answers in far less
MAX_ENTRIES = 1000
_TEXT_MAX = 128


def _text(v: Any) -> str:
    """Node text for a message: a short printable string, else ``?``."""
    if not isinstance(v, str) or not v or len(v) > _TEXT_MAX or not v.isprintable():
        return "?"
    return v


def _count(v: Any, lo: int, hi: int) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi else None


def _slots(v: Any) -> list | None:
    if not isinstance(v, list) or len(v) > MAX_SLOTS:
        return None
    out = [_count(x, 0, MAX_SLOTS - 1) for x in v]
    return None if None in out else sorted({x for x in out if x is not None})


def _name(v: Any) -> "str | None":
    """A run's ``--name`` from a node (None when the run has none: records written before names were)."""
    return None if v is None else _text(v)


def clean_holder(d: Any) -> dict:
    """A lease record from a node, every field checked (``garbled`` True when it is not one)."""
    if not isinstance(d, dict) or "garbled" in d or not isinstance(d.get("run"), str) \
            or not RUN_RE.match(d["run"]) or _slots(d.get("slots")) is None:
        return {"garbled": True}
    state = d.get("state") if d.get("state") in ("starting", "running") else "?"
    return {"garbled": False, "run": d["run"], "name": _name(d.get("name")), "user": _text(d.get("user")),
            "since": _text(d.get("since")),
            "host": _text(d.get("host")), "slots": _slots(d.get("slots")), "port": _count(d.get("port"), 1, 65535),
            "state": state}


def clean_waiter(d: Any) -> dict:
    """A queue entry from a node, every field checked (``garbled`` True when it is not one)."""
    if not isinstance(d, dict) or "garbled" in d or not isinstance(d.get("ticket"), str) \
            or not TICKET_RE.match(d["ticket"]):
        return {"garbled": True}
    return {"garbled": False, "ticket": d["ticket"], "run": _text(d.get("run")), "name": _name(d.get("name")),
            "user": _text(d.get("user")),
            "since": _text(d.get("since")), "host": _text(d.get("host")),
            "need": _count(d.get("need"), 1, MAX_SLOTS), "slots": _slots(d.get("slots")) or None}


def parse_reply(text: str) -> dict:
    """The first reply line (:data:`MARK`, whatever a login shell printed before it) of ``hold``,
    ``queue`` or ``list``, checked. Raises ValueError naming what is wrong; lists of holders and
    waiters are cleaned entry by entry (a garbled entry is kept as ``{"garbled": True}``, so it is
    counted, not trusted)."""
    if len(text) > MAX_REPLY:
        raise ValueError("a reply of over %d bytes" % MAX_REPLY)
    lines = text.split("\n")
    line = next((x[len(MARK):].rstrip("\r") for x in lines if x.startswith(MARK)), None)
    if line is None:
        said = next((x.strip() for x in lines if x.strip()), "")
        raise ValueError("no reply line: %r" % said[:80] if said else "no reply")
    try:
        d = json.loads(line)
    except RecursionError:  # 50,000 nested lists: no reply is nested more than three deep
        raise ValueError("JSON nested too deep: %r" % line[:80]) from None
    except ValueError:
        raise ValueError("not JSON: %r" % line[:80]) from None
    if not isinstance(d, dict):
        raise ValueError("not a JSON object: %r" % line[:80])
    if "error" in d:
        raise ValueError("the node program failed: %s" % _text(str(d["error"])[:_TEXT_MAX]))
    out = {}  # type: dict[str, Any]
    if "ok" in d:
        if not isinstance(d["ok"], bool):
            raise ValueError("ok: not true or false")
        out["ok"] = d["ok"]
    if "queued" in d:
        out["queued"] = d["queued"] is True
    if "capacity" in d or "ok" in d:
        cap = _count(d.get("capacity"), 1, MAX_SLOTS)
        if cap is None:
            raise ValueError("capacity: not a slot count (1..%d)" % MAX_SLOTS)
        out["capacity"] = cap
    if out.get("ok"):
        slots = _slots(d.get("slots"))
        if not slots:
            raise ValueError("slots: not a list of slot numbers")
        out["slots"] = slots
        port = d.get("port")
        if port is not None and _count(port, 1, 65535) is None:
            raise ValueError("port: not a port number")
        out["port"] = port
    for key, clean in (("holders", clean_holder), ("waiting", clean_waiter)):
        v = d.get(key, [])
        if not isinstance(v, list):
            raise ValueError("%s: not a list" % key)
        out[key] = [clean(x) for x in v[:MAX_ENTRIES]]
    out["never"] = d.get("never") is True
    out["why"] = _text(d.get("why")) if "why" in d else None
    return out


def main(argv: list) -> int:
    """argv: the mode (hold, queue or list); the request is one JSON object on stdin."""
    try:
        req = json.loads(sys.stdin.read())
        return {"hold": _hold, "queue": _queue, "list": _list}[argv[0]](req)
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        _emit({"error": "%s: %s" % (type(e).__name__, e)})
        return 3


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
