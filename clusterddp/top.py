"""`clusterddp top`: what each node of running runs is doing now, one SSH round per node per look.

A :class:`Watch` holds one :class:`~clusterddp.fleet.Fleet` for the whole view and, at each
:meth:`Watch.look`, sends every node one command (:func:`top_command`, which covers all of
that node's jobs, of every run shown) and reads the answers into a :class:`Snapshot`. Rates are
differences between looks, timed by each node's own clock (SSH latency does not bend them):
steps per second over the last :data:`RATE_WINDOW` seconds of progress lines, CPU % since the
previous look. Seconds since a node's last progress line are also differences on the node's
clock: from the time its watcher last saw progress (``$CTL/watch.json``, when the run has a stall
timeout; a node past that timeout is marked stalled), else from the last write to its ``node.log``
(any line of output, which is what the watcher counts as progress by default). Nothing here
prints; nothing is written to the run records.
"""

from __future__ import annotations

import json
import re
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import cast

from . import noise
from . import plan as P
from .errors import UsageError
from .fleet import Fleet, as_host_error
from .inventory import Host
from .node import reply as node_reply
from .node import top as node_top
from .node.watch import regex_problem
from .nodeops import nodes_of
from .nodescript import preamble, python_command, q
from .record import RunRecord, RunStatus
from .store import RunStore
from .transport import Transport
from .transport import connect as default_connect

# The usual progress lines: `step 12`, `Step: 12`, `step=12`, `[step 12/500]`, `global_step 12`,
# `iter 12`, `Iteration: 12`, `[12/500]`, and `Epoch 3`, `epoch 3/10`, `train_epoch=3` in a line
# that names no step or iteration (pytorch/examples' DDP tutorials print `Epoch N | ... | Steps: 64`,
# where 64 is the batches per epoch, and `Epoch N Iter M`, where the iteration is the finer).
# No two \s* in a row: "step" and 60,000 spaces took 97 s to refuse (every split of the spaces
# between them tried); written so, a failing line costs time linear in its length.
DEFAULT_PROGRESS = (r"(?i)(?:^(?!.*(?:step(?:\s*[:=#])?\s*\d|\biter(?:ation)?\b))(?:.*?[^a-z])?epoch\b"
                    r"|step|\biter(?:ation)?\b|\[ *(?=\d+ */ *\d+ *\]))(?:\s*[:=#])?\s*(\d+)")
RATE_WINDOW = 30.0       # seconds of step readings a steps/s figure spans
RETRY_AFTER = 10.0       # seconds before hosts that failed a look are connected to again


def check_progress_regex(text: str) -> str:
    """``--progress-regex``: it must compile, and have at most one group (the step number)."""
    try:
        rx = re.compile(text)
    except (re.error, RecursionError, OverflowError) as e:  # nested past the parser's depth, a count past its range
        raise UsageError(f"--progress-regex {text!r}: not a regular expression ({e})",
                         r"e.g. --progress-regex 'iter (\d+)'") from None
    if rx.groups > 1:
        raise UsageError(f"--progress-regex {text!r}: {rx.groups} groups; give at most one, around the step number",
                         r"use (?:...) for the other groups, e.g. '(?:step|iter) (\d+)'")
    if (slow := regex_problem(text)) is not None:
        raise UsageError(f"--progress-regex {text!r}: {slow}", r"match the line's words, e.g. 'step (\d+)'")
    return text


@dataclass
class GpuView:
    index: int
    util_percent: float | None
    mem_used_mib: float | None
    mem_total_mib: float | None


@dataclass
class NodeView:
    """One node of one run, as a look found it. ``error`` is set when the node did not answer."""

    host: str
    node_rank: int
    state: str                          # running, exited, lost, missing, unreachable
    exit_code: int | None = None
    last_line: str | None = None        # as the node sent it: escape it before printing
    step: int | None = None
    steps_per_sec: float | None = None
    procs: int = 0
    cpu_percent: float | None = None    # of the job's processes; 100 = one core
    rss_bytes: int | None = None
    node_cpu_percent: float | None = None
    node_mem_used_bytes: int | None = None
    node_mem_total_bytes: int | None = None
    gpus: list[GpuView] | None = None   # None: no nvidia-smi on the node
    error: str | None = None
    # seconds since the node's last progress line, on the node's clock (running jobs only); from the
    # node's watcher ("watch": the run has a stall timeout) or from node.log's last write ("log")
    since_progress: float | None = None
    progress_from: str | None = None
    stall_timeout: float | None = None   # the run's, as the node's watcher has it
    stalled: bool = False                # this node: no progress line for longer than stall_timeout
    run_since_progress: float | None = None  # the whole run, as this node's watcher knows it
    watch_state: str | None = None       # the watcher's: waiting (for the other nodes), watching, stalled


@dataclass
class RunView:
    run_id: str
    name: str | None
    status: str
    nodes: list[NodeView] = field(default_factory=list)


@dataclass
class Snapshot:
    """One look at every run shown; with a lab inventory (``top --inventory``), ``leases`` lists every
    GPU lease and queue entry on its hosts (a host that cannot be read: one entry with its error)."""

    time: float
    runs: list[RunView]
    leases: list[dict] | None = None

    def to_json(self) -> dict:
        return asdict(self)


def records(store: RunStore, run: str | None) -> list[RunRecord]:
    """The run named by ``run`` (an id or unique prefix), or every run whose record says running."""
    if run is not None:
        return [store.load(store.resolve(run))]
    return [store.load(row["run_id"]) for row in store.list() if row["status"] == RunStatus.RUNNING.value]


class Watch:
    """Repeated looks at the nodes of ``recs``, through one fleet of connections (reopened for hosts
    that failed, at most every :data:`RETRY_AFTER` seconds)."""

    def __init__(self, recs: Sequence[RunRecord], progress_regex: str = DEFAULT_PROGRESS,
                 connect: Callable[[Host], Transport] = default_connect,
                 clock: Callable[[], float] = time.monotonic, lab: Sequence[Host] = (),
                 store: RunStore | None = None) -> None:
        self.lab = list(lab)  # the hosts whose GPU leases are listed too (one more command per host)
        self.regex = progress_regex
        self._connect = connect
        self._clock = clock
        self._store = store  # given: each look reads the records again (a new attempt moves a run's nodes)
        self._take(recs)
        self._fleet = self._new_fleet()
        self._lab_fleet = Fleet(self.lab, fanout=self._fanout, connect=self._connect) if self.lab else None
        self._failed_at: float | None = None
        self._steps: dict[tuple[str, str], deque[tuple[float, int]]] = {}
        self._cpu: dict[tuple[str, str], tuple[float, float]] = {}
        self._node_cpu: dict[str, tuple[int, int]] = {}

    def _take(self, recs: Sequence[RunRecord]) -> None:
        self.recs = list(recs)
        # host name -> [(run id, node)], hosts in first-seen order; one command per host covers all
        self._jobs: dict[str, list[tuple[str, P.NodeLaunch]]] = {}
        self._hosts: dict[str, Host] = {}
        for rec in self.recs:
            for n in nodes_of(rec):
                self._hosts.setdefault(n.host.name, n.host)
                self._jobs.setdefault(n.host.name, []).append((rec.run_id, n))
        self._fanout = min((r.fanout for r in self.recs), default=32)

    def _reread(self) -> None:
        """The runs' records read again: a run whose next attempt runs on other hosts (a spare in, a
        host out) is watched on its current ones. A record that cannot be read now keeps the last one."""
        if self._store is None:
            return
        fresh = []
        for rec in self.recs:
            try:
                fresh.append(self._store.load(rec.run_id))
            except Exception:  # noqa: BLE001 - being written, or damaged: the view keeps what it had
                fresh.append(rec)
        where = [[(n.host, n.control_dir) for n in r.nodes] for r in self.recs]
        if [[(n.host, n.control_dir) for n in r.nodes] for r in fresh] != where:
            self._fleet.close()
            self._take(fresh)
            self._fleet = self._new_fleet()
        else:
            self.recs = fresh

    def _new_fleet(self) -> Fleet:
        return Fleet(self._hosts.values(), fanout=self._fanout, connect=self._connect)

    def close(self) -> None:
        self._fleet.close()
        if self._lab_fleet is not None:
            self._lab_fleet.close()

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def look(self) -> Snapshot:
        """One round: every host asked once, in parallel; a snapshot of every run's nodes."""
        self._reread()
        if self._failed_at is not None and self._clock() - self._failed_at >= RETRY_AFTER:
            self._fleet.close()
            self._fleet = self._new_fleet()
            self._failed_at = None

        def one(host: Host, t: Transport) -> dict:
            jobs = [n for _, n in self._jobs[host.name]]
            res = t.run(top_command(host, jobs, self.regex, noise.LINE_PATTERNS), timeout=host.connect_timeout)
            return cast(dict, node_reply.one_line_each(node_top.parse_reply(res.stdout, len(jobs))))
        answers = self._fleet.each(one)
        if answers.failed and self._failed_at is None:
            self._failed_at = self._clock()
        views: dict[tuple[str, str], NodeView] = {}
        for name, jobs in self._jobs.items():
            got = answers.get(name)
            node = None if isinstance(got, Exception) or got is None else self._node(name, got)
            for i, (run_id, n) in enumerate(jobs):
                if isinstance(got, Exception) or got is None or node is None:
                    why = str(as_host_error(name, got)) if isinstance(got, Exception) else "not asked"
                    views[(run_id, name)] = NodeView(name, n.node_rank, "unreachable", error=why)
                else:
                    views[(run_id, name)] = self._view(run_id, n, got["time"], got["jobs"][i], node)
        runs = [RunView(r.run_id, r.name, str(r.status), [views[(r.run_id, n.host)] for n in r.nodes])
                for r in self.recs]
        return Snapshot(time.time(), runs, self._leases() if self._lab_fleet is not None else None)

    def _leases(self) -> list[dict]:
        """Every lease and queue entry on the lab's hosts, in host order (the lease program's answers,
        already checked by :mod:`clusterddp.leases`)."""
        from . import leases
        assert self._lab_fleet is not None
        res = leases.read_views(self._lab_fleet, self.lab)
        out: list[dict] = []
        for h in self.lab:
            got = res.get(h.name)
            if isinstance(got, Exception) or got is None:
                out.append({"host": h.name, "error": str(as_host_error(h.name, got)) if got else "not asked"})
                continue
            out += [{"host": h.name, "run": x.run, "name": x.name, "user": x.user, "since": x.since,
                     "slots": list(x.slots), "master_port": x.port, "state": x.state} for x in got.holders]
            out += [{"host": h.name, "run": w.run, "name": w.name, "user": w.user, "since": w.since, "state": "waiting",
                     "needs": list(w.slots) if w.slots else w.need} for w in got.waiting]
        return out

    def _node(self, host: str, node: dict) -> dict:
        """The node-wide fields of a NodeView (the same for every job on that host) from its answer."""
        v: dict = {"node_cpu_percent": None, "node_mem_used_bytes": None, "node_mem_total_bytes": None,
                   "gpus": None, "error": node["gpu_error"]}
        if node["cpu_total"] is not None and node["cpu_idle"] is not None:
            before = self._node_cpu.get(host)
            if before is not None and node["cpu_total"] > before[0]:
                busy = 1 - (node["cpu_idle"] - before[1]) / (node["cpu_total"] - before[0])
                v["node_cpu_percent"] = min(100.0, max(0.0, busy * 100))
            self._node_cpu[host] = (node["cpu_total"], node["cpu_idle"])
        if node["mem_total"] is not None and node["mem_available"] is not None:
            v["node_mem_total_bytes"] = node["mem_total"]
            v["node_mem_used_bytes"] = max(0, node["mem_total"] - node["mem_available"])
        if node["gpus"] is not None:
            v["gpus"] = [GpuView(g["index"], g["util"], g["mem_used"], g["mem_total"]) for g in node["gpus"]]
        return v

    def _view(self, run_id: str, n: P.NodeLaunch, now: float, job: dict, node: dict) -> NodeView:
        key = (run_id, n.host.name)
        v = NodeView(n.host.name, n.node_rank, job["state"], job["exit_code"], job["last_line"], job["step"],
                     procs=job["procs"], rss_bytes=job["rss"], **node)
        steps = self._steps.setdefault(key, deque())
        if job["step"] is not None:
            if steps and (job["step"] < steps[-1][1] or now < steps[-1][0]):
                steps.clear()  # a restart (or a clock step): the old readings say nothing now
            if not steps or job["step"] != steps[-1][1]:
                steps.append((now, job["step"]))
            while len(steps) > 2 and now - steps[0][0] > RATE_WINDOW:
                steps.popleft()
            if len(steps) >= 2 and now > steps[0][0]:
                # from the first reading to now: a run that stopped printing steps slows down to 0
                v.steps_per_sec = (steps[-1][1] - steps[0][1]) / (now - steps[0][0])
        _since_progress(v, now, job)
        prev = self._cpu.get(key)
        if prev is not None and now > prev[0]:
            v.cpu_percent = max(0.0, (job["cpu_seconds"] - prev[1]) / (now - prev[0]) * 100)
        self._cpu[key] = (now, job["cpu_seconds"])
        return v


def _since_progress(v: NodeView, now: float, job: dict) -> None:
    """Seconds since the node's last progress line (node clock ``now``), and whether that is past the
    run's stall timeout; only while the job runs (an ended job makes no progress to wait for)."""
    if v.state != "running":
        return
    watch = job["watch"]
    if watch is not None:
        v.progress_from, v.stall_timeout, v.watch_state = "watch", watch["timeout"], watch["state"]
        if watch["last_progress"] is not None:  # None: no progress line on this node yet
            v.since_progress = max(0.0, now - watch["last_progress"])
        if watch["run_last_progress"] is not None:
            v.run_since_progress = max(0.0, now - watch["run_last_progress"])
        v.stalled = watch["state"] == "stalled" or (v.since_progress is not None
                                                     and v.since_progress > watch["timeout"])
    elif job["log_mtime"] is not None:
        v.since_progress, v.progress_from = max(0.0, now - job["log_mtime"]), "log"


# ---- the node side: one look at a host (moved from plan.py) ----

TOP_TAIL = 65536  # bytes of each node.log read for its last line and last step


def top_command(host: Host, nodes: Iterable[P.NodeLaunch], progress_regex: str, skip: Sequence[str] = ()) -> str:
    """One look at ``host`` for ``clusterddp top``: every job of ``nodes`` (all on this host, of any
    runs) in one command (the node program ``clusterddp/node/top.py``), after the host's setup lines.
    ``skip``: patterns of lines never shown as a job's last line (:data:`clusterddp.noise.LINE_PATTERNS`)."""
    args = {"jobs": [[n.control_dir, n.marker] for n in nodes], "regex": progress_regex, "tail": TOP_TAIL,
            **({"skip": list(skip)} if skip else {})}
    lines = preamble(host, (), stdout_to=">/dev/null 2>&1", on_fail=lambda line: "true")
    return "\n".join([*lines, python_command(host.python, "top", [q(json.dumps(args))])])
