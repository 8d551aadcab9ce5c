"""`clusterddp runs | status | logs | stop`: history and control of runs, no daemon needed (`collect`: collect.py)."""

from __future__ import annotations

import json
from collections import deque
from datetime import datetime
from typing import TYPE_CHECKING, BinaryIO

import typer

from .common import (
    QUIET,
    RAW,
    RUNS_DIR,
    PrefixPrinter,
    err,
    handle_errors,
    quiet_filter,
    tell_hidden,
    visible,
)

if TYPE_CHECKING:
    from ..record import NodeRecord, RunRecord
    from ..store import RunStore

RUN = typer.Argument(..., help="A run id, or a unique prefix or suffix of one (its random end: 3f9a).")


def _store(runs_dir: str, read_only: bool = False) -> RunStore:
    from ..store import RunStore
    return RunStore(runs_dir, read_only=read_only)


def _node_line(n: NodeRecord) -> str:
    """One node of a run record, as `status` and `stop` both print it."""
    return f"  {n.host}: {n.describe()}" + (f" - {visible(n.error)}" if n.error else "")


def _duration(row: dict) -> str:
    try:
        start = datetime.fromisoformat(row["started_at"])
        end = datetime.fromisoformat(row["ended_at"]) if row.get("ended_at") else datetime.now(start.tzinfo)
    except (TypeError, ValueError):
        return "-"
    secs = int((end - start).total_seconds())
    return f"{secs // 3600}h{secs % 3600 // 60:02d}m" if secs >= 3600 else f"{secs // 60}m{secs % 60:02d}s"


def _as_of(row: dict) -> str:
    """A running run's status as the listing shows it: as of the last write of its record, which is the
    last look at its nodes (`up` as it started or followed them, `status`, `stop`). `runs` asks no node:
    it lists from this machine alone, at once, also offline or on a read-only runs folder; a detached
    run that ended since shows as running until `status` looks."""
    at = row.get("updated_at") or row.get("started_at") or ""
    shown = at[:19].replace("T", " ")
    if shown[:10] == (row.get("started_at") or "")[:10]:
        shown = shown[11:]  # the day the run started: the time says it
    return f"{row['status']} (as of {shown})" if shown else row["status"]


@handle_errors
def runs(runs_dir: str = RUNS_DIR, as_json: bool = typer.Option(False, "--json", help="Print a JSON list.")) -> None:
    """List runs, newest first. A running run's status is as of the last look at its nodes (by `up`,
    `status` or `stop`): `clusterddp status RUN` looks now."""
    rows = _store(runs_dir).list()
    if as_json:
        store = _store(runs_dir, read_only=True)
        for r in rows:  # why each failed run failed (clusterddp.failure), from its run.json
            r["failure"] = store.failure_of(r["run_id"]) if r["status"] == "failed" else None
            r["environments"] = _environments(store, r["run_id"])
        print(json.dumps(rows, indent=2))
        return
    if not rows:
        print(f"no runs in {_store(runs_dir).root}")
        return
    head = ("RUN", "NAME", "STATUS", "HOSTS", "STARTED", "DURATION", "SCHEDULE")
    table = [head] + [(r["run_id"], r["name"] or "-",
                       (_as_of(r) if r["status"] == "running" else r["status"])
                       + (f" ({r['failed_host']})" if r["failed_host"] else ""),
                       r["hosts"] or "-", (r["started_at"] or "-")[:19].replace("T", " "), _duration(r),
                       r.get("schedule") or "-") for r in rows]
    widths = [max(len(str(row[i])) for row in table) for i in range(len(head))]
    for row in table:
        print("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    running = [r["run_id"] for r in rows if r["status"] == "running"]
    if running:
        err(f"note: a running run's status is as of the last look at its nodes; "
            f"`clusterddp status {running[0]}` looks now")


@handle_errors
def status(run: str = RUN, runs_dir: str = RUNS_DIR) -> None:
    """Ask every node whether its part of RUN still runs; update the run record."""
    from .. import backends
    from ..errors import blame
    from ..record import RunStatus
    store = _store(runs_dir)
    run_id = store.resolve(run)
    rec = store.load(run_id)
    backend = backends.for_record(rec)
    store.check_writable(run_id)  # what it sees is recorded: fail before any node is asked
    # each node as it answers: one that is down must not hold back the others' lines for its connect timeout
    print(f"run {run_id}: looking at {_nodes(len(rec.nodes))}", flush=True)
    rec = backend.status(store, run_id, on_node=lambda n: print(_node_line(n), flush=True))
    root = rec.failure.host if rec.failure is not None else None
    print(f"run {run_id}: {rec.status}" + (f" ({blame(rec.failed_host, root)})"
                                          if rec.status is RunStatus.FAILED and (rec.failed_host or root) else ""))
    said = backend.describe(rec)
    if said:
        print(f"  {visible(said)}")
    if rec.resumed_from:
        print(visible(f"  {rec.resumed_from.describe()}"))
    for env_id, lock, hosts in _env_lines(rec):
        print(visible(f"  environment {env_id} (lock sha256 {lock[:16]}) on {', '.join(hosts)}"))
    for a in rec.attempts:  # a spare in, a host out, or why the run ended there: the nodes above are the last attempt's
        print(visible(f"  {a.describe()}"))
    if rec.status is RunStatus.FAILED and rec.failure:
        for line in rec.failure.lines(others=False):  # the other nodes are the lines above
            print(visible(f"  {line}"))
    bad = [n.host for n in rec.nodes if n.state.ended_badly()]
    if rec.status is RunStatus.RUNNING and bad:
        print(f"warning: {', '.join(bad)} ended badly while other nodes still run; "
              f"stop the run with `clusterddp stop {run_id}`")


def _env_lines(rec: RunRecord) -> list[tuple[str, str, list[str]]]:
    """Each `packages:` environment the run's nodes ran in: (id, lock sha256, hosts)."""
    out: dict[tuple[str, str], list[str]] = {}
    for n in rec.nodes:
        if n.settings.env_id:
            out.setdefault((n.settings.env_id, n.settings.lock_sha256 or "?"), []).append(n.host)
    return [(e, lock, hosts) for (e, lock), hosts in out.items()]


def _environments(store: RunStore, run_id: str) -> dict | None:
    """`runs --json`: each node's environment id and lock sha256 (None for a run without `packages:`)."""
    try:
        rec = store.load(run_id)
    except Exception:  # noqa: BLE001 - a damaged record is listed as the index has it
        return None
    got = {n.host: {"env_id": n.settings.env_id, "lock_sha256": n.settings.lock_sha256}
           for n in rec.nodes if n.settings.env_id}
    return got or None


def _nodes(n: int) -> str:
    return "its job" if n == 0 else f"its {n} node{'s' if n != 1 else ''}"


@handle_errors
def logs(run: str = RUN, runs_dir: str = RUNS_DIR,
         follow: bool = typer.Option(False, "--follow", "-f", help="Stream until the run ends."),
         host: list[str] | None = typer.Option(None, "--host", help="Only this host (repeatable)."),
         tail: int | None = typer.Option(None, "--tail", min=0, help="Only the last N lines of each node."),
         raw: bool = RAW, quiet: bool = QUIET) -> None:
    """Print RUN's node logs with host prefixes: from the nodes when reachable, else the local copies."""
    from .. import backends
    from ..record import RunStatus
    store = _store(runs_dir)
    run_id = store.resolve(run)
    rec = store.load(run_id)
    if not store.can_write(run_id):  # logs only looks: print them, keep the local copies as they are
        err(f"note: {store.run_dir(run_id)} cannot be written; local log copies are not refreshed")
        store = _store(runs_dir, read_only=True)
    names = rec.hosts
    unknown = [h for h in host or [] if h not in names]
    if unknown:
        from ..errors import UsageError
        raise UsageError(f"--host {', '.join(unknown)}: not a host of run {run_id}", f"choose from {', '.join(names)}")
    hide = quiet_filter(quiet)
    printer = PrefixPrinter(names, raw=raw, hide=hide)
    from_lines: dict[str, int] = {}

    def show(h: str, source: str, f: BinaryIO | None) -> None:
        if source != "node":
            err(f"{h}: node not reachable; showing the {source}")
        # Line by line from the file (a log may be larger than memory); complete lines only: a
        # partial last one comes with --follow. --tail keeps only the last lines in memory.
        last: deque[bytes] = deque(maxlen=tail)
        n = 0
        for line in f or ():
            if not line.endswith(b"\n"):
                break
            n += 1
            if tail is None:
                printer(h, line)
            else:
                last.append(line)
        printer(h, b"".join(last))
        from_lines[h] = n + 1
    backend = backends.for_record(rec)
    backend.logs(store, run_id, host, show)
    if follow and rec.status is RunStatus.RUNNING:
        backend.follow(store, run_id, printer.until_closed, host, from_lines)
        printer.flush()
    tell_hidden(hide, f"{store.run_dir(run_id) / 'logs'}/")


@handle_errors
def stop(run: str = RUN, runs_dir: str = RUNS_DIR,
         grace: float = typer.Option(10.0, "--grace", min=0, help="Seconds between SIGTERM and SIGKILL.")) -> None:
    """End RUN on every node (SIGTERM, then SIGKILL), mark it stopped, and collect its logs."""
    from .. import backends
    store = _store(runs_dir)
    run_id = store.resolve(run)
    rec = store.load(run_id)
    store.check_writable(run_id)  # never end a job whose ending cannot be recorded: it would stay "running"
    done = backends.for_record(rec).stop(store, run_id, grace)
    print(f"run {run_id}: {done.record.status}")
    for n in done.record.nodes:
        print(_node_line(n) + (f"; {visible(done.how[n.host])}" if n.host in done.how else ""))
    for host, how in done.how.items():  # a host an earlier attempt lost (a run with spares)
        if host not in done.record.hosts:
            print(f"  {host}: {visible(how)}")
    if done.not_stopped:
        err("some nodes could not be stopped; run `clusterddp stop` again once they answer")
        raise typer.Exit(1)
