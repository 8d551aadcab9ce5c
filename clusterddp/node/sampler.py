"""``sampler``: the metrics sampler beside one node's job (on unless ``up --metrics-interval 0``), so that
a run keeps, with its logs, what its machines and its script did over time.

launch.sh (``nodescript.sampler_lines``) writes this source and the ``watch`` node program (whose line
reader, bounded regex and job ending it reuses) into ``$CTL/sampler/`` and starts
``python $CTL/sampler/sampler.py CTL JSON`` in the background before torchrun, its stdout the job's
node.log (its own lines start with ``[clusterddp]``), its stderr ``$CTL/sampler.log``. It carries the
job's ``CLUSTERDDP_JOB`` marker, so teardown, ``stop`` and ``prune`` end it with the job; it also ends
when launch.sh does. No daemon: it lives and dies with the job, as the stall watchdog does.

Every ``interval`` seconds it takes one sample:

- per GPU (``nvidia-smi --query-gpu=... --format=csv,noheader,nounits``, where there is one on PATH; at
  most :data:`SMI_TIMEOUT` seconds): utilisation %, memory used and total (MiB), power (W), temperature
  (C), SM clock (MHz), the active throttle reasons (a bit mask);
- the host: CPU busy % (``/proc/stat``), memory used (bytes), network and disk rates (bytes/s);
- the job's output (node.log, read as the watchdog reads it: :class:`watch.Lines`, at most
  :data:`watch.READ_MOST` bytes a chunk and :data:`watch.READ_BUDGET` seconds a look): progress lines
  (their count and rate), the numbers a line matching ``regex`` names by its named groups (searched in
  the line's first :data:`watch.MATCH_MOST` bytes, a leading ``.*`` dropped: ``watch.bounded_regex``),
  and the JSON lines ``clusterddp.train.log_metrics`` prints (``[clusterddp.metrics] {...}``), by rank.

``$CTL/metrics.jsonl`` (0600): a header line, then one JSON object a sample (:func:`sample_line`).
It never grows past ``most`` bytes: when the next line would pass it, every other sample is dropped
(the file rewritten whole, atomically) and from then on only every second (fourth, ...) sample is
written, its counts covering the samples not written. So a day-long run keeps its whole course at a
coarser grain. ``$CTL/metrics-now.json`` holds the latest sample (replaced whole every sample). An event
line (``{"event": "idle", "t": ..., "idle": {...}}``: the run found idle, below) is written whatever the
stride, and thinning keeps it, so the report's timeline and ``metrics --json`` can say when.

Idle policy (``idle``: {"below": %, "seconds": S, "stop": bool}; with ``nnodes`` > 1 also ``store``: [addr,
port] or null for ``$MASTER_ADDR``/``$MASTER_PORT``): the run is idle when every GPU of every node has been below
``below`` % utilisation for S seconds (:class:`RunIdle`). Each node's own GPUs decide whether it counts itself
idle (:class:`Idle`); with several nodes they share, as the stall watchdog does (``watch.Store``: the run's
rendezvous store, reached as a plain client from the job's python), a count of the nodes idle now
(``clusterddp/idle_nodes``: each adds 1 when it turns idle, -1 when it stops being); the first node to see it
equal to ``nnodes`` writes its name to ``clusterddp/idle_by`` (compare-and-set) and every node seeing the key
acts at its next sample. So one idle node whose peers are busy never fires it. Acting (:func:`on_idle`): says so
in the log once, writes ``$CTL/idle.json`` (0600; the run's policy, who decided, how many nodes) and, with
``stop``, adds itself to ``clusterddp/idle_stopped``, waits (at most :func:`stop_wait` seconds) for every
node to have seen it, and ends the job (``watch.end_job``: launch.sh then exits as the job did, and the run's
root cause is the idle policy: :mod:`clusterddp.idle`). A node without nvidia-smi is never idle, so a run
with one is never idle either; a node whose python has no torch, or that cannot reach the store, never
decides (and says so in the log).

Python 3.8 grammar, standard library only.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any  # noqa: F401 - in a type comment (Python 3.8 grammar)

# The watchdog's line reader, bounded regex and job ending: on the node, its source is written beside this
# file (nodescript.sampler_lines); in-process (tests), it is this package's module.
if __package__:
    from . import watch as watcher
else:  # pragma: no cover - on the node
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import watch as watcher  # type: ignore[no-redef]  # noqa: E402

SCHEMA = 1
INTERVAL = 5.0           # default seconds between samples
MOST = 2 << 20           # default bytes of metrics.jsonl, at most (a day at 5 s is about 4 MiB unthinned)
SMI_TIMEOUT = 10.0       # seconds nvidia-smi may take
MAX_METRICS = 32         # named metrics kept a sample (a regex's groups, a log_metrics call's names)
MAX_RANKS = 256          # ranks whose log_metrics lines are kept a sample
MAX_NAME = 64            # characters of a metric's name
JSON_MARK = b"[clusterddp.metrics] "  # clusterddp.train.log_metrics' lines
GPU_FIELDS = ("index", "utilization.gpu", "memory.used", "memory.total", "power.draw", "temperature.gpu",
              "clocks.sm", "clocks_throttle_reasons.active")
GPU_KEYS = ("index", "util", "mem", "mem_total", "power", "temp", "sm_clock", "throttle")
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]{0,63}$")


def number(text):
    """A finite float from ``text``, or None (``[N/A]``, garbage, NaN, inf, 1e400)."""
    try:
        v = float(text)
    except (TypeError, ValueError, OverflowError):
        return None
    return v if v == v and abs(v) != float("inf") else None


def parse_smi(text: str) -> list:
    """nvidia-smi's CSV answer (:data:`GPU_FIELDS`, no header, no units) as one dict a GPU."""
    gpus = []
    for line in text.splitlines()[:64]:
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(GPU_FIELDS):
            continue
        g = {}
        for i, key in enumerate(GPU_KEYS):
            cell = cells[i]
            if key == "throttle":
                try:
                    g[key] = int(cell, 16) if cell.lower().startswith("0x") else None
                except ValueError:
                    g[key] = None
            else:
                g[key] = number(cell)
        if g["index"] is None:
            continue
        g["index"] = int(g["index"])
        gpus.append(g)
    return gpus


def query_gpus():
    """This node's GPUs now, or None where there is no nvidia-smi (or it fails)."""
    try:
        r = subprocess.run(["nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits"],
                           stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=SMI_TIMEOUT)
    except (OSError, subprocess.SubprocessError):
        return None
    if r.returncode != 0:
        return None
    return parse_smi(r.stdout[:65536].decode("utf-8", "replace"))


def _read(path: str) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(1 << 20).decode("ascii", "replace")
    except OSError:
        return ""


def host_counters() -> dict:
    """The host's counters now: CPU jiffies (busy, total), memory (used bytes), network and disk bytes."""
    out = {}  # type: dict
    first = _read("/proc/stat").split("\n", 1)[0].split()
    if first[:1] == ["cpu"]:
        vals = [int(v) for v in first[1:] if v.isdigit()]
        idle = sum(vals[3:5]) if len(vals) >= 5 else 0
        out["cpu"] = (sum(vals[:8]) - idle, sum(vals[:8]))
    mem = {}
    for line in _read("/proc/meminfo").splitlines():
        k, _, v = line.partition(":")
        w = v.split()
        if w and w[0].isdigit():
            mem[k] = int(w[0]) * 1024
    if "MemTotal" in mem and "MemAvailable" in mem:
        out["mem"] = mem["MemTotal"] - mem["MemAvailable"]
        out["mem_total"] = mem["MemTotal"]
    rx = tx = 0
    for line in _read("/proc/net/dev").splitlines()[2:]:
        name, _, rest = line.partition(":")
        w = rest.split()
        if name.strip() != "lo" and len(w) >= 9 and w[0].isdigit() and w[8].isdigit():
            rx += int(w[0])
            tx += int(w[8])
    out["net"] = (rx, tx)
    try:
        disks = set(os.listdir("/sys/block"))
    except OSError:
        disks = set()
    rd = wr = 0
    for line in _read("/proc/diskstats").splitlines():
        w = line.split()
        whole = len(w) >= 10 and w[2] in disks and not w[2].startswith(("loop", "ram"))
        if whole and w[5].isdigit() and w[9].isdigit():
            rd += int(w[5]) * 512
            wr += int(w[9]) * 512
    out["disk"] = (rd, wr)
    return out


def host_sample(before: dict, now: dict, dt: float) -> dict:
    """CPU %, memory, network and disk rates between two :func:`host_counters`."""
    out = {}
    if "cpu" in before and "cpu" in now:
        busy, total = now["cpu"][0] - before["cpu"][0], now["cpu"][1] - before["cpu"][1]
        out["cpu"] = round(100.0 * busy / total, 1) if total > 0 else None
    for k in ("mem", "mem_total"):
        if k in now:
            out[k] = now[k]
    if dt > 0:
        for k, names in (("net", ("net_rx", "net_tx")), ("disk", ("disk_r", "disk_w"))):
            if k in before and k in now:
                for i, name in enumerate(names):
                    out[name] = max(0, round((now[k][i] - before[k][i]) / dt))
    return out


class Parsed(watcher.Lines):
    """node.log's lines as the watchdog reads them (progress: any line but clusterddp's own, blank and
    known noise, or the progress regex's), and the numbers in them: ``regex``'s named groups, and
    ``clusterddp.train.log_metrics``' JSON lines (by rank)."""

    def __init__(self, metrics_regex=None, progress_regex=None, skip=(), tails=()) -> None:
        watcher.Lines.__init__(self, progress_regex, skip, tails)
        self.metrics_rx = re.compile(watcher.bounded_regex(metrics_regex)) if metrics_regex else None
        self.values = {}  # type: dict  # name -> the last value since the last take()
        self.ranks = {}   # type: dict  # rank -> {name: last value}
        self.dropped = 0  # numbers that were no finite number (NaN, inf, 1e400), since the last take()

    def progress(self, line: bytes) -> bool:
        if line.startswith(JSON_MARK):
            self.json_line(line[len(JSON_MARK):watcher.MATCH_MOST])
            return True
        counted = watcher.Lines.progress(self, line)
        if self.metrics_rx is not None and line.strip() and not line.startswith(watcher.OURS):
            m = self.metrics_rx.search(line[:watcher.MATCH_MOST].decode("utf-8", "replace"))
            if m is not None:
                for k, v in m.groupdict().items():
                    self.keep(self.values, k, v)
        return counted

    def keep(self, into: dict, name, value) -> None:
        if not isinstance(name, str) or not NAME.match(name) or (name not in into and len(into) >= MAX_METRICS):
            return
        if value is None:
            return
        v = number(value) if not isinstance(value, bool) else None
        if v is None:
            self.dropped += 1
            return
        into[name] = v

    def json_line(self, data: bytes) -> None:
        try:
            rec = json.loads(data.decode("utf-8", "replace"))
        except ValueError:
            return
        if not isinstance(rec, dict):
            return
        rank = rec.get("rank")
        into = self.values
        if type(rank) is int and 0 <= rank < 1 << 20:
            if rank not in self.ranks and len(self.ranks) >= MAX_RANKS:
                return
            into = self.ranks.setdefault(rank, {})
        for k, v in rec.items():
            if k == "rank":
                continue
            if v is None:  # log_metrics' NaN or inf
                self.dropped += 1
                continue
            self.keep(into, k, v)
            if into is not self.values and k in into:
                into_node = self.values  # the node's own series: the last rank's value
                into_node[k] = into[k]

    def take(self):
        """(values, ranks, dropped) since the last take."""
        out = (self.values, self.ranks, self.dropped)
        self.values, self.ranks, self.dropped = {}, {}, 0
        return out


class Idle:
    """Whether every GPU of this node has stayed below ``below`` % for ``seconds`` (a monotonic clock)."""

    def __init__(self, below: float, seconds: float) -> None:
        self.below, self.seconds = below, seconds
        self.since = None  # type: float | None  # when every GPU was last found below, continuously since

    def feed(self, gpus, now: float) -> bool:
        utils = [g.get("util") for g in gpus or ()]
        if not utils or any(u is None or u >= self.below for u in utils):
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.seconds


class RunIdle:
    """Whether the whole run is idle (see the module docstring): this node's :class:`Idle`, and with
    several nodes the count of idle nodes in the run's store. :meth:`feed` gives the name of the node
    that found the run idle (this one, or the one that wrote ``idle_by`` first), or None."""

    def __init__(self, args: dict, idle: dict, stores=None) -> None:
        self.own = Idle(float(idle["below"]), float(idle["seconds"]))
        self.host = args.get("host", "") or "?"
        slurm = os.environ.get("SLURM_JOB_NUM_NODES", "")  # a Slurm run's nodes as allocated (nnodes: at least)
        self.nnodes = max(1, int(args.get("nnodes") or 1), int(slurm) if slurm.isdigit() and args.get("nnodes") else 0)
        self.store = None  # type: Any
        self.told = False  # whether this node's idleness is in the store's count
        self.off = False
        if self.nnodes > 1:
            addr, port = args.get("store") or (None, None)  # null: the node script's MASTER_ADDR/MASTER_PORT
            addr = addr or os.environ.get("MASTER_ADDR")
            port = str(port or os.environ.get("MASTER_PORT", ""))
            if not addr or not port.isdigit():
                self.stop_deciding("no master address and port for the run's store")
            else:
                self.store = (stores or watcher.Store)(addr, int(port))

    def stop_deciding(self, why: str) -> None:
        if not self.off:
            watcher.say("idle policy off on this node: %s (the run is not found idle)" % why)
        self.off = True

    def feed(self, gpus, now: float):
        mine = self.own.feed(gpus, now)
        if self.nnodes == 1:
            return self.host if mine else None
        store = self.store
        if self.off or store is None:
            return None
        try:
            if not store.connect():
                return None  # not up yet: this node is not counted, so the run is not idle
        except ImportError as e:
            self.stop_deciding("its python cannot reach the run's store (%s)" % e)
            return None
        count = store.add("idle_nodes", int(mine) - int(self.told))
        if count is None:
            self.off = True  # the store is gone: the master's torchrun has ended, and the run with it
            return None
        self.told = mine
        decided = store.has("idle_by")
        if decided:
            return store.first("idle_by", "") or "another node"
        if decided is not None and count >= self.nnodes:
            return store.first("idle_by", self.host) or self.host
        return None


def stop_wait(interval: float) -> float:
    """Seconds a node that stops the run for idleness waits for the others to have seen it (each looks at
    its next sample: an interval and an nvidia-smi call), so none is cut off by a peer's end first."""
    return 2 * interval + SMI_TIMEOUT + 5


Writer = watcher.Writer  # metrics.jsonl, kept under ``most`` bytes by thinning (see the module docstring)


def sample_line(t: float, dt: float, host: dict, gpus, progress: int, values: dict, ranks: dict,
                dropped: int) -> dict:
    """One sample as metrics.jsonl holds it."""
    s = {"t": round(t, 3), "dt": round(dt, 3), "progress": progress}  # type: dict
    s.update(host)
    if gpus is not None:
        s["gpus"] = gpus
    if values:
        s["m"] = values
    if ranks:
        s["ranks"] = {str(r): v for r, v in sorted(ranks.items())}
    if dropped:
        s["dropped"] = dropped
    return s


def main(argv: list) -> int:
    """``sampler CTL JSON``: the job's control folder, and {"interval", "regex" (metrics regex or null),
    "progress_regex", "skip", "tails", "most", "idle" (or null)}; the job's marker and host name from the
    environment (CLUSTERDDP_JOB, CLUSTERDDP_HOST). Runs until the job ends."""
    ctl = argv[0]
    args = json.loads(argv[1])
    args.update(ctl=ctl, marker=os.environ.get("CLUSTERDDP_JOB", ""), host=os.environ.get("CLUSTERDDP_HOST", ""))
    signal.signal(signal.SIGTERM, watcher.on_sigterm)  # launch.sh's kill at the job's end: one last sample, then out
    run(args, os.getppid())
    return 0


def run(args: dict, parent, clock=time.monotonic, sleep=time.sleep, gpus_now=query_gpus, counters=host_counters,
        samples=None, stores=None) -> None:
    """The sampling loop; ``parent`` None: no launch.sh to outlive (tests), ``samples``: how many to take,
    ``stores``: makes the run's store client from (addr, port) (tests; default ``watch.Store``)."""
    ctl = args["ctl"]
    interval = max(0.1, float(args.get("interval") or INTERVAL))
    parsed = Parsed(args.get("regex"), args.get("progress_regex"), args.get("skip", ()), args.get("tails", ()))
    try:
        log = open(os.path.join(ctl, "node.log"), "rb")
        parsed.pos = log.seek(0, 2)
    except OSError:
        log = None
    reader = watcher.Reader(log, parsed) if log is not None else None
    header = {"schema": SCHEMA, "kind": "clusterddp-samples", "host": args.get("host", ""), "interval": interval,
              "started": round(time.time(), 3), "regex": args.get("regex")}
    out = Writer(os.path.join(ctl, "metrics.jsonl"), header, args.get("most") or MOST)
    idle_args = args.get("idle")
    idle = RunIdle(args, idle_args, stores) if idle_args else None
    before, last_t, progress, taken = counters(), clock(), 0, 0
    final = False
    while not final:
        final = watcher.nap(interval, sleep)  # SIGTERM: the job has ended: what it printed since, without a GPU query
        if not final and watcher.job_over(ctl, parent):
            return  # launch.sh has ended: so has the job
        if reader is not None:
            n, _ = reader.look(clock())
            progress += n
        gpus = None if final else gpus_now()
        now_counters, now = counters(), clock()
        taken += 1
        if out.due() or final:
            values, ranks, dropped = parsed.take()
            dt = now - last_t
            line = sample_line(time.time(), dt, host_sample(before, now_counters, dt), gpus, progress, values,
                               ranks, dropped)
            data = (json.dumps(line, sort_keys=True) + "\n").encode()
            try:
                out.write(data)
                watcher.write_private(os.path.join(ctl, "metrics-now.json"), data)
            except OSError:
                pass
            before, last_t, progress = now_counters, now, 0
        by = idle.feed(None if final else gpus, now) if idle is not None else None
        if idle is not None and by is not None:
            rec = idle_record(args, idle, by)
            try:
                out.event((json.dumps({"event": "idle", "t": round(rec["time"], 3), "idle": rec},
                                      sort_keys=True) + "\n").encode())
            except OSError:
                pass
            on_idle(args, idle, by, interval, clock, sleep, rec)
            idle = None
        if samples is not None and taken >= samples:
            return


def idle_record(args: dict, idle: RunIdle, by: str) -> dict:
    """What idle.json holds: the policy, this node, when, how many nodes, who decided."""
    pol = args["idle"]
    return {"schema": SCHEMA, "host": args.get("host", ""), "time": time.time(), "below": pol["below"],
            "seconds": pol["seconds"], "stop": bool(pol.get("stop")), "nnodes": idle.nnodes, "decided_by": by}


def on_idle(args: dict, idle: RunIdle, by: str, interval: float, clock=time.monotonic, sleep=time.sleep,
            rec=None) -> None:
    """Say it, write idle.json (``rec``: :func:`idle_record`'s), and with ``stop`` end the job (once every
    node has seen it, or after :func:`stop_wait`)."""
    pol = args["idle"]
    stop = bool(pol.get("stop"))
    where = "this node" if idle.nnodes == 1 else "the run (%d nodes)" % idle.nnodes
    watcher.say("idle: GPU utilisation below %g%% on every GPU of %s for %gs%s"
          % (float(pol["below"]), where, float(pol["seconds"]), "; ending the job (idle_policy stop)" if stop else ""))
    rec = rec or idle_record(args, idle, by)
    try:
        watcher.write_private(os.path.join(args["ctl"], "idle.json"), json.dumps(rec).encode())
    except OSError:
        pass
    if not stop:
        return
    if idle.store is not None and not idle.off:
        seen = idle.store.add("idle_stopped", 1)
        end = clock() + stop_wait(interval)
        while seen is not None and seen < idle.nnodes and clock() < end:
            sleep(0.2)
            seen = idle.store.add("idle_stopped", 0)
    if args.get("marker"):
        watcher.end_job(args["marker"], {os.getpid(), os.getppid()})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
