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
regex when one is given (searched in the line's first :data:`MATCH_MOST` bytes, a leading ``.*``
dropped: :func:`bounded_regex`). ``\\r`` ends a line too (a progress bar). A line counts at the time
it was written (:class:`Reader`: the first look that found the log long enough to hold it), not when
the watcher got to it; each look reads until it has caught up or spent :data:`READ_BUDGET`, and while
it is behind the next look comes after a tenth of a tick. A watcher that is behind its log says so in
the log (at most once a minute), tells the other nodes (the store's ``clusterddp/behind`` count), and
no node declares a stall while any is behind: its own lag is no sign of a hang.

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
(``waiting`` for the other nodes' watchers, ``watching``, ``stalled``), ``behind`` (bytes of
node.log written and not read yet).

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
MATCH_MOST = 4096      # bytes of a line the progress regex is matched against (its cost per line is bounded)
READ_MOST = 1 << 20    # bytes of node.log read at a time (one chunk; a look reads chunks until caught up)
READ_BUDGET = 0.3      # seconds a look may spend reading before it says it is behind and ends the tick
SAY_BEHIND_EVERY = 60.0  # seconds between two "behind" notes in the log
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

    def __init__(self, regex=None, skip=(), tails=(), pos: int = 0) -> None:
        self.regex = re.compile(bounded_regex(regex)) if regex else None
        self.skip = [re.compile(p.encode()) for p in skip]
        self.tails = [re.compile(p.encode()) for p in tails]  # noise whose next indented line is its too
        self.rest = b""
        self.after_tail = False
        self.pos = pos        # the log's offset just past the bytes fed so far
        self.last_end = None  # type: int | None  # the offset just past the last progress line seen

    def feed(self, data: bytes) -> int:
        """How many progress lines ``data`` ends (an unended line waits for the next chunk)."""
        off = self.pos - len(self.rest)  # where the first line of this buffer starts in the log
        self.pos += len(data)
        buf = self.rest + data
        parts = re.split(b"[\r\n]", buf)
        self.rest = parts.pop()
        n = 0
        for line in parts:
            off += len(line) + 1
            if self.progress(line):
                n += 1
                self.last_end = off
        if len(self.rest) > MAX_LINE:
            if self.progress(self.rest):
                n += 1
                self.last_end = self.pos
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
        if self.regex is None:
            return True
        return self.regex.search(line[:MATCH_MOST].decode("utf-8", "replace")) is not None


def bounded_regex(regex: str) -> str:
    """The progress regex as the watcher searches each line with it: a leading ``.*`` (or ``.*?``) is
    dropped, as a search finds a line with or without it (a line holds no newline), while with it each
    search costs the square of the line's length."""
    while True:
        lead = ".*?" if regex.startswith(".*?") else ".*" if regex.startswith(".*") else ""
        if not lead or regex[len(lead):].startswith(("+", "{", "?", "*")):
            return regex  # none, or possessive (".*+" searches differently): as given
        regex = regex[len(lead):]


def regex_problem(regex: str):
    """Why the watcher refuses ``regex`` as a progress regex, or None (checked where the run is
    planned, not on the node): a repeat inside an unbounded repeat (``(a+)+``, ``(\\d*)*``), which can
    take exponential time on one line that almost matches."""
    import importlib
    try:  # the parser of re itself, for the pattern's shape (re._parser from Python 3.11, sre_parse before)
        sre = importlib.import_module("re._parser")
    except ImportError:  # pragma: no cover - Python < 3.11
        sre = importlib.import_module("sre_parse")
    try:
        tree = sre.parse(regex)
    except Exception:  # noqa: BLE001 - not compiling is the caller's message
        return None

    def repeats(items, inside: bool):
        for op, av in items:
            if op in (sre.MAX_REPEAT, sre.MIN_REPEAT):
                unbounded = av[1] == sre.MAXREPEAT
                if (inside and unbounded) or repeats(av[2], inside or unbounded):
                    return True
            elif op == sre.SUBPATTERN:
                if repeats(av[-1], inside):
                    return True
            elif op == sre.BRANCH:
                if any(repeats(b, inside) for b in av[1]):
                    return True
            elif op in (sre.ASSERT, sre.ASSERT_NOT):
                if repeats(av[1], inside):
                    return True
        return False

    try:
        slow = repeats(tree, False)
    except RecursionError:
        return "nested too deep"
    if slow:
        return "a repeat inside an unbounded repeat (e.g. (a+)+) can take exponential time on one line"
    return None


class Reader:
    """node.log as the watcher reads it, and when each of its bytes was there (a progress line is
    judged by the time it was written, not by when the watcher got to it).

    Each :meth:`look` notes the log's size and the (monotonic) time, then reads chunks until it has
    read that much or spent :data:`READ_BUDGET`; a line's time is that of the first look that found
    the log long enough to hold it (so at most a tick late, never later however far behind the
    reading is). ``behind``: bytes written by the look's start and not read yet."""

    def __init__(self, f, lines: Lines, budget=None) -> None:
        self.f, self.lines = f, lines
        self.budget = READ_BUDGET if budget is None else budget  # type: float
        self.seen = []  # type: list  # (size, time) of looks whose size the reading has not passed yet
        self.behind = 0

    def look(self, now: float, clock=time.monotonic):
        """Read what there is (within the budget): (progress lines read, the time the last was written
        or None)."""
        try:
            size = os.fstat(self.f.fileno()).st_size
        except OSError:
            size = self.lines.pos
        if size > self.lines.pos and (not self.seen or size > self.seen[-1][0]):
            self.seen.append((size, now))
        n, start = 0, clock()
        while self.lines.pos < size:
            data = self.f.read(min(READ_MOST, size - self.lines.pos))
            if not data:
                break  # the log was cut shorter: what is there was read
            n += self.lines.feed(data)
            if clock() - start >= self.budget:
                break
        self.behind = max(0, size - self.lines.pos)
        at = None
        if n and self.lines.last_end is not None:
            at = next((t for s, t in self.seen if s >= self.lines.last_end), now)
        self.seen = [(s, t) for s, t in self.seen if s > self.lines.pos]
        return n, at


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
        self.behind = False        # this node's watcher has not read all of its log yet
        self.others_behind = 0     # how many nodes' watchers say they are behind (the store's count)

    def local(self, n: int, now: float) -> None:
        """``n`` progress lines of this node's ranks, the last written at ``now``."""
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
        """Silent for the timeout; never while a watcher (this one or another node's) is behind its
        log: the lines it has not read may be progress, and its own lag is no sign of a hang."""
        return self.armed and not self.behind and self.others_behind <= 0 and now - self.last >= self.timeout

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


# ---- shared with the samplers beside the job (``sampler``, ``where``: this file is written beside them) ----

EVENT = b'{"event": '  # how an event line of a sample file starts (sorted keys: a sample's first key sorts before)


class Writer:
    """A sample file (``metrics.jsonl``, ``where.jsonl``: a header line, then one JSON line a sample) kept
    under ``most`` bytes by thinning: when the next line would pass it, every other sample is dropped (the
    file rewritten whole, atomically; an event line, which starts with :data:`EVENT`, is kept) and from then
    on only every second (fourth, ...) sample is written (:meth:`due`). 0600."""

    def __init__(self, path: str, header: dict, most: int) -> None:
        self.path, self.most = path, max(4096, int(most))
        self.stride, self.pending = 1, 0
        self.header = (json.dumps(header, sort_keys=True) + "\n").encode()
        self.size = len(self.header)
        write_private(path, self.header)

    def event(self, line: bytes) -> None:
        """An event line (it starts with :data:`EVENT`): written now, and kept by :meth:`thin`."""
        self.write(line, pending=self.pending)

    def due(self) -> bool:
        """Whether this sample is written (every ``stride``-th; :meth:`write` starts the count again)."""
        self.pending += 1
        return self.pending >= self.stride

    def write(self, line: bytes, pending: int = 0) -> None:
        self.pending = pending
        if self.size + len(line) > self.most:
            self.thin()
        if self.size + len(line) > self.most:
            return  # one line larger than what is left even thinned: dropped
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
        self.size += len(line)

    def thin(self) -> None:
        with open(self.path, "rb") as f:
            lines = f.read().splitlines(True)
        kept = [self.header] + [ln for i, ln in enumerate(lines[1:]) if i % 2 or ln.startswith(EVENT)]
        data = b"".join(kept)
        write_private(self.path, data)
        self.size, self.stride = len(data), self.stride * 2


class Stop(Exception):
    """SIGTERM: the job has ended."""


STOPPING = [False, False]  # [SIGTERM came, the loop sleeps now]


def on_sigterm(signum, frame):
    """A sampler's SIGTERM handler (launch.sh's kill at the job's end): out of :func:`nap` at once."""
    STOPPING[0] = True
    if STOPPING[1]:
        raise Stop()  # out of the sleep; otherwise the loop sees the flag after this sample


def nap(interval: float, sleep=time.sleep) -> bool:
    """Sleep ``interval`` seconds unless SIGTERM came (:func:`on_sigterm`); whether it came."""
    try:
        STOPPING[1] = True
        if not STOPPING[0]:
            sleep(interval)
    except Stop:
        pass
    finally:
        STOPPING[1] = False
    return STOPPING[0]


def job_over(ctl: str, parent) -> bool:
    """Whether launch.sh (``parent``; None: none to outlive, in tests) has ended, or written the job's exit code."""
    return parent is not None and (os.getppid() != parent or os.path.exists(os.path.join(ctl, "exit_code")))


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
    lines.pos = log.seek(0, 2)
    reader = Reader(log, lines)
    joined, pending, local_last, written = False, 0, None, 0.0
    told_behind, said_behind = False, None  # type: bool, float | None
    while True:
        if os.getppid() != parent or os.path.exists(os.path.join(ctl, "exit_code")):
            return  # launch.sh has ended: so has the job
        n, at = reader.look(clock())
        now = clock()
        if n:
            d.local(n, at)
            pending += n
            local_last = _wall(at, now)
        d.behind = reader.behind > 0
        if d.behind and (said_behind is None or now - said_behind >= SAY_BEHIND_EVERY):
            said_behind = now
            say("stall watchdog behind node.log by %.1f MiB (the job writes faster than it reads); "
                "no stall is declared until it has caught up" % (reader.behind / 1048576.0))
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
                behind = store.add("behind", int(d.behind) - int(told_behind))  # every node's lag is seen
                if value is None or watchers is None or hang is None or behind is None:
                    return  # the store is gone: the master's torchrun has ended, and the run with it
                told_behind, pending = d.behind, 0
                d.others_behind = behind - int(d.behind)
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
                    "timeout": d.timeout, "state": "stalled" if by else "watching" if d.armed else "waiting",
                    "behind": reader.behind}
            try:
                write_private(os.path.join(ctl, "watch.json"), json.dumps(view).encode())
            except OSError:
                pass
        if by is not None:
            on_hang(args, d, store, now, by)
            return
        time.sleep(TICK / 10 if d.behind else TICK)  # behind: read on at once (its store and file work go on)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
