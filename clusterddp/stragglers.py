"""The slow node, named: which host's ranks the others wait for, since when, and why.

In synchronous DDP every rank steps at the same rate, so the progress rate cannot tell; the slow rank
is the one the others wait for. Each node's rank sampler (``clusterddp/node/where.py``) writes, every
few seconds, where each of its ranks is: ``w`` (inside a collective, a wait, or autograd's
``backward``, where DDP waits for every rank's gradients) or ``c`` (in its own code, or computing).
A fast rank waits for the slow one most of the time; the slow one almost never.

:func:`decide` (pure): at each evaluation time, each rank's *wait share* over the last
:data:`WINDOW` samples of its host (at least :data:`MIN_SAMPLES` of them known); a rank is slow when
its share is :data:`GAP` or more below the reference, and the reference at least :data:`MIN_REF`
(the others really do wait). The reference of a rank is the median share of the ranks on the other
hosts (a whole slow node stands out against the rest), or, in a one-host run, of the other ranks.
When every rank slows down together (the same extra work everywhere), every share falls together and
no rank stands out: nothing is named. A host is named (:class:`Straggler`) once its ranks have been
slow at :data:`MIN_STREAK` evaluations in a row; ``since`` is the first of them (the slowness began
at most a window earlier), ``until`` the last (None while it still holds at the newest samples).

``why``: what the samples of that host, compared with the others', suggest: a GPU throttled on
temperature or power or clocked well below the others' (the metrics sampler's ``metrics.jsonl``,
where there is one), another process on its GPUs, the job's CPU cgroup held back by its quota, its
ranks waiting for a CPU (runnable, not running) much more than the others', a CPU saturated by
something else (and its busiest process); otherwise where its ranks are in their
own code while the others wait.

:func:`stragglers_of` reads a run folder's samples (brought back with the logs: :func:`fetch_nodes`)
and gives ``clusterddp metrics RUN --json``'s ``stragglers`` list; ``top`` decides from the end of each
node's file, and :class:`Watch` does so every :data:`WATCH_EVERY` seconds beside an attached run, to tell
each newly named straggler (``notify``'s ``straggler`` event, and a warning line). Nothing here prints.
"""

from __future__ import annotations

import json
import statistics
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import nodeops
from . import plan as ssh_plan
from .errors import FileRefused
from .files import read_bounded
from .fleet import Fleet
from .node import where as node_where
from .nodescript import WHERE_SAMPLES, qpath
from .store import RunStore
from .transport import Transport

WINDOW = 20         # samples of a host a rank's wait share is taken over
MIN_SAMPLES = 10    # known samples of a rank (w or c) needed to judge it
GAP = 0.3           # how far below the reference a slow rank's wait share is
MIN_REF = 0.3       # the reference's wait share, at least: the others really wait
MIN_STREAK = 3      # evaluations in a row a host's ranks are slow before it is named
MAX_EVALS = 2000    # evaluation times over a run, at most (evenly spread over its samples)
GPU_SLOW_CLOCK = 0.8   # a GPU whose SM clock is below this share of the others' median is slow
CPU_SATURATED = 90.0   # host CPU busy %, from which it counts as saturated
CPU_OTHER = 25.0       # % of the host's CPU outside the job that may explain a slow node
THROTTLED = 0.1        # share of time the job's CPU cgroup was held back that explains a slow node
CPU_WAIT = 0.2         # share of time its ranks were runnable but not running (and this much above the others')
MOST_FILE = node_where.PARSE_MOST
MOST_METRICS = 8 << 20  # bytes of a node's metrics.jsonl (the metrics sampler's) read for GPU evidence

# nvidia-smi's clocks_throttle_reasons bits that slow a GPU down, in words
THROTTLE = ((0x04, "its power cap"), (0x08, "a hardware slowdown"), (0x20, "temperature (software)"),
            (0x40, "temperature (hardware)"), (0x80, "a power brake"))


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one time, from the metrics sampler's file."""

    t: float
    index: int
    sm_clock: float | None
    throttle: int | None
    temp: float | None
    util: float | None


@dataclass(frozen=True)
class HostSamples:
    """One host's samples: the rank sampler's (``where.parse``'s dicts, in time order) and its GPUs'."""

    host: str
    samples: tuple[dict, ...]
    gpus: tuple[GpuSample, ...] = ()


@dataclass(frozen=True)
class Straggler:
    """A host whose ranks the others waited for, from ``since`` to ``until`` (None: still)."""

    host: str
    ranks: tuple[int, ...]
    since: float
    until: float | None
    why: str
    wait_share: float          # the slow ranks' wait share when last named
    others_wait_share: float   # the reference's then

    def to_json(self) -> dict:
        return {"host": self.host, "ranks": list(self.ranks), "since": self.since, "until": self.until,
                "why": self.why, "wait_share": round(self.wait_share, 3),
                "others_wait_share": round(self.others_wait_share, 3)}


@dataclass
class _Open:
    since: float
    last: float
    streak: int
    ranks: set[int] = field(default_factory=set)
    window: list[float] = field(default_factory=list)  # (start, end) of the last window it was slow in
    share: float = 0.0
    ref: float = 0.0


def _window(samples: Sequence[dict], end: float) -> list[dict]:
    """The host's last :data:`WINDOW` samples at or before ``end``."""
    lo, hi = 0, len(samples)
    while lo < hi:
        mid = (lo + hi) // 2
        if samples[mid]["t"] <= end:
            lo = mid + 1
        else:
            hi = mid
    return list(samples[max(0, lo - WINDOW):lo])


def shares(window: Sequence[dict]) -> dict[int, tuple[float, int]]:
    """rank -> (its wait share, known samples) over ``window``."""
    waits: dict[int, list[int]] = {}
    for s in window:
        for rank, (state, _) in s["ranks"].items():
            if state in ("w", "c"):
                w = waits.setdefault(rank, [0, 0])
                w[0] += state == "w"
                w[1] += 1
    return {r: (w / n, n) for r, (w, n) in waits.items() if n}


def slow_ranks(by_host: Mapping[str, dict[int, tuple[float, int]]]) -> dict[str, tuple[set[int], float, float]]:
    """Which ranks are slow, by host: (the ranks, their mean wait share, the reference), from each
    host's ranks' :func:`shares`."""
    known = {h: {r: s for r, (s, n) in rs.items() if n >= MIN_SAMPLES} for h, rs in by_host.items()}
    out: dict[str, tuple[set[int], float, float]] = {}
    for host, rs in known.items():
        others = [s for h, o in known.items() if h != host for s in o.values()]
        for rank, share in rs.items():
            pool = others or [s for r, s in rs.items() if r != rank]
            if not pool:
                continue
            ref = statistics.median(pool)
            if ref >= MIN_REF and ref - share >= GAP:
                got = out.setdefault(host, (set(), 0.0, ref))
                got[0].add(rank)
        if host in out:
            slow = out[host][0]
            out[host] = (slow, sum(rs[r] for r in slow) / len(slow), out[host][2])
    return out


def _times(hosts: Sequence[HostSamples]) -> list[float]:
    ts = sorted({s["t"] for h in hosts for s in h.samples})
    if len(ts) > MAX_EVALS:
        step = len(ts) / MAX_EVALS
        ts = [ts[int(i * step)] for i in range(MAX_EVALS)] + [ts[-1]]
    return ts


def decide(hosts: Sequence[HostSamples]) -> list[Straggler]:
    """Every straggler the samples show, oldest first (see the module docstring); ``until`` None for those
    that still hold at the newest evaluation."""
    if len([h for h in hosts if h.samples]) == 0:
        return []
    ordered = [HostSamples(h.host, tuple(sorted(h.samples, key=lambda s: s["t"])), h.gpus) for h in hosts]
    times = _times(ordered)
    open_: dict[str, _Open] = {}
    done: list[tuple[str, _Open, float | None]] = []
    for t in times:
        windows = {h.host: _window(h.samples, t) for h in ordered}
        slow = slow_ranks({h: shares(w) for h, w in windows.items()})
        for host in list(open_):
            if host not in slow:
                o = open_.pop(host)
                if o.streak >= MIN_STREAK:
                    done.append((host, o, o.last))
        for host, (ranks, share, ref) in slow.items():
            o = open_.setdefault(host, _Open(t, t, 0))
            o.streak += 1
            o.last = t
            o.ranks |= ranks
            w = windows[host]
            o.window = [w[0]["t"], w[-1]["t"]] if w else [t, t]
            o.share, o.ref = share, ref
    for host, o in open_.items():
        if o.streak >= MIN_STREAK:
            done.append((host, o, None))
    by = {h.host: h for h in ordered}
    out = [Straggler(host, tuple(sorted(o.ranks)), o.since, until, why(by[host], ordered, o.window, o.ranks),
                     o.share, o.ref) for host, o, until in done]
    return sorted(out, key=lambda s: (s.since, s.host))


# ---- why ----

def _between(samples: Iterable, lo: float, hi: float) -> list:
    return [s for s in samples if lo <= (s["t"] if isinstance(s, dict) else s.t) <= hi]


def _median(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return statistics.median(vs) if vs else None


def why(h: HostSamples, hosts: Sequence[HostSamples], window: Sequence[float], ranks: Iterable[int]) -> str:
    """What the samples of ``h`` over ``window`` (start, end), against the other hosts', suggest."""
    lo, hi = window[0], window[1]
    others = [o for o in hosts if o.host != h.host]
    reasons: list[str] = []
    # the GPUs: throttle reasons, and clocks well below the others'
    mine = _between(h.gpus, lo, hi)
    theirs = [g for o in others for g in _between(o.gpus, lo, hi)]
    their_clock = _median(g.sm_clock for g in theirs)
    for idx in sorted({g.index for g in mine}):
        gs = [g for g in mine if g.index == idx]
        bits = 0
        for g in gs:
            bits |= g.throttle or 0
        words = [w for b, w in THROTTLE if bits & b]
        clock = _median(g.sm_clock for g in gs)
        slow_clock = clock is not None and their_clock and clock < GPU_SLOW_CLOCK * their_clock
        temp = _median(g.temp for g in gs)
        if words or slow_clock:
            said = f"GPU {idx} throttled by {' and '.join(words)}" if words else f"GPU {idx} clocked low"
            if clock is not None:
                said += f" (SM clock {clock:.0f} MHz" + (f" against {their_clock:.0f} elsewhere" if their_clock else "")
                said += f", {temp:.0f} C)" if temp is not None else ")"
            reasons.append(said)
    samples = _between(h.samples, lo, hi)
    apps = sorted({a for s in samples for a in (s.get("gpu_others") or ())})
    if apps:
        reasons.append("another process on its GPUs: " + ", ".join(apps[:3]))
    thr = _median(s.get("throttled") for s in samples)
    if thr is not None and thr >= THROTTLED:
        reasons.append(f"its CPU quota (the cgroup's cpu.max) held its ranks back {thr:.0%} of the time")
    wait, their_wait = (_median(s.get("cpu_wait") for s in samples),
                        _median(s.get("cpu_wait") for o in others for s in _between(o.samples, lo, hi)))
    if (thr is None or thr < THROTTLED) and wait is not None and wait >= CPU_WAIT and \
            (their_wait is None or wait - their_wait >= CPU_WAIT):
        reasons.append(f"its ranks waited for a CPU {wait:.0%} of the time (runnable, not running: a CPU quota "
                       "or other processes on its CPUs)")
    cpu, other = _median(s.get("cpu") for s in samples), _median(s.get("cpu_other") for s in samples)
    their_other = _median(s.get("cpu_other") for o in others for s in _between(o.samples, lo, hi))
    if (cpu is not None and other is not None and cpu >= CPU_SATURATED and other >= CPU_OTHER
            and (their_other is None or other - their_other >= CPU_OTHER)):
        tops = [s["other_top"] for s in samples if s.get("other_top")]
        busiest = max(set(tops), key=tops.count) if tops else None
        reasons.append(f"its CPUs saturated ({cpu:.0f}% busy) by something else: {other:.0f}% outside the job"
                       + (f", most of it {busiest}" if busiest else ""))
    places = [where for s in samples for r, (state, where) in s["ranks"].items() if r in set(ranks) and state == "c"]
    if places:
        top = max(set(places), key=places.count)
        reasons.append(f"its ranks are in their own code (most often {top}) while the others wait in "
                       "all_reduce/backward")
    return "; ".join(reasons) or "its ranks arrive last at each collective"


# ---- a run folder's samples ----

WHERE_DIR = "where"   # <run>/where/<host>/where.jsonl


def parse_gpus(data: bytes) -> tuple[GpuSample, ...]:
    """The GPU samples in a metrics sampler's file (``metrics.jsonl``: a JSON object a line with ``t`` and
    ``gpus``), every value checked; other lines dropped. Never raises."""
    out: list[GpuSample] = []

    def num(v: object) -> float | None:
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or not -1e9 < v < 1e9:
            return None
        return float(v)
    for raw in data[:MOST_METRICS].split(b"\n"):
        if len(out) >= 500000 or not raw.strip() or len(raw) > node_where.MAX_LINE:
            continue
        try:
            rec = json.loads(raw.decode("utf-8", "replace"))
        except (ValueError, RecursionError):
            continue
        if not isinstance(rec, dict) or not isinstance(rec.get("gpus"), list):
            continue
        t = num(rec.get("t"))
        if t is None or t < 0:
            continue
        for g in rec["gpus"][:64]:
            if not isinstance(g, dict):
                continue
            idx, thr = g.get("index"), g.get("throttle")
            if not isinstance(idx, int) or isinstance(idx, bool) or not 0 <= idx < 1024:
                continue
            ok_thr = isinstance(thr, int) and not isinstance(thr, bool) and 0 <= thr < 1 << 64
            out.append(GpuSample(t, idx, num(g.get("sm_clock")), thr if ok_thr else None,
                                 num(g.get("temp")), num(g.get("util"))))
    return tuple(out)


def host_samples(host: str, where: bytes, metrics: bytes = b"") -> HostSamples:
    """One host's samples from its files' bytes (untrusted)."""
    _, samples = node_where.parse(where)
    return HostSamples(host, tuple(samples), parse_gpus(metrics))


def read_run(run_dir: Path) -> list[HostSamples]:
    """Every host's samples in a run folder: ``where/<host>/where.jsonl``, and the metrics sampler's GPU
    samples where it left them (``metrics/<host>/samples.jsonl``)."""
    base = Path(run_dir) / WHERE_DIR
    out = []
    try:
        hosts = sorted(p.name for p in base.iterdir() if p.is_dir())
    except OSError:
        return []
    for host in hosts:
        where = _bytes(base / host / WHERE_SAMPLES, MOST_FILE)
        metrics = _bytes(Path(run_dir) / "metrics" / host / "samples.jsonl", MOST_METRICS)
        out.append(host_samples(host, where, metrics))
    return out


def _bytes(path: Path, most: int) -> bytes:
    try:
        return read_bounded(path, most, nofollow=True)[0]
    except FileRefused as e:
        if e.reason != "too_large":
            return b""  # missing or unreadable: as no samples
    try:  # larger than it should be (the node wrote it): its first ``most`` bytes
        with open(path, "rb") as f:
            return f.read(most)
    except OSError:
        return b""


def stragglers_of(run_dir: Path) -> list[dict]:
    """``clusterddp metrics RUN --json``'s ``stragglers``: every straggler the run's samples show, as data
    (host, ranks, since, until, why, wait shares); empty when none, or when the run has no samples."""
    return [s.to_json() for s in decide(read_run(run_dir))]


def hosts_named(run_dir: Path) -> list[str]:
    """The hosts named stragglers at any time of the run (its samples brought back), each once, in the order
    first named: what ``quarantine_stragglers: true`` counts toward quarantine."""
    return list(dict.fromkeys(s.host for s in decide(read_run(run_dir))))


# ---- bringing the samples back ----

def fetch_command(control_dir: str) -> str:
    """The command that sends a node's where.jsonl (at most :data:`MOST_FILE` bytes; nothing when it has none)."""
    return f"head -c {MOST_FILE} {qpath(control_dir)}/{WHERE_SAMPLES} 2>/dev/null; true"


def fetch_node(t: Transport, node: ssh_plan.NodeLaunch, store: RunStore, run_id: str) -> int:
    """One node's where.jsonl saved as ``<run>/where/<host>/where.jsonl``; its size (0: none, nothing saved)."""
    data = t.run(fetch_command(node.control_dir), timeout=60).stdout[:MOST_FILE]
    if data:
        store.write_evidence(run_id, WHERE_DIR, node.host.name, WHERE_SAMPLES, data)
    return len(data)


def fetch_nodes(fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], store: RunStore, run_id: str) -> dict[str, str]:
    """:func:`fetch_node` on every node in parallel; what went wrong, by host. Best effort: a node that does
    not answer keeps what was brought back before."""
    res = nodeops.each(fleet, nodes, lambda n, t: fetch_node(t, n, store, run_id))
    return {h: str(e) for h, e in res.failed.items()}


# ---- an attached run, watched as it goes ----

WATCH_EVERY = 30.0    # seconds between two looks at an attached run's nodes
TAIL = 65536          # bytes of the end of each node's where.jsonl read at a look


def tail_command(control_dir: str) -> str:
    """The command that sends the last :data:`TAIL` bytes of a node's where.jsonl (nothing when it has none)."""
    return f"tail -c {TAIL} {qpath(control_dir)}/{WHERE_SAMPLES} 2>/dev/null; true"


class Watch:
    """An attached run's stragglers, told as they are named: every ``every`` seconds, the end of each
    node's rank samples (one command a node, through the run's fleet), :func:`decide`, and ``tell`` called
    once for each host newly named (again only after it has stopped being named). Never raises into the
    run: a look that fails is skipped."""

    def __init__(self, fleet: Fleet, nodes: Sequence[ssh_plan.NodeLaunch], tell: Callable[[Straggler], None],
                 every: float = WATCH_EVERY) -> None:
        self.fleet, self.nodes, self.tell, self.every = fleet, list(nodes), tell, every
        self.told: set[str] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def look(self) -> list[Straggler]:
        """One look: the stragglers named now (and each newly named one told)."""
        res = nodeops.each(self.fleet, self.nodes,
                           lambda n, t: t.run(tail_command(n.control_dir), timeout=60).stdout[:TAIL])
        hosts = [host_samples(h, data) for h, data in res.succeeded.items()]
        now = [s for s in decide(hosts) if s.until is None]
        for s in now:
            if s.host not in self.told:
                self.told.add(s.host)
                self.tell(s)
        self.told &= {s.host for s in now} | {h for h in res.failed}  # a host that did not answer stays told
        return now

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            try:
                self.look()
            except Exception:  # noqa: BLE001 - a look that fails never changes the run; the next one may do
                pass

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="stragglers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
