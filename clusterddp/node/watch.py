"""``watch``: the stall watchdog beside one node's job (``up --stall-timeout S``), so that a run that
stops making progress ends itself with every rank's stacks, with or without a launcher attached.

launch.sh (``nodescript.watch_lines``) writes this source and the ``stacks`` node program into
``$CTL/watch/`` and starts ``python $CTL/watch/watch.py ARGS`` in the background before torchrun,
its stdout the job's node.log (its own lines start with ``[clusterddp]``), its stderr ``$CTL/watch.log``
(torch's C++ warnings about the store go there). It carries the job's ``CLUSTERDDP_JOB`` marker, so
teardown, ``stop`` and ``prune`` end it with the job; it also ends when launch.sh does.

Progress (:class:`Lines`): a line of node.log written after the watcher started (every rank of the
node writes there, through torchrun) that is not clusterddp's own (``[clusterddp]``), blank, known
torch noise (``skip``: ``clusterddp.noise``) or torch elastic's agent, and that matches the progress
regex when one is given. ``\\r`` ends a line too (a progress bar).

Agreement (:class:`Decider`): with one node, its own lines decide. With several, the nodes share a
counter in the run's own rendezvous store (torchrun's c10d TCPStore at the master's address and
port, which the master's torchrun serves for as long as it runs; torch 2.13's static and c10d
rendezvous both), reached as a plain client (no world size: it counts as no worker) from the job's
python, which has torch: each node adds its progress lines to ``clusterddp/progress`` and reads it
back every :data:`TICK` seconds; a change anywhere is seen everywhere within a tick. A node decides
only once every node's watcher has said it is there (``clusterddp/watchers``) and some node has seen
a progress line (the clock starts there: a job still starting is never cut short), and counts S
from the latest of: its own start, the moment every watcher was there, its own last progress line,
the last change of the counter it saw (the first reading counts as one). A watcher joining adds its
lines so far before it counts itself in, so none is missed. The first node to decide writes its name to
``clusterddp/hang_by`` (compare-and-set: the first writer wins); every node seeing the key acts at
once, so all act together even when only rank 0 prints. A node whose python has no torch, or that
cannot reach the store, never decides (and says so in the log); the store gone means the master's
torchrun has ended, and the watcher ends too.

When stalled, each node (:func:`on_hang`): takes its own ranks' stacks (the ``stacks`` node program,
as ``clusterddp stacks`` does: its reply goes to ``$CTL/hang-stacks.txt``), writes ``$CTL/hang.json``
(0600; :func:`hang_record`), adds itself to ``clusterddp/dumped`` and waits (at most
:data:`DUMP_WAIT` seconds, or until the store is gone) for every node to have done the same, so no
node ends its ranks (and with them the store, or the ranks another node is dumping) before the
others dumped theirs; then ends its job (SIGTERM to every process with the marker but itself and
launch.sh, SIGKILL after :data:`GRACE` seconds). launch.sh sees hang.json and exits 1.

``$CTL/watch.json`` (at most once a second, 0600, replaced whole): this node's view for ``top``:
``time`` (node clock), ``last_progress`` (this node's last progress line, epoch seconds or null),
``run_last_progress`` (the last progress anywhere as this node knows it), ``timeout``, ``state``
(``waiting`` for the other nodes' watchers, ``watching``, ``stalled``).

Python 3.8 grammar, standard library only (torch, where several nodes agree, from the job's python).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

TICK = 0.5             # seconds between looks at node.log and the store
WRITE_EVERY = 1.0      # seconds between watch.json writes
MAX_LINE = 65536       # bytes of an unended line kept; longer is a line of its own
READ_MOST = 1 << 20    # bytes of node.log read per look
STORE_TIMEOUT = 5.0    # seconds one store connection attempt or operation may take
STACKS_WAIT = 3.0      # seconds each rank has to write its stacks (as `clusterddp stacks`)
STACKS_TIMEOUT = 60.0  # the stacks program as a whole
DUMP_WAIT = 20.0       # seconds a node waits for the others' stacks before it ends its job
GRACE = 10.0           # seconds between SIGTERM and SIGKILL of the job's processes (as teardown's)
PREFIX = "clusterddp/"
OURS = b"[clusterddp]"
SCHEMA = 1


class Lines:
    """Progress lines in node.log's bytes, fed in chunks as they come (a line may span chunks)."""

    def __init__(self, regex=None, skip=(), tails=()) -> None:
        self.regex = re.compile(regex) if regex else None
        self.skip = [re.compile(p.encode()) for p in skip]
        self.tails = [re.compile(p.encode()) for p in tails]  # noise whose next indented line is its too
        self.rest = b""
        self.after_tail = False

    def feed(self, data: bytes) -> int:
        """How many progress lines ``data`` ends (an unended line waits for the next chunk)."""
        buf = self.rest + data
        parts = re.split(b"[\r\n]", buf)
        self.rest = parts.pop()
        n = sum(1 for line in parts if self.progress(line))
        if len(self.rest) > MAX_LINE:
            n += self.progress(self.rest)
            self.rest = b""
        return n

    def progress(self, line: bytes) -> bool:
        tail, self.after_tail = self.after_tail, False
        if not line.strip() or line.startswith(OURS):
            return False
        if tail and line.startswith((b" ", b"\t")):
            return False
        if any(p.search(line) for p in self.tails):
            self.after_tail = True
            return False
        if any(p.search(line) for p in self.skip):
            return False
        return self.regex is None or self.regex.search(line.decode("utf-8", "replace")) is not None


class Decider:
    """Whether the run is stalled, from what this node sees; ``now`` is a monotonic clock's reading.

    The clock starts at the first progress line anywhere: a job still starting (torch's import, a
    dataset loaded before the first print) is never cut short; nodes that never meet are the join
    timeout's."""

    def __init__(self, timeout: float, now: float, nnodes: int = 1) -> None:
        self.timeout = timeout
        self.nnodes = nnodes
        self.last = now            # the latest sign of progress anywhere, as this node knows it
        self.value = None  # type: int | None  # the shared counter as last read (None: not read yet)
        self.seen = False          # any progress line yet, anywhere
        self.watchers = 1 if nnodes == 1 else 0

    def local(self, n: int, now: float) -> None:
        """``n`` progress lines of this node's ranks seen at ``now``."""
        if n:
            self.last = max(self.last, now)
            self.seen = self.seen or self.nnodes == 1

    def shared(self, value: int, watchers: int, now: float) -> None:
        """The store read at ``now``: the progress counter and how many nodes' watchers joined."""
        if value != self.value:
            self.value = value
            self.last = max(self.last, now)
        self.seen = self.seen or value > 0
        if watchers >= self.nnodes > self.watchers:
            self.last = max(self.last, now)  # every watcher there from now: what some missed before is unknown
        self.watchers = max(self.watchers, watchers)

    @property
    def armed(self) -> bool:
        return self.watchers >= self.nnodes and self.seen

    def stalled(self, now: float) -> bool:
        return self.armed and now - self.last >= self.timeout

    def silent(self, now: float) -> float:
        return now - self.last


class Store:
    """The run's rendezvous store as a client, keys under :data:`PREFIX`; ``ok`` False once it is gone."""

    def __init__(self, addr: str, port: int) -> None:
        self.addr, self.port = addr, port
        self.s = None  # type: object
        self.gone = False

    def connect(self) -> bool:
        """One attempt (up to STORE_TIMEOUT); True once connected. Raises ImportError without torch."""
        if self.s is not None:
            return True
        from datetime import timedelta

        from torch.distributed import TCPStore
        try:
            self.s = TCPStore(self.addr, self.port, is_master=False, wait_for_workers=False,
                              timeout=timedelta(seconds=STORE_TIMEOUT))
        except Exception:  # noqa: BLE001 - not up yet (or never): tried again next tick
            return False
        return True

    def _do(self, fn):
        """``fn(store)``; None once the store is gone (the master's torchrun has ended, and the run with it)."""
        if self.s is None or self.gone:
            return None
        try:
            return fn(self.s)
        except Exception:  # noqa: BLE001 - gone: every later call is None too
            self.gone = True
            return None

    def add(self, key: str, n: int):
        """The counter ``key`` after adding ``n``."""
        return self._do(lambda s: int(s.add(PREFIX + key, n)))

    def first(self, key: str, value: str):
        """``key`` set to ``value`` unless it is set already: the value it holds then (the first writer's)."""
        got = self._do(lambda s: s.compare_set(PREFIX + key, "", value))
        return None if got is None else got.decode("utf-8", "replace")[:255]

    def has(self, key: str):
        return self._do(lambda s: bool(s.check([PREFIX + key])))


def write_private(path: str, data: bytes) -> None:
    """``data`` as ``path``, 0600, replaced whole (a reader never sees half of it)."""
    tmp = "%s.%d.tmp" % (path, os.getpid())
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def say(text: str) -> None:
    """A line of ours in the job's log (stdout is node.log)."""
    try:
        sys.stdout.write("[clusterddp] %s\n" % text)
        sys.stdout.flush()
    except (OSError, ValueError):
        pass


def _wall(mono: float, now_mono: float) -> float:
    return time.time() - (now_mono - mono)


def hang_record(args: dict, d: Decider, now: float, by: object, stacks: str, dumped: object) -> dict:
    """What ``$CTL/hang.json`` holds (the launcher reads it with ``clusterddp.hang.parse_node``)."""
    return {"schema": SCHEMA, "host": args.get("host", ""), "time": time.time(), "timeout": d.timeout,
            "silent_s": round(d.silent(now), 3), "last_progress": _wall(d.last, now),
            "decided_by": by, "nnodes": d.nnodes, "dumped": dumped, "stacks": stacks}


def marked_pids(marker: str) -> dict:
    """The job's processes: pid -> its command line."""
    want = ("CLUSTERDDP_JOB=%s" % marker).encode()
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                if want in f.read().split(b"\0"):
                    with open("/proc/%s/cmdline" % name, "rb") as c:
                        out[int(name)] = c.read(4096)
        except OSError:
            pass
    return out


def _agent(cmdline: bytes) -> bool:
    words = cmdline.split(b"\0")
    return b"torch.distributed.run" in words or os.path.basename(words[0]) == b"torchrun"


def end_job(marker: str, spare: set) -> str:
    """End every process of the job but ``spare``: torchrun's agents first, with SIGKILL (on SIGTERM an
    agent stops its ranks itself, and prints a traceback of its own ending into the log that says
    nothing of the hang), then the rest with SIGTERM, SIGKILL for what is left after GRACE. What it did."""
    procs = marked_pids(marker)
    for p in [p for p, cmd in procs.items() if p not in spare and _agent(cmd)]:
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    pids = [p for p in procs if p not in spare]
    for sig, word in ((signal.SIGTERM, "terminated"), (signal.SIGKILL, "killed")):
        for p in pids:
            try:
                os.kill(p, sig)
            except OSError:
                pass
        deadline = time.monotonic() + GRACE
        while pids and time.monotonic() < deadline:
            time.sleep(0.1)
            pids = [p for p in marked_pids(marker) if p not in spare]
        if not pids:
            return word
    return "survivors %s" % " ".join(map(str, pids))


def take_stacks(args: dict) -> str:
    """This node's ranks' stacks by the ``stacks`` node program; its reply saved as hang-stacks.txt.
    The file's name, or why there is none."""
    ctl = args["ctl"]
    request = json.dumps({"ctl": ctl, "marker": args["marker"], "wait": STACKS_WAIT})
    try:
        r = subprocess.run([sys.executable, "-S", os.path.join(ctl, "watch", "stacks.py"), request],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=STACKS_TIMEOUT)
    except (OSError, subprocess.SubprocessError) as e:
        return "error: the stacks program failed: %s" % e
    write_private(os.path.join(ctl, "hang-stacks.txt"), r.stdout)
    return "hang-stacks.txt"


def on_hang(args: dict, d: Decider, store, now: float, by: object) -> None:
    """Stacks, hang.json, wait for the other nodes' stacks, end the job."""
    ctl = args["ctl"]
    say("stall: no progress on any node for %.0fs (stall timeout %gs)%s; taking every rank's stacks"
        % (d.silent(now), d.timeout, "" if by in (None, args.get("host")) else ", seen first on %s" % by))
    stacks = take_stacks(args)
    path = os.path.join(ctl, "hang.json")
    write_private(path, json.dumps(hang_record(args, d, now, by, stacks, None)).encode())
    dumped = None
    if store is not None:
        dumped = store.add("dumped", 1)
        deadline = time.monotonic() + DUMP_WAIT
        while dumped is not None and dumped < d.nnodes and time.monotonic() < deadline:
            time.sleep(0.2)
            dumped = store.add("dumped", 0)
        write_private(path, json.dumps(hang_record(args, d, now, by, stacks, dumped)).encode())
    say("stall: ending the job on this node")
    end_job(args["marker"], {os.getpid(), os.getppid()})


def main(argv: list) -> int:
    """``watch CTL JSON``: the job's control folder, and {"timeout", "regex" (or null), "skip", "tails",
    "nnodes", "store": [addr, port]} (either null: ``$MASTER_ADDR``/``$MASTER_PORT``, for a node script
    that finds the master on the node); the job's marker and host name from the environment
    (CLUSTERDDP_JOB, CLUSTERDDP_HOST). Runs until the job ends, or has ended it."""
    ctl = argv[0]
    args = json.loads(argv[1])
    args.update(ctl=ctl, log=os.path.join(ctl, "node.log"), marker=os.environ.get("CLUSTERDDP_JOB", ""),
                host=os.environ.get("CLUSTERDDP_HOST", ""))
    if not args["marker"]:
        say("stall watchdog off on this node: no CLUSTERDDP_JOB marker")
        return 0
    parent = os.getppid()
    try:
        run(args, parent)
    finally:
        try:
            write_private(os.path.join(ctl, "watch.done"), b"")
        except OSError:
            pass
    return 0


def run(args: dict, parent: int) -> None:
    ctl = args["ctl"]
    nnodes = int(args.get("nnodes", 1))
    clock = time.monotonic
    lines = Lines(args.get("regex"), args.get("skip", ()), args.get("tails", ()))
    d = Decider(float(args["timeout"]), clock(), nnodes)
    store = None
    if nnodes > 1:
        addr, port = args.get("store") or (None, None)  # null: the node script's MASTER_ADDR/MASTER_PORT (Slurm)
        addr = addr or os.environ.get("MASTER_ADDR")
        port = str(port or os.environ.get("MASTER_PORT", ""))
        if not addr or not port.isdigit():
            say("stall watchdog off on this node: no master address and port for the run's store")
            return
        store = Store(addr, int(port))
    try:
        log = open(args["log"], "rb")
    except OSError as e:
        say("stall watchdog off on this node: cannot read %s: %s" % (args["log"], e.strerror))
        return
    log.seek(0, 2)
    joined, pending, local_last, written = False, 0, None, 0.0
    while True:
        if os.getppid() != parent or os.path.exists(os.path.join(ctl, "exit_code")):
            return  # launch.sh has ended: so has the job
        n = lines.feed(log.read(READ_MOST))
        now = clock()
        if n:
            d.local(n, now)
            pending += n
            local_last = time.time()
        by = None
        if store is not None:
            try:
                connected = store.connect()
            except ImportError as e:
                say("stall watchdog off on this node: its python cannot reach the run's store (%s)" % e)
                return
            if connected and not joined:  # its lines so far first, then itself: none is missed by the others
                joined = store.add("progress", pending) is not None and store.add("watchers", 1) is not None
                pending = 0
            if joined:
                value = store.add("progress", pending)
                watchers = d.watchers if d.armed else store.add("watchers", 0)
                hang = store.has("hang_by")
                if value is None or watchers is None or hang is None:
                    return  # the store is gone: the master's torchrun has ended, and the run with it
                pending = 0
                d.shared(value, watchers, now)
                if hang:
                    by = store.first("hang_by", "") or "another node"
        if by is None and d.stalled(now):
            by = args.get("host", "")
            if store is not None:  # the first node to decide is the one named; the others follow it
                by = store.first("hang_by", by) or by
        if now - written >= WRITE_EVERY:
            written = now
            view = {"time": time.time(), "last_progress": local_last, "run_last_progress": _wall(d.last, now),
                    "timeout": d.timeout, "state": "stalled" if by else "watching" if d.armed else "waiting"}
            try:
                write_private(os.path.join(ctl, "watch.json"), json.dumps(view).encode())
            except OSError:
                pass
        if by is not None:
            on_hang(args, d, store, now, by)
            return
        time.sleep(TICK)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
