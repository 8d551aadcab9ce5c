"""Look at, follow, stop and harvest runs after `up` returned (or died): no daemon, just SSH.

Everything here starts from the run record (``run.json``), which holds each node's connection
settings and folders, so a run can be reached even if the inventory changed since.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

from . import plan as P
from .artifacts import CollectResult, Progress, collect_nodes
from .errors import HostError
from .fleet import fan_out
from .inventory import Host
from .record import NodeState, RunRecord, RunStatus, from_report
from .store import RunStore, utcnow
from .supervisor import parse_status
from .transport import Transport
from .transport import connect as default_connect


def nodes_of(rec: RunRecord) -> list[P.NodeLaunch]:
    """The NodeLaunch of each node, rebuilt from a run record (no launch script: it already ran)."""
    return [P.NodeLaunch(n.settings, n.node_rank, n.nproc, n.run_dir, n.control_dir, n.marker, (), (), "")
            for n in rec.nodes]


@dataclass
class Session:
    """Connections to a run's nodes, opened in parallel; a host that cannot be reached is kept as an error."""

    rec: RunRecord
    connect: Callable[[Host], Transport] = default_connect

    def __post_init__(self) -> None:
        self.nodes = nodes_of(self.rec)
        res = fan_out(self.nodes, lambda n: self.connect(n.host), self.rec.fanout)
        self.transports: dict[str, Transport] = {n.host.name: r for n, r in zip(self.nodes, res)
                                                 if not isinstance(r, Exception)}
        self.errors: dict[str, str] = {n.host.name: str(r) for n, r in zip(self.nodes, res)
                                       if isinstance(r, Exception)}

    def each(self, fn: Callable[[P.NodeLaunch, Transport], object]) -> dict[str, object]:
        """Call ``fn(node, transport)`` on every reachable node in parallel; results or exceptions by host."""
        live = [n for n in self.nodes if n.host.name in self.transports]
        return {n.host.name: r for n, r in zip(live, fan_out(live, lambda n: fn(n, self.transports[n.host.name]),
                                                             self.rec.fanout))}

    def close(self) -> None:
        for t in self.transports.values():
            t.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def overall(rec: RunRecord) -> tuple[RunStatus, str | None]:
    """A running run's status from its nodes' states: (status, failing host)."""
    bad = [n.host for n in rec.nodes if n.state.ended_badly()]
    if any(not n.state.is_terminal() for n in rec.nodes):
        return RunStatus.RUNNING, (bad[0] if bad else None)
    if bad:
        return RunStatus.FAILED, rec.failed_host or bad[0]
    return RunStatus.SUCCEEDED, None


def status(store: RunStore, run_id: str, connect: Callable = default_connect) -> RunRecord:
    """Ask every node (in parallel, bounded by its connect timeout) how its part is doing; record it."""
    with Session(store.load(run_id), connect) as s:
        def ask(n: P.NodeLaunch, t: Transport) -> tuple[str, int | None]:
            return parse_status(t.run(P.status_command(n), timeout=n.host.connect_timeout).text)
        res = s.each(ask)
    seen: dict[str, tuple[NodeState, int | None, str | None]] = {}
    for n in s.nodes:
        name = n.host.name
        r = res.get(name)
        if isinstance(r, tuple):
            state, why = from_report(*r)
            seen[name] = (state, r[1], why)
        else:
            seen[name] = (NodeState.UNREACHABLE, None, s.errors.get(name) or str(r))

    def looked(rec: RunRecord) -> RunRecord:
        rec = rec.seen(seen)
        if rec.status is not RunStatus.RUNNING:  # an ended run keeps its outcome
            return rec
        st, failed = overall(rec)
        return replace(rec, status=st, failed_host=failed, ended_at=utcnow() if st.is_terminal() else rec.ended_at)
    return store.update(run_id, looked)


# What the node's teardown (plan.teardown_command) printed, as a note on how `stop` ended its job.
_TEARDOWN = {"terminated": "ended by SIGTERM", "killed": "ended by SIGKILL after the grace period",
             "clean": "nothing left to stop"}


@dataclass(frozen=True)
class Stopped:
    """What `stop` did: the record after it, how each reachable node's job ended, what was collected."""

    record: RunRecord
    how: dict[str, str]
    not_stopped: tuple[str, ...]   # hosts that may still run something of the run
    collected: list[CollectResult]


def stop(store: RunStore, run_id: str, grace: float = P.DEFAULT_GRACE, connect: Callable = default_connect,
         progress: Progress | None = None) -> Stopped:
    """End the run's processes on every node (TERM, then KILL), mark it stopped, collect its logs.

    Each node is asked for its status after the teardown, so its state (and the exit code the
    signal left) is recorded in the words `status` uses.
    """
    with Session(store.load(run_id), connect) as s:
        def end(n: P.NodeLaunch, t: Transport) -> tuple[str, str, int | None]:
            said = t.run(P.teardown_command(n, grace), timeout=grace + 30).text.strip()
            return (said, *parse_status(t.run(P.status_command(n), timeout=30).text))
        res = s.each(end)
        collected = _collect(s, store, run_id, (), progress)
    seen: dict[str, tuple[NodeState, int | None, str | None]] = {}
    how: dict[str, str] = {}
    for host, r in res.items():
        if not isinstance(r, tuple):
            seen[host] = (NodeState.UNREACHABLE, None, f"teardown failed: {r}")
            continue
        said, kind, code = r
        state, why = from_report(kind, code)
        word, _, rest = said.partition(" ")
        if word in ("terminated", "killed"):
            state, why = NodeState.STOPPED, None
        elif word == "survivors":
            why = f"processes {rest} survived SIGKILL"
        elif word != "clean":
            why = f"the teardown printed {said!r}"
        seen[host] = (state, code, why)
        if word in _TEARDOWN and state.is_terminal():
            how[host] = _TEARDOWN[word]
    seen.update({h: (NodeState.UNREACHABLE, None, e) for h, e in s.errors.items()})
    not_stopped = tuple(h for h in seen if h not in how)

    def stopped(rec: RunRecord) -> RunRecord:
        rec = rec.seen(seen)
        if rec.status is RunStatus.RUNNING:
            rec = replace(rec, status=RunStatus.STOPPED)
        return replace(rec, ended_at=rec.ended_at or utcnow())
    rec = store.update(run_id, stopped)
    for h in not_stopped:
        reason = seen[h][2]
        how[h] = "not stopped" if rec.node(h).error == reason else f"not stopped: {reason}"
    return Stopped(rec, how, not_stopped, collected)


def collect(store: RunStore, run_id: str, connect: Callable = default_connect,
            progress: Progress | None = None) -> list[CollectResult]:
    """Bring back logs and the run's collect globs from every node, verified."""
    rec = store.load(run_id)
    with Session(rec, connect) as s:
        return _collect(s, store, run_id, rec.collect, progress)


def _collect(s: Session, store: RunStore, run_id: str, globs: tuple[str, ...],
             progress: Progress | None) -> list[CollectResult]:
    pairs = [(s.transports[n.host.name], n) for n in s.nodes if n.host.name in s.transports]
    out = collect_nodes(pairs, store, run_id, globs, s.rec.fanout, progress)
    return out + [CollectResult(h, error=e) for h, e in s.errors.items()]


def node_logs(store: RunStore, run_id: str, hosts: list[str] | None, connect: Callable = default_connect
              ) -> dict[str, tuple[bytes, str]]:
    """Each node's full log: from the node when reachable (refreshing the local copy), else the local copy.

    Returns {host: (log bytes, "node" | "local copy" | "missing")}.
    """
    rec = store.load(run_id)
    out: dict[str, tuple[bytes, str]] = {}
    with Session(rec, connect) as s:
        res = s.each(lambda n, t: t.run(P.node_log_command(n), timeout=120))
    for h in rec.hosts:
        if hosts and h not in hosts:
            continue
        r = res.get(h)
        if r is not None and not isinstance(r, Exception) and r.exit_code == 0:
            store.write_log(run_id, h, r.stdout)
            out[h] = (r.stdout, "node")
        elif store.log_path(run_id, h).is_file():
            out[h] = (store.log_path(run_id, h).read_bytes(), "local copy")
        else:
            out[h] = (b"", "missing")
    return out


def follow(store: RunStore, run_id: str, on_output: Callable[[str, bytes], None], hosts: list[str] | None,
           from_lines: dict[str, int], connect: Callable = default_connect) -> dict[str, int | None]:
    """Stream each node's log from ``from_lines[host]`` until its job ends; return exit codes by host.

    Raises HostError naming the first node whose stream broke off.
    """
    rec = store.load(run_id)
    with Session(rec, connect) as s:
        for h, e in s.errors.items():
            if not hosts or h in hosts:
                raise HostError(h, f"cannot follow the log: {e}")

        def one(n: P.NodeLaunch, t: Transport) -> int | None:
            if hosts and n.host.name not in hosts:
                return None
            t.stream(P.follow_command(n, from_lines.get(n.host.name, 1)), lambda b: on_output(n.host.name, b))
            return parse_status(t.run(P.status_command(n), timeout=60).text)[1]
        res = s.each(one)
    broken = [r for r in res.values() if isinstance(r, Exception)]
    if broken:
        raise broken[0] if isinstance(broken[0], HostError) else HostError("?", str(broken[0]))
    return res  # type: ignore[return-value]
