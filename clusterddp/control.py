"""Look at, follow, stop and harvest runs after `up` returned (or died): no daemon, just SSH.

Everything here starts from the run record (``run.json``), which holds each node's connection
settings and folders, so a run can be reached even if the inventory changed since.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from . import plan as P
from .artifacts import CollectResult, Progress, collect_nodes
from .errors import HostError
from .inventory import Host
from .store import RunStore, utcnow
from .fleet import fan_out
from .inventory import DEFAULT_FANOUT
from .supervisor import parse_status
from .transport import Transport
from .transport import connect as default_connect


def nodes_of(rec: dict) -> list[P.NodeLaunch]:
    """The NodeLaunch of each node, rebuilt from a run record (no launch script: it already ran)."""
    out = []
    for n in rec["nodes"]:
        s = dict(n["settings"])
        s["env"], s["setup"] = tuple(s["env"].items()), tuple(s["setup"])
        out.append(P.NodeLaunch(Host(**s), n["node_rank"], n["nproc"], n["run_dir"], n["control_dir"],
                                n["marker"], (), (), ""))
    return out


@dataclass(frozen=True)
class NodeStatus:
    host: str
    state: str                 # running | exited | lost (no process, no exit code) | missing | unreachable
    exit_code: int | None = None
    error: str | None = None


@dataclass
class Session:
    """Connections to a run's nodes, opened in parallel; a host that cannot be reached is kept as an error."""

    rec: dict
    connect: Callable[[Host], Transport] = default_connect

    def __post_init__(self) -> None:
        self.nodes = nodes_of(self.rec)
        res = fan_out(self.nodes, lambda n: self.connect(n.host))
        self.transports: dict[str, Transport] = {n.host.name: r for n, r in zip(self.nodes, res)
                                                 if not isinstance(r, Exception)}
        self.errors: dict[str, str] = {n.host.name: str(r) for n, r in zip(self.nodes, res)
                                       if isinstance(r, Exception)}

    def each(self, fn: Callable[[P.NodeLaunch, Transport], object]) -> dict[str, object]:
        """Call ``fn(node, transport)`` on every reachable node in parallel; results or exceptions by host."""
        live = [n for n in self.nodes if n.host.name in self.transports]
        return {n.host.name: r for n, r in zip(live, fan_out(live, lambda n: fn(n, self.transports[n.host.name])))}

    def close(self) -> None:
        for t in self.transports.values():
            t.close()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def overall(rec: dict, nodes: list[NodeStatus]) -> tuple[str, str | None]:
    """The run's status from its nodes' states: (status, failing host)."""
    if rec["status"] == "stopped":
        return "stopped", rec.get("failed_host")
    bad = [n for n in nodes if n.state in ("exited", "lost", "missing") and n.exit_code != 0]
    if any(n.state in ("running", "unreachable") for n in nodes):
        return "running", (bad[0].host if bad else None)
    if bad:
        return "failed", rec.get("failed_host") or bad[0].host
    return "succeeded", None


def status(store: RunStore, run_id: str, connect: Callable = default_connect) -> tuple[dict, list[NodeStatus]]:
    """Ask every node (in parallel, bounded by its connect timeout) how its part is doing; update the store."""
    rec = store.load(run_id)
    with Session(rec, connect) as s:
        def ask(n: P.NodeLaunch, t: Transport) -> NodeStatus:
            kind, code = parse_status(t.run(P.status_command(n), timeout=n.host.connect_timeout).text)
            return NodeStatus(n.host.name, kind, code)
        res = s.each(ask)
    nodes = []
    for n in s.nodes:
        name = n.host.name
        r = res.get(name)
        if isinstance(r, NodeStatus):
            nodes.append(r)
        else:
            nodes.append(NodeStatus(name, "unreachable", None, s.errors.get(name) or str(r)))
    patch = {ns.host: {"state": ns.state, "exit_code": ns.exit_code, "error": ns.error} for ns in nodes}
    fields: dict = {}
    if rec["status"] == "running":  # an ended run keeps its outcome, even if its nodes were cleaned since
        st, failed = overall(rec, nodes)
        fields = {"status": st, "failed_host": failed}
        if st in ("succeeded", "failed"):
            fields.update(ended_at=utcnow(), exit_code=0 if st == "succeeded" else 1)
    rec = store.update(run_id, nodes=patch, **fields)
    return rec, nodes


def stop(store: RunStore, run_id: str, grace: float = P.DEFAULT_GRACE, connect: Callable = default_connect,
         progress: Progress | None = None) -> tuple[dict, dict[str, str], list[CollectResult]]:
    """End the run's processes on every node (TERM, then KILL), mark it stopped, collect its logs."""
    rec = store.load(run_id)
    with Session(rec, connect) as s:
        res = s.each(lambda n, t: t.run(P.teardown_command(n, grace), timeout=grace + 30).text.strip())
        results = {h: (r if isinstance(r, str) else f"error: {r}") for h, r in res.items()}
        results.update({h: f"unreachable: {e}" for h, e in s.errors.items()})
        collected = _collect(s, store, run_id, (), progress)
    status_ = "stopped" if rec["status"] == "running" else rec["status"]
    rec = store.update(run_id, status=status_, ended_at=rec.get("ended_at") or utcnow(),
                       exit_code=rec.get("exit_code") if status_ != "stopped" else 130)
    return rec, results, collected


def collect(store: RunStore, run_id: str, connect: Callable = default_connect,
            progress: Progress | None = None) -> list[CollectResult]:
    """Bring back logs and the run's collect globs from every node, verified."""
    rec = store.load(run_id)
    with Session(rec, connect) as s:
        return _collect(s, store, run_id, tuple(rec.get("collect") or ()), progress)


def _collect(s: Session, store: RunStore, run_id: str, globs: tuple[str, ...],
             progress: Progress | None) -> list[CollectResult]:
    pairs = [(s.transports[n.host.name], n) for n in s.nodes if n.host.name in s.transports]
    out = collect_nodes(pairs, store, run_id, globs, int(s.rec.get("fanout") or DEFAULT_FANOUT), progress)
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
    for n in rec["nodes"]:
        h = n["host"]
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
