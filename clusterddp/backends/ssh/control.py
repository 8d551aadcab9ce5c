"""Look at, follow, stop and harvest SSH (and `local`) runs after `up` returned (or died): no daemon, just SSH.

Everything here starts from the run record (``run.json``), which holds each node's connection
settings and folders, so a run can be reached even if the inventory changed since.
"""

from __future__ import annotations

import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from ... import nodeops
from ... import plan as ssh_plan
from ...artifacts import CollectResult, Progress, collect_nodes
from ...errors import HostError, StdoutClosed
from ...fleet import Fleet, as_host_error
from ...inventory import Host
from ...nodeops import nodes_of
from ...record import NodeRecord, NodeState, RunRecord, RunStatus, ended_at
from ...store import RunStore, replacing, utcnow
from ...transport import Transport
from ...transport import connect as default_connect
from ..base import Stopped

if TYPE_CHECKING:
    from ...check import Report
    from ...inventory import Inventory
    from ...stacks import Taken


@contextmanager
def _reach(rec: RunRecord, connect: Callable[[Host], Transport], hosts: list[str] | None = None
           ) -> Iterator[tuple[list[ssh_plan.NodeLaunch], Fleet]]:
    """The run's nodes (or ``hosts``) and one fleet of connections to them for this command: at most
    the run's fanout at once, each opened when its first step needs it, all closed at the end."""
    nodes = nodes_of(rec, hosts)
    with Fleet([n.host for n in nodes], fanout=rec.fanout, connect=connect) as fleet:
        yield nodes, fleet


def overall(rec: RunRecord) -> tuple[RunStatus, str | None]:
    """A running run's status from its nodes' states: (status, failing host)."""
    bad = [n.host for n in rec.nodes if n.state.ended_badly()]
    if any(not n.state.is_terminal() for n in rec.nodes):
        return RunStatus.RUNNING, (bad[0] if bad else None)
    if bad:
        return RunStatus.FAILED, rec.failed_host or bad[0]
    return RunStatus.SUCCEEDED, None


def status(store: RunStore, run_id: str, connect: Callable = default_connect,
           on_node: Callable[[NodeRecord], None] | None = None) -> RunRecord:
    """Ask every node (in parallel, bounded by its connect timeout) how its part is doing; record it.

    ``on_node(node)`` is called as each node answers (or is found unreachable), one call at a time,
    with the node as the record will hold it, so one unreachable node does not hold back the others'
    lines for its whole connect timeout. A run seen ending now records when its last node ended, by
    the nodes' own clocks (:func:`~clusterddp.record.ended_at`), not when it was looked at."""
    rec = store.load(run_id)
    said = threading.Lock()

    def seen_as(h: str, got: nodeops.Status | Exception) -> tuple[NodeState, int | None, str | None]:
        if isinstance(got, Exception):
            return NodeState.UNREACHABLE, None, str(as_host_error(h, got))
        return got.state, got.exit_code, got.why

    def answered(h: str, got: nodeops.Status | Exception) -> None:
        if on_node is not None:
            with said:
                on_node(rec.node(h).seen(*seen_as(h, got)))
    with _reach(rec, connect) as (nodes, fleet):
        res = nodeops.each(fleet, nodes, lambda n, t: nodeops.status(t, n, n.host.connect_timeout), answered)
    seen = {h: seen_as(h, got) for h, got in res.items()}
    ends = [got.ended for got in res.succeeded.values()]

    def looked(rec: RunRecord) -> RunRecord:
        rec = rec.seen(seen)
        if rec.status is not RunStatus.RUNNING:  # an ended run keeps its outcome
            return rec
        st, failed = overall(rec)
        end = ended_at(rec.started_at, ends, datetime.now(timezone.utc)) if st.is_terminal() else rec.ended_at
        return replace(rec, status=st, failed_host=failed, ended_at=end)
    rec = store.update(run_id, looked)
    if rec.status is RunStatus.FAILED and rec.failure is None:  # e.g. a detached run: say why, once
        from ...hang import explain  # a hang when the stall watchdog ended it, else the rank that failed
        with _reach(rec, connect) as (nodes, fleet):
            failure = explain(fleet, nodes, rec, store)
        # status saw the nodes ended, not in which order: the root cause's host failed first
        rec = store.update(run_id, lambda r: r if r.failure else replace(r, failure=failure, failed_host=failure.host))
    return rec


# What the node's teardown (plan.teardown_command) printed, as a note on how `stop` ended its job.
_TEARDOWN = {"terminated": "ended by SIGTERM", "killed": "ended by SIGKILL after the grace period",
             "clean": "nothing left to stop"}


def stop(store: RunStore, run_id: str, grace: float = ssh_plan.DEFAULT_GRACE, connect: Callable = default_connect,
         progress: Progress | None = None) -> Stopped:
    """End the run's processes on every node (TERM, then KILL), mark it stopped, collect its logs.

    Each node is asked for its status after the teardown, so its state (and the exit code the
    signal left) is recorded in the words `status` uses.
    """
    rec = store.load(run_id)
    with _reach(rec, connect) as (nodes, fleet):
        res = nodeops.each(fleet, nodes, lambda n, t: nodeops.teardown(t, n, grace, mark_stop=True))
        collected = collect_nodes(fleet, nodes, store, run_id, (), progress)
    seen: dict[str, tuple[NodeState, int | None, str | None]] = {}
    how: dict[str, str] = {}
    for host, done in res.succeeded.items():
        state, code, why = done.status.state, done.status.exit_code, done.status.why
        if done.ended_it:
            state, why = NodeState.STOPPED, None
        elif done.word == "survivors":
            why = f"processes {done.detail} survived SIGKILL"
        elif done.word != "clean":
            why = f"the teardown printed {done.said!r}"
        seen[host] = (state, code, why)
        if done.word in _TEARDOWN and state.is_terminal():
            how[host] = _TEARDOWN[done.word]
    unreachable = fleet.unreachable
    seen.update({h: (NodeState.UNREACHABLE, None, str(e) if h in unreachable else f"teardown failed: {e}")
                 for h, e in res.failed.items()})
    not_stopped = tuple(h for h in seen if h not in how)
    earlier, ended = stop_lost(rec, connect, grace)

    def stopped(rec: RunRecord) -> RunRecord:
        rec = rec.seen(seen)
        if rec.status is RunStatus.RUNNING:
            rec = replace(rec, status=RunStatus.STOPPED)
        return replace(rec, ended_at=rec.ended_at or utcnow(), lost=tuple(n for n in rec.lost if n.host not in ended))
    rec = store.update(run_id, stopped)
    for h in not_stopped:
        reason = seen[h][2]
        how[h] = "not stopped" if rec.node(h).error == reason else f"not stopped: {reason}"
    return Stopped(rec, {**how, **earlier}, (*not_stopped, *(h for h in earlier if h not in ended)), collected)


def stop_lost(rec: RunRecord, connect: Callable[[Host], Transport], grace: float
               ) -> tuple[dict[str, str], set[str]]:
    """`stop` on the hosts an earlier attempt lost (``rec.lost``: their job may have run on there, out
    of reach): how each went, and the hosts where nothing of the run is left now (dropped from the record)."""
    if not rec.lost:
        return {}, set()
    nodes = [nodeops.launch_of(n) for n in rec.lost]
    with Fleet([n.host for n in nodes], fanout=rec.fanout, connect=connect) as fleet:
        res = nodeops.each(fleet, nodes, lambda n, t: nodeops.teardown(t, n, grace))
    how: dict[str, str] = {}
    ended: set[str] = set()
    for h, done in res.succeeded.items():
        if done.word in _TEARDOWN:
            how[h], ended = f"lost in an earlier attempt: {_TEARDOWN[done.word]}", ended | {h}
        else:
            how[h] = f"lost in an earlier attempt: not stopped: the teardown printed {done.said!r}"
    for h, e in res.failed.items():
        how[h] = f"lost in an earlier attempt: not stopped: {as_host_error(h, e)}"
    return how, ended


def collect(store: RunStore, run_id: str, connect: Callable = default_connect,
            progress: Progress | None = None, globs: tuple[str, ...] | None = None) -> list[CollectResult]:
    """Bring back logs and the run's collect globs (or ``globs`` instead) from every node, verified."""
    rec = store.load(run_id)
    with _reach(rec, connect) as (nodes, fleet):
        return collect_nodes(fleet, nodes, store, run_id, rec.collect if globs is None else globs, progress)


def node_logs(store: RunStore, run_id: str, hosts: list[str] | None,
              show: Callable[[str, str, BinaryIO | None], None], connect: Callable = default_connect) -> None:
    """Each node's full log (of every node, or only of ``hosts``): from the node when reachable
    (streamed to disk, refreshing the local copy), else the local copy.

    Calls ``show(host, source, log file or None)`` for one host after another, in the run's host
    order, with source "node", "local copy" or "missing". A read-only store keeps its copies: the
    nodes' logs then go to a private temp folder for as long as they are shown.
    """
    rec = store.load(run_id)
    with _reach(rec, connect, hosts) as (nodes, fleet), \
            tempfile.TemporaryDirectory(prefix="clusterddp-logs-") as scratch:
        def fetch(n: ssh_plan.NodeLaunch, t: Transport) -> Path:
            h = n.host.name
            dest = Path(scratch) / f"{n.node_rank}.log" if store.read_only else store.log_path(run_id, h)
            with replacing(dest) if store.read_only else store.log_writer(run_id, h) as f:
                if not nodeops.fetch_log(t, n, f):
                    raise _NoLog()
            return dest
        fetched = nodeops.each(fleet, nodes, fetch).succeeded
        for n in nodes:
            h = n.host.name
            path, source = fetched.get(h), "node"
            if path is None:
                path, source = store.log_path(run_id, h), "local copy"
            try:
                with open(path, "rb") as f:
                    show(h, source, f)
            except FileNotFoundError:
                show(h, "missing", None)


class _NoLog(Exception):
    """The node answered but has no log (its run folder is gone): fall back to the local copy.
    Private control flow inside this module (so not in errors.py)."""


def follow(store: RunStore, run_id: str, on_output: Callable[[str, bytes], None], hosts: list[str] | None,
           from_lines: dict[str, int], connect: Callable = default_connect) -> dict[str, int | None]:
    """Stream each node's log (or only ``hosts``' logs) from ``from_lines[host]`` until its job ends;
    return the exit codes by host.

    Raises HostError naming the first node that cannot be reached (before anything is streamed),
    or else the first whose stream broke off.
    """
    rec = store.load(run_id)
    with _reach(rec, connect, hosts) as (nodes, fleet):
        down = fleet.open().first_failure()
        if down is not None:
            raise HostError(down[0], f"cannot follow the log: {down[1]}")

        closed = threading.Event()

        def one(n: ssh_plan.NodeLaunch, t: Transport) -> int | None:
            name = n.host.name

            def out(data: bytes) -> None:
                try:
                    on_output(name, data)
                except StdoutClosed:  # nobody reads any more: every node's stream ends now, not at its job's end
                    closed.set()
                    for other in nodes:
                        fleet.close_host(other.host)
                    raise
            return nodeops.follow(t, n, out, from_lines.get(name, 1)).status.exit_code
        res = nodeops.each(fleet, nodes, one)
        if closed.is_set():
            raise StdoutClosed
    broken = res.first_failure()
    if broken is not None:
        raise as_host_error(*broken)
    return res.succeeded


def stacks(store: RunStore, rec: RunRecord, wait: float) -> Taken:
    """`clusterddp stacks`: every node of the run asked at once (:func:`clusterddp.stacks.take`)."""
    from ... import stacks as stack_dumps
    return stack_dumps.take(rec, wait=wait)


def reach(rec: RunRecord, verb: str) -> nodeops.HostsReach:
    """The run's nodes for ``verb`` (``top``, ``prune``): the recorded ones, reached as their hosts say."""
    return nodeops.HostsReach(tuple(nodes_of(rec)))


def check(inventory: Inventory, master_port: int | None = None) -> Report:
    """`clusterddp check` of an inventory of hosts: every check, on every host (:func:`clusterddp.check.run_checks`)."""
    from ...check import run_checks
    return run_checks(inventory, full=True, master_port=master_port)


def describe(rec: RunRecord) -> None:
    """Nothing: an SSH run is its nodes, which `status` shows one by one."""
    return None
