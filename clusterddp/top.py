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
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import cast

from . import noise, stragglers
from . import plan as ssh_plan
from .fleet import Fleet, GroupResult, as_host_error, fan_out
from .inventory import Host, RunNode
from .node import reply as node_reply
from .node import top as node_top
from .nodeops import Reach, nodes_of
from .nodescript import preamble, python_command, q
from .record import RunRecord, RunStatus
from .runspec import check_progress_regex  # noqa: F401 - `top --progress-regex` checks it as `up` does
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
    error: str | None = None   # why its nodes could not be reached (its backend's words), when they could not
    # the hosts its other ranks wait for now (clusterddp.stragglers: host, ranks, since, until, why)
    stragglers: list[dict] = field(default_factory=list)


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


@dataclass
class _Group:
    """The runs reached alike (one :class:`~clusterddp.nodeops.Reach` key): one connection per host,
    one command per host for all their jobs on it."""

    reach: Reach
    jobs: dict[str, list[tuple[str, ssh_plan.NodeLaunch]]] = field(default_factory=dict)  # host -> [(run id, node)]
    hosts: dict[str, RunNode] = field(default_factory=dict)
    fleet: Fleet | None = None


class _Recorded:
    """A run's recorded hosts, reached through ``connect`` (when no backend's reach is given)."""

    key = "hosts"

    def __init__(self, rec: RunRecord, connect: Callable[[RunNode], Transport]) -> None:
        self.nodes = tuple(nodes_of(rec))
        self.connect = connect

    def close(self) -> None:
        pass


class Watch:
    """Repeated looks at the nodes of ``recs``, through one fleet of connections per way of reaching
    them (reopened for hosts that failed, at most every :data:`RETRY_AFTER` seconds).

    ``reach(rec)``: the run's nodes as its backend reaches them (the CLI passes the backend's
    :meth:`~clusterddp.backends.base.Backend.reach`); a run it refuses (a Slurm job not started yet)
    is shown with why, and asked again after :data:`RETRY_AFTER` seconds. Without it, each run's
    recorded hosts, through ``connect``."""

    def __init__(self, recs: Sequence[RunRecord], progress_regex: str = DEFAULT_PROGRESS,
                 connect: Callable[[RunNode], Transport] = default_connect,
                 clock: Callable[[], float] = time.monotonic, lab: Sequence[Host] = (),
                 store: RunStore | None = None, reach: Callable[[RunRecord], Reach] | None = None) -> None:
        self.lab = list(lab)  # the hosts whose GPU leases are listed too (one more command per host)
        self.regex = progress_regex
        self._connect = connect
        self._reach = reach
        self._clock = clock
        self._store = store  # given: each look reads the records again (a new attempt moves a run's nodes)
        self._groups: dict[str, _Group] = {}
        self._take(recs)
        self._lab_fleet = Fleet(self.lab, fanout=self._fanout, connect=self._connect) if self.lab else None
        self._failed_at: float | None = None
        self._steps: dict[tuple[str, str], deque[tuple[float, int]]] = {}
        self._cpu: dict[tuple[str, str], tuple[float, float]] = {}
        self._node_cpu: dict[str, tuple[int, int]] = {}

    def _take(self, recs: Sequence[RunRecord]) -> None:
        self._close_groups()
        self.recs = list(recs)
        self._fanout = min((r.fanout for r in self.recs), default=32)
        self._shown: dict[str, tuple[ssh_plan.NodeLaunch, ...]] = {}  # run id -> its nodes, as reached
        self._refused: dict[str, str] = {}                      # run id -> why its nodes cannot be reached
        self.refusals: dict[str, Exception] = {}                 # run id -> the error that said it
        for rec in self.recs:
            self._add(rec)
        self._taken_at = self._clock()
        self._new_fleets()

    def _add(self, rec: RunRecord) -> _Group | None:
        """``rec``'s nodes, reached, into the group of its reach (None: refused, and why kept)."""
        try:
            r = self._reach(rec) if self._reach is not None else _Recorded(rec, self._connect)
        except Exception as e:  # noqa: BLE001 - the backend's refusal, or its login host unreachable
            self._refused[rec.run_id] = "; ".join(line.strip() for line in str(e).splitlines())
            self.refusals[rec.run_id] = e
            return None
        self._refused.pop(rec.run_id, None)
        self.refusals.pop(rec.run_id, None)
        g = self._groups.get(r.key)
        if g is None:
            g = self._groups[r.key] = _Group(r)
        else:
            r.close()  # reached alike: the group's first reach connects for it
        self._shown[rec.run_id] = r.nodes
        # host name -> [(run id, node)], hosts in first-seen order; one command per host covers all
        for n in r.nodes:
            g.hosts.setdefault(n.host.name, n.host)
            g.jobs.setdefault(n.host.name, []).append((rec.run_id, n))
        return g

    def _retry_refused(self) -> None:
        """The runs whose nodes could not be reached, reached again (every :data:`RETRY_AFTER` seconds);
        only the groups they join get new connections."""
        if not self._refused or self._clock() - self._taken_at < RETRY_AFTER:
            return
        self._taken_at = self._clock()
        for rec in [r for r in self.recs if r.run_id in self._refused]:
            g = self._add(rec)
            if g is not None:
                if g.fleet is not None:
                    g.fleet.close()
                g.fleet = Fleet(g.hosts.values(), fanout=self._fanout, connect=g.reach.connect)

    def _reread(self) -> None:
        """The runs' records read again: a run whose next attempt runs on other hosts (a spare in, a
        host out) is watched on its current ones. A record that cannot be read now keeps the last one.
        Runs whose nodes could not be reached are reached again every :data:`RETRY_AFTER` seconds."""
        if self._store is None:
            self._retry_refused()
            return
        fresh = []
        for rec in self.recs:
            try:
                fresh.append(self._store.load(rec.run_id))
            except Exception:  # noqa: BLE001 - being written, or damaged: the view keeps what it had
                fresh.append(rec)
        where = [[(n.host, n.control_dir) for n in r.nodes] for r in self.recs]
        if [[(n.host, n.control_dir) for n in r.nodes] for r in fresh] != where:
            self._take(fresh)
        else:
            self.recs = fresh
            self._retry_refused()

    def _new_fleets(self) -> None:
        for g in self._groups.values():
            g.fleet = Fleet(g.hosts.values(), fanout=self._fanout, connect=g.reach.connect)

    def _close_fleets(self) -> None:
        for g in self._groups.values():
            if g.fleet is not None:
                g.fleet.close()

    def _close_groups(self) -> None:
        self._close_fleets()
        for g in self._groups.values():
            g.reach.close()
        self._groups = {}

    def close(self) -> None:
        self._close_groups()
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
            self._close_fleets()
            self._new_fleets()
            self._failed_at = None

        def ask(g: _Group) -> GroupResult[str, dict]:
            def one(host: RunNode, t: Transport) -> dict:
                jobs = [n for _, n in g.jobs[host.name]]
                res = t.run(top_command(host, jobs, self.regex, noise.LINE_PATTERNS), timeout=host.connect_timeout)
                return cast(dict, node_reply.one_line_each(node_top.parse_reply(res.stdout, len(jobs))))
            assert g.fleet is not None
            return g.fleet.each(one)
        asked = fan_out(self._groups.values(), ask, key=lambda g: g.reach.key)
        views: dict[tuple[str, str], NodeView] = {}
        wheres: dict[str, list[stragglers.HostSamples]] = {}
        for key, g in self._groups.items():
            group = asked[key]
            answers: GroupResult[str, dict] = group if not isinstance(group, Exception) else GroupResult(
                {name: group for name in g.jobs})
            if answers.failed and self._failed_at is None:
                self._failed_at = self._clock()
            for name, jobs in g.jobs.items():
                got = answers.get(name)
                node = None if isinstance(got, Exception) or got is None else self._node(name, got)
                for i, (run_id, n) in enumerate(jobs):
                    if isinstance(got, Exception) or got is None or node is None:
                        why = str(as_host_error(name, got)) if isinstance(got, Exception) else "not asked"
                        views[(run_id, name)] = NodeView(name, n.node_rank, "unreachable", error=why)
                    else:
                        views[(run_id, name)] = self._view(run_id, n, got["time"], got["jobs"][i], node)
                        tail = got["jobs"][i]["where"]
                        if tail:
                            wheres.setdefault(run_id, []).append(
                                stragglers.host_samples(name, "\n".join(tail).encode("utf-8", "replace")))
        runs = [RunView(r.run_id, r.name, str(r.status),
                        [views[(r.run_id, n.host.name)] for n in self._shown.get(r.run_id, ())],
                        self._refused.get(r.run_id),
                        [s.to_json() for s in stragglers.decide(wheres.get(r.run_id, [])) if s.until is None])
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

    def _view(self, run_id: str, n: ssh_plan.NodeLaunch, now: float, job: dict, node: dict) -> NodeView:
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


def top_command(
    host: RunNode, nodes: Iterable[ssh_plan.NodeLaunch], progress_regex: str, skip: Sequence[str] = ()
) -> str:
    """One look at ``host`` for ``clusterddp top``: every job of ``nodes`` (all on this host, of any
    runs) in one command (the node program ``clusterddp/node/top.py``), after the host's setup lines.
    ``skip``: patterns of lines never shown as a job's last line (:data:`clusterddp.noise.LINE_PATTERNS`)."""
    args = {"jobs": [[n.control_dir, n.marker] for n in nodes], "regex": progress_regex, "tail": TOP_TAIL,
            **({"skip": list(skip)} if skip else {})}
    lines = preamble(host, (), stdout_to=">/dev/null 2>&1", on_fail=lambda line: "true")
    return "\n".join([*lines, python_command(host.python, "top", [q(json.dumps(args))])])
