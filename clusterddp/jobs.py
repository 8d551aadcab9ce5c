"""One run, from plan to record: the steps behind `clusterddp up`, free of any printing.

The CLI calls :func:`prepare` (pure planning plus the run record) and then :func:`execute`
(start, watch, collect, record the outcome).
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from . import inventory as inv_mod
from . import plan as P
from .artifacts import CollectResult, collect_nodes
from .errors import HostError, RunFailed, UsageError
from .record import NodeRecord, NodeState, RunRecord, RunStatus
from .store import RunStore, new_run_id, utcnow
from .fleet import Fleet
from .supervisor import RunOutcome, Supervisor

SKIP_DIRS = {".git", "__pycache__", ".clusterddp", ".pytest_cache", ".mypy_cache", ".venv"}


@dataclass(frozen=True)
class Prepared:
    plan: P.LaunchPlan
    store: RunStore
    source_dir: Path


def load_inventory(arg: str, gpus: int | None) -> inv_mod.Inventory:
    if arg == inv_mod.LOCAL:
        return inv_mod.local(gpus=gpus or "auto", python=sys.executable)
    return inv_mod.load(arg)


def prepare(inventory_arg: str, spec: P.RunSpec, runs_dir: str, hosts: list[str] | None = None,
            run_id: str | None = None) -> Prepared:
    """Validate input and plan the run (no network). Raises UsageError for bad input."""
    script = Path(spec.script)
    if not script.is_file():
        raise UsageError(f"script {spec.script}: no such file", "pass the path of your training script")
    inventory = load_inventory(inventory_arg, spec.gpus)
    if hosts is not None:
        inventory = inventory.select(hosts)
    store = RunStore(runs_dir)
    run_id = run_id or new_run_id()
    local = {}
    if inventory_arg == inv_mod.LOCAL:
        local = dict(local_run_dir=os.getcwd(), local_control_dir=str(store.run_dir(run_id) / "node"))
    plan = P.build_plan(inventory, spec, run_id, **local)
    return Prepared(plan, store, script.resolve().parent)


def pack(prep: Prepared) -> bytes | None:
    """The script's folder to upload (None in local mode); an unreadable file is bad input."""
    if not prep.plan.upload:
        return None
    try:
        return source_tarball(prep.source_dir, prep.store.root)
    except OSError as e:
        raise UsageError(f"cannot pack the script's folder {prep.source_dir}: {e}",
                         "make every file there readable, or move the script to a folder of its own") from None


def source_tarball(source_dir: Path, runs_dir: Path) -> bytes:
    """The script's folder as a gzip tarball, without VCS, caches and the runs folder."""
    buf = io.BytesIO()
    skip_abs = {runs_dir.resolve()}

    def keep(ti: tarfile.TarInfo) -> tarfile.TarInfo | None:
        parts = Path(ti.name).parts
        if any(p in SKIP_DIRS for p in parts) or (source_dir / ti.name).resolve() in skip_abs:
            return None
        return ti
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for entry in sorted(os.listdir(source_dir)):
            tar.add(source_dir / entry, arcname=entry, filter=keep)
    return buf.getvalue()


def new_record(prep: Prepared, inventory_arg: str, schedule: str | None = None) -> RunRecord:
    plan = prep.plan
    return RunRecord(
        run_id=plan.run_id, name=plan.spec.name,
        inventory=inventory_arg if inventory_arg == inv_mod.LOCAL else str(Path(inventory_arg).resolve()),
        script=plan.spec.script, args=tuple(plan.spec.script_args), status=RunStatus.RUNNING, failed_host=None,
        schedule=schedule, local=plan.local, started_at=utcnow(), ended_at=None, launch_dir=os.getcwd(),
        master_addr=plan.master_addr, master_port=plan.master_port, collect=tuple(plan.collect),
        fanout=plan.inventory.fanout,
        nodes=tuple(NodeRecord(host=n.host.name, address=n.host.address, node_rank=n.node_rank, nproc=n.nproc,
                               run_dir=n.run_dir, control_dir=n.control_dir, marker=n.marker, settings=n.host,
                               state=NodeState.PENDING) for n in plan.nodes))


def node_states(sup: Supervisor) -> dict[str, tuple[NodeState, int | None, str | None]]:
    """What the supervisor saw of each node, for :meth:`RunRecord.seen`."""
    return {n.name: (n.state, n.exit_code, n.error) for n in sup.nodes}


def preflight(plan: P.LaunchPlan, connect: Callable | None = None) -> Fleet | None:
    """Before starting a job, the cheap checks that catch a job that would hang or fail at once.

    One short SSH command per host, in parallel: every host answers, python/torch/CUDA agree,
    an interface routes to the master, the master port is free. Raises
    :class:`~clusterddp.check.PreflightFailed` (exit 1) naming each problem; otherwise returns
    the open connections, for :func:`execute` to reuse. Local runs need none of it: None.
    """
    if plan.local:
        return None
    from .check import PreflightFailed, run_checks
    fleet = Fleet(plan.inventory.hosts, fanout=plan.inventory.fanout, **({"connect": connect} if connect else {}))
    try:
        report = run_checks(plan.inventory, full=False, master_port=plan.master_port, fleet=fleet,
                            env={n.host.name: n.env for n in plan.nodes})
    except BaseException:
        fleet.close()
        raise
    if not report.ok:
        fleet.close()
        raise PreflightFailed(report, plan.inventory.path)
    return fleet


def execute(prep: Prepared, on_output: Callable[[str, bytes], None], *, detach: bool = False,
            on_collect: Callable[[CollectResult], None] = lambda r: None,
            connect: Callable | None = None, fleet: Fleet | None = None,
            source_tar: bytes | None = None) -> RunOutcome | None:
    """Start the run; unless ``detach``, watch it to the end, collect, and record the outcome.

    ``fleet`` (from :func:`preflight`) is the run's connections, already open; ``source_tar``
    (from :func:`pack`) is the script's folder to upload.
    Raises RunFailed (exit 1) when the job failed, KeyboardInterrupt after a Ctrl-C teardown.
    """
    plan, store = prep.plan, prep.store
    run_id = plan.run_id

    def output(host: str, data: bytes) -> None:
        store.append_log(run_id, host, data)
        on_output(host, data)
    fleet = fleet or Fleet([n.host for n in plan.nodes], fanout=plan.inventory.fanout,
                           **({"connect": connect} if connect else {}))
    sup = Supervisor(plan, on_output=output, source_tar=source_tar, fleet=fleet)
    try:
        try:
            sup.start()
        except HostError as e:
            finish(store, run_id, sup, RunOutcome(RunStatus.FAILED, sup.outcomes(), e.host))
            raise
        except KeyboardInterrupt:  # Ctrl-C while nodes start: end what started, record the stop
            sup.teardown()
            finish(store, run_id, sup, RunOutcome(RunStatus.STOPPED, sup.outcomes()))
            raise
        store.update(run_id, lambda rec: rec.seen(node_states(sup)))
        if detach:
            return None
        try:
            outcome = sup.follow()
        except KeyboardInterrupt:
            store.close_logs()
            collect(fleet, plan, store, on_collect)
            finish(store, run_id, sup, sup.outcome)
            raise
        store.close_logs()
        collect(fleet, plan, store, on_collect)
        status = finish(store, run_id, sup, outcome)
        if status is not RunStatus.SUCCEEDED:
            raise RunFailed(run_id, list(outcome.nodes), outcome.first_failed, status)
        return outcome
    finally:
        store.close_logs()
        sup.close()


def collect(fleet: Fleet, plan: P.LaunchPlan, store: RunStore, on_collect: Callable[[CollectResult], None]
            ) -> list[CollectResult]:
    results = collect_nodes(fleet, plan.nodes, store, plan.run_id, plan.collect)
    for r in results:
        on_collect(r)
    return results


def finish(store: RunStore, run_id: str, sup: Supervisor, outcome: RunOutcome) -> RunStatus:
    """Record how the run ended; return the status recorded."""
    def ended(rec: RunRecord) -> RunRecord:
        rec = rec.seen(node_states(sup))
        if rec.status is RunStatus.STOPPED:  # `clusterddp stop` from another terminal: a stop, not a failure
            return replace(rec, ended_at=rec.ended_at or utcnow())
        return replace(rec, status=outcome.status, failed_host=outcome.first_failed, ended_at=utcnow())
    return store.update(run_id, ended).status
