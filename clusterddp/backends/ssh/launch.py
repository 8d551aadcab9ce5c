"""One SSH (or `local`) run, from plan to record: the steps behind `clusterddp up`, free of any printing.

:func:`prepare` plans (no network); :class:`SSHLaunch` fills in the steps of the one sequence
(:class:`clusterddp.backends.lifecycle.Launch`: ready with preflight and lease, record,
:func:`execute`: start, watch, then :func:`.lifecycle.end`; a next attempt after a failed one),
telling a :class:`clusterddp.backends.base.Events` what happens.
"""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, cast

from ... import inventory as inv_mod
from ... import plan as ssh_plan
from ... import stragglers, upload
from ...artifacts import CollectResult, collect_nodes
from ...errors import HostError, UsageError
from ...failure import Failure
from ...fleet import Fleet, GroupResult
from ...metrics.idle import NodeIdle, watch_every
from ...metrics.idle import Watch as IdleWatch
from ...mirror import Mirror, unprotected
from ...record import Attempt, NodeRecord, NodeState, ResumedFrom, RunRecord, RunStatus
from ...runspec import ResolvedSpec
from ...store import RunStore, new_run_id
from ...transport import Transport
from ...upload import DEFAULT_MAX_UPLOAD
from .. import base, inventory_keys, lifecycle
from ..base import RunOutcome
from . import attempts
from .supervisor import Supervisor

if TYPE_CHECKING:  # leases are not needed by `up local`
    from ...leases import Lease
    from ...policy import Decision


@dataclass(frozen=True)
class Prepared:
    plan: ssh_plan.LaunchPlan
    store: RunStore
    source_dir: Path
    folder: upload.SourceFolder | None = None  # what the upload sends, as scanned when planning
    notes: tuple[str, ...] = ()  # lines `up` says before anything starts (a spare in place of a quarantined host)
    resumes: RunRecord | None = None  # --resume RUN: that run, checked (clusterddp.resume)
    locks: dict | None = None  # `packages:`: each host's lock (clusterddp.envs), its environment built before the job
    connecting: Connecting | None = None  # the run's connections, opening beside the rest of `up`'s own work


def prepare(inventory_arg: str, spec: ResolvedSpec, runs_dir: str, hosts: list[str] | None = None,
            run_id: str | None = None, exclude: list[str] | None = None,
            loaded: inv_mod.Inventory | None = None, slots: dict[str, tuple[int, ...]] | None = None,
            nodes: tuple[int, int] | None = None, secrets: tuple[upload.Secret, ...] = (),
            resume: str | None = None, schedule: str | None = None, contact: bool = False) -> Prepared:
    """Validate input and plan the run (no network). Raises UsageError for bad input. ``spec``: the
    run's flags resolved against the inventory (:func:`clusterddp.runspec.resolve`, by the caller: once).
    ``contact`` (a run that starts, not a dry run): once the run's hosts are known (the inventory read and
    checked, narrowed), their connections start opening (:class:`Connecting`) beside the rest of this
    work and the upload's packing; no command is sent before the plan is built, and a refusal after
    that point closes them.
    ``loaded``: that inventory, when the caller has it (else it is read again here). ``slots``: a fixed choice of
    GPUs by host (``--hosts gpu-01:0,1``), over the inventory's. ``nodes``: ``--nodes MIN:MAX``
    (the run starts on the first MAX hosts). ``secrets``: files never uploaded
    (:func:`clusterddp.upload.secret_files`; the inventory's own are added here). ``resume``: ``--resume
    RUN`` (``schedule``: the schedule starting the run, for ``previous``), checked against this run
    store (:func:`clusterddp.resume.resolve`)."""
    script = base.check_script(spec.script)
    inventory = loaded or base.load_inventory(inventory_arg, spec.gpus)
    secrets = (*upload.secret_files(inventory), *secrets)  # every host's, before --hosts narrows them
    if not inventory.hosts:
        raise UsageError(f"{inventory.path} lists no hosts, which this command runs on",
                         "give it an inventory with `hosts:`")
    inventory = inventory.narrow(hosts, exclude)
    first, problem = attempts.start_hosts(inventory.hosts, nodes)
    if problem:
        raise UsageError(problem, "give a smaller MIN, or list more hosts (--hosts, --exclude choose among them)")
    inventory = inventory.in_use(first)
    notes: tuple[str, ...] = ()
    if inventory_arg != inv_mod.LOCAL:
        from ... import quarantine
        inventory, notes = _spares_for_quarantined(inventory)
        quarantine.refuse(inventory.hosts)  # a machine set aside: this run neither waits for it nor uses it
    if slots:
        inventory = replace(inventory, hosts=tuple(replace(h, slots=slots[h.name], gpus=len(slots[h.name]))
                                                   if h.name in slots else h for h in inventory.hosts))
    connecting = Connecting(inventory) if contact and inventory_arg != inv_mod.LOCAL else None
    try:
        return _planned(inventory_arg, inventory, spec, runs_dir, script, secrets, notes, resume, schedule, run_id,
                        connecting)
    except BaseException:
        if connecting is not None:
            connecting.close()
        raise


def _planned(inventory_arg: str, inventory: inv_mod.Inventory, spec: ResolvedSpec, runs_dir: str, script: Path,
             secrets: tuple[upload.Secret, ...], notes: tuple[str, ...], resume: str | None, schedule: str | None,
             run_id: str | None, connecting: Connecting | None) -> Prepared:
    """:func:`prepare`, once the run's hosts are known: the resumed run, the script folder, the plan, the locks."""
    store = RunStore(runs_dir)
    resumes = None
    if resume is not None:
        from ... import resume as resuming
        where = inventory_arg if inventory_arg == inv_mod.LOCAL else str(Path(inventory_arg).resolve())
        resumes = resuming.resolve(store, resume, inventory=where, script=spec.script, schedule=schedule)
        from .. import name_of_record
        if resumes is not None and name_of_record(resumes) != "ssh":
            raise UsageError(f"--resume {resume}: run {resumes.run_id} ran on another backend "
                             f"({name_of_record(resumes)})", "give a run of this inventory's hosts")
        if resumes is None:
            notes += (f"[clusterddp] --resume {resume}: schedule {schedule} has no earlier run; this run starts "
                      "from scratch",)
    run_id = run_id or new_run_id()
    local: dict = {}
    if inventory_arg == inv_mod.LOCAL:
        local = dict(local_run_dir=os.getcwd(), local_control_dir=str(store.run_dir(run_id) / "node"))
        if ssh_plan.static_local(spec):  # its rendezvous needs a port, free now
            spec = replace(spec, master_port=local_port(spec.master_port if spec.port_fixed else None))
    source_dir = script.resolve().parent
    # A script whose folder never names clusterddp cannot import clusterddp.train: its nodes need not
    # look for one (a python start on each node before torchrun; issue 24, section 7).
    folder = None if local else upload.scan(source_dir, store.root, secrets, inventory_keys=inventory_keys())
    lookup = folder is None or upload.mentions_clusterddp(folder)
    plan = ssh_plan.build_plan(inventory, spec, run_id, **local, train_lookup=lookup)
    from ...envs.nodes import locks  # a lock that is not one is refused before anything starts
    return Prepared(plan, store, source_dir, folder, notes, resumes, locks(inventory) or None, connecting)


def _spares_for_quarantined(inventory: inv_mod.Inventory) -> tuple[inv_mod.Inventory, tuple[str, ...]]:
    """A quarantined host of the run replaced by the first spare that is not quarantined (with what to
    say of it); with too few such spares, the inventory as it was (the refusal then names the host)."""
    from ... import quarantine
    if not inventory.spares:
        return inventory, ()
    found = quarantine.quarantined((*inventory.hosts, *inventory.spares))
    out = [h.name for h in inventory.hosts if h.name in found]
    if not out:
        return inventory, ()
    nxt = attempts.next_hosts(inventory.hosts, out, attempts.candidates(inventory.spares, (), found), None)
    if isinstance(nxt, str):
        return inventory, ()
    spares = tuple(s for s in inventory.spares if s.name not in nxt.in_)
    notes = tuple(f"[clusterddp] {h} is quarantined until {quarantine.stamp(found[h].until)} ({found[h].why}): "
                  f"spare {s} runs in its place (`clusterddp quarantine release {h}` lets it back)"
                  for h, s in zip(nxt.out, nxt.in_, strict=True))
    return inventory.in_use(nxt.hosts, spares), notes


def _environments(prep: Prepared, fleet: Fleet, events: base.Events,
                  grants: dict[str, tuple[int, ...]] | None = None) -> Prepared:
    """Each node's `packages:` environment made ready (:mod:`clusterddp.envs.nodes`: what it lacks sent,
    built in parallel), said; the run planned with each environment's python (on ``grants``, a lease's slots)."""
    from ...envs import nodes as env_nodes
    # read again for the hosts the run has now: a spare in place of a host down at the start has its own
    inv = prep.plan.inventory
    plans = env_nodes.survey(fleet, inv.hosts, env_nodes.locks(inv))
    for p in plans.values():
        if not p.ready:
            events.warn(f"[clusterddp] {p.host.name}: {p.says()}")
    # the spares' too, now, beside the hosts' builds (after the survey has filled the wheel cache): a later
    # attempt that brings one in then neither waits for a build nor runs with the base python
    spares = _Beside(lambda: env_nodes.spares_ready(inv.spares, inv.fanout, events.warn)) if inv.spares else None
    made = env_nodes.ready(fleet, plans, on_wait=lambda s: events.warn(f"[clusterddp] {s}"))
    events.warn(f"[clusterddp] {env_nodes.summary(made)}")
    inv = env_nodes.apply(inv, made)
    if spares is not None:
        inv = replace(inv, spares=cast(tuple[inv_mod.Host, ...], spares.result()))
    here = prep.plan.nodes[0] if prep.plan.local else None  # `up local`: the job runs in place, as planned
    plan = ssh_plan.build_plan(inv, prep.plan.spec, prep.plan.run_id, train_lookup=prep.plan.train_lookup,
                        local_run_dir=here.run_dir if here else None,
                        local_control_dir=here.control_dir if here else None, grants=grants)
    # the fleet's own host settings too: the preflight's probe (fleet.run) runs each host's python
    fleet.hosts = tuple(n.host for n in plan.nodes)
    return replace(prep, plan=plan)


def _folded(prep: Prepared, skip_check: bool) -> dict[str, dict] | None:
    """`packages:` environments that were ready when this machine last looked (and a run with no spares to
    make ready, that runs its preflight): each host's look, for the preflight's own command (one command per
    node, beside the lease, not a look before both); None: they are made ready first, as usual."""
    from ...envs import nodes as env_nodes
    inv = prep.plan.inventory
    if not prep.locks or skip_check or prep.plan.local or inv.spares:
        return None
    by_host = env_nodes.locks(inv)
    if not by_host or not env_nodes.likely_ready(inv.hosts, by_host):
        return None
    return {h.name: env_nodes.look_args(h, by_host[h.name]) for h in inv.hosts if h.name in by_host}


def _environments_found(prep: Prepared, fleet: Fleet, events: base.Events, looks: dict[str, dict],
                        outs: dict[str, bytes], lease: Lease | None) -> Prepared:
    """After a preflight that looked at the environments too (:func:`_folded`): the run planned with each
    environment's python when all were ready; else they are made ready now (the lease is held) and the
    preflight runs again, on their pythons."""
    from ...envs import nodes as env_nodes
    grants = lease.grants if lease is not None else None
    made = env_nodes.found_ready(looks, outs)
    if made is None:
        prep = _environments(prep, fleet, events, grants)
        preflight(prep.plan, fleet=fleet)
        return prep
    events.warn(f"[clusterddp] {env_nodes.summary(made)}")
    plan = prep.plan
    plan = ssh_plan.build_plan(env_nodes.apply(plan.inventory, made), plan.spec, plan.run_id, grants=grants,
                               train_lookup=plan.train_lookup, attempt=plan.attempt)
    fleet.hosts = tuple(n.host for n in plan.nodes)
    return replace(prep, plan=plan)


def _spares_for_down(prep: Prepared, fleet: Fleet, failed: dict[str, Exception], events: base.Events
                     ) -> tuple[Prepared, Fleet]:
    """A run's hosts that are down as it starts (:func:`.attempts.down_hosts`) replaced by the first
    spares that answer and are not quarantined, said; with too few, the run as it was (the preflight
    then names the host). Returns the run and its connections (a new fleet when the hosts changed)."""
    from ... import quarantine
    from ...errors import QuarantineError
    down = attempts.down_hosts(failed)
    inv = prep.plan.inventory
    if not down:
        return prep, fleet
    try:
        aside = quarantine.quarantined(inv.spares)
    except QuarantineError:  # up refused a damaged file already, for the run's own hosts
        aside = {}
    spares = attempts.candidates(inv.spares, [h.name for h in inv.hosts], aside)
    with Fleet(spares, fanout=inv.fanout) as probe:
        answered = probe.open().succeeded
    nxt = attempts.next_hosts(inv.hosts, down, [s for s in spares if s.name in answered], None)
    if isinstance(nxt, str):
        return prep, fleet
    plan = ssh_plan.build_plan(inv.in_use(nxt.hosts, tuple(s for s in inv.spares if s.name not in nxt.in_)),
                        prep.plan.spec, prep.plan.run_id, train_lookup=prep.plan.train_lookup)
    for h, s in zip(nxt.out, nxt.in_, strict=True):
        events.warn(f"[clusterddp] {h} does not answer ({down[h]}): spare {s} runs in its place")
    fleet.close()
    fleet = Fleet([n.host for n in plan.nodes], fanout=inv.fanout)
    fleet.open()
    return replace(prep, plan=plan), fleet


def local_port(fixed: int | None) -> int:
    """The master port of an ``up local`` run: ``fixed`` (--master-port) when nothing listens on
    it, else a UsageError naming it; without one, a port the kernel finds free. Between this and
    torchrun's bind (0.3-0.5 s) another program could take it, but the kernel hands each bind(0) a
    random port of its ~28000 ephemeral ones and prefers the other parity for outgoing connections."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a finished run's TIME_WAIT is no listener
        try:
            s.bind(("", fixed or 0))
        except OSError as e:
            raise UsageError(f"--master-port {fixed}: cannot listen on it on this machine ({e.strerror})",
                             "choose another port, or leave --master-port out and `up local` takes a free one"
                             ) from None
        return s.getsockname()[1]


def describe_upload(prep: Prepared, max_upload: int = DEFAULT_MAX_UPLOAD) -> str | None:
    """For --dry-run: what the upload would send (None in local mode); over the limit is bad input."""
    if not prep.plan.upload:
        return None
    folder = prep.folder or upload.scan(prep.source_dir, prep.store.root, inventory_keys=inventory_keys())
    upload.check_upload_size(folder, max_upload)
    return "\n".join(folder.described())


def pack(prep: Prepared, max_upload: int = DEFAULT_MAX_UPLOAD) -> upload.Upload | None:
    """The script's folder to upload (:func:`clusterddp.upload.pack`), None in local mode; over
    ``max_upload`` bytes, or an unreadable file, is bad input."""
    if not prep.plan.upload:
        return None
    folder = prep.folder or upload.scan(prep.source_dir, prep.store.root, inventory_keys=inventory_keys())
    upload.check_upload_size(folder, max_upload)
    return upload.pack(folder)


def new_record(prep: Prepared, inventory_arg: str, schedule: str | None = None,
               resumed_from: ResumedFrom | None = None) -> RunRecord:
    plan = prep.plan
    return base.new_record(
        inventory_arg, plan.spec, plan.run_id, schedule=schedule, local=plan.local, master_addr=plan.master_addr,
        master_port=plan.master_port, collect=plan.collect, fanout=plan.inventory.fanout,
        nodes=node_records(plan), resumed_from=resumed_from)


def node_records(plan: ssh_plan.LaunchPlan) -> list[NodeRecord]:
    """The record's nodes for ``plan``, as they are before its job starts."""
    return [NodeRecord(host=n.host.name, address=n.host.address, node_rank=n.node_rank, nproc=n.nproc,
                       run_dir=n.run_dir, control_dir=n.control_dir, marker=n.marker, settings=n.host,
                       state=NodeState.PENDING) for n in plan.nodes]


def node_states(sup: Supervisor) -> dict[str, tuple[NodeState, int | None, str | None]]:
    """What the supervisor saw of each node, for :meth:`RunRecord.seen`."""
    return {n.name: (n.state, n.exit_code, n.error) for n in sup.nodes}


def preflight(plan: ssh_plan.LaunchPlan, connect: Callable | None = None, fleet: Fleet | None = None,
              env_looks: dict[str, dict] | None = None, outs: dict[str, bytes] | None = None) -> Fleet | None:
    """Before starting a job, the cheap checks that catch a job that would hang or fail at once.

    One short SSH command per host, in parallel: every host answers, python/torch/CUDA agree,
    an interface routes to the master, the master port is free. Raises
    :class:`~clusterddp.errors.PreflightFailed` (exit 1) naming each problem; otherwise returns
    the open connections, for :func:`execute` to reuse. ``fleet``: connections to use (the caller
    keeps them, open, whatever happens); else a fleet of its own, closed when it raises. Local runs
    need none of it: None. ``env_looks`` (:func:`_folded`): each host's `packages:` environment looked at in
    the same command, its output put in ``outs``; when one is not ready the verdict waits (nothing raised):
    the caller makes it ready and runs the preflight again.
    """
    if plan.local:
        return None
    from ...check import preflight_failed, run_checks
    own = fleet is None
    fleet = fleet or Fleet(plan.inventory.hosts, fanout=plan.inventory.fanout,
                           **({"connect": connect} if connect else {}))
    try:
        seen = {} if outs is None else outs
        report = run_checks(plan.inventory, full=False, master_port=plan.master_port, fleet=fleet,
                            env={n.host.name: n.env for n in plan.nodes}, check_port=port_fixed(plan),
                            env_looks=env_looks, on_stdout=seen.__setitem__ if env_looks else None)
        if not report.ok and not (env_looks and _unready(env_looks, seen)):
            raise preflight_failed(report, plan.inventory.path)
    except BaseException:
        if own:
            fleet.close()
        raise
    return fleet


class Connecting:
    """The connections to an inventory's hosts (in node-rank order, as the plan's nodes), opening in a
    thread of their own (:meth:`.Fleet.open`) from when the hosts are known: `up`'s own work that
    follows (the script folder's scan, the plan, the locks, the upload's tarball) goes on meanwhile.
    :meth:`result` waits for them; :meth:`close` closes them, at once or, while they still open, as
    soon as they have (nothing is left open whatever the order)."""

    def __init__(self, inventory: inv_mod.Inventory, connect: Callable | None = None) -> None:
        self.fleet: Fleet = Fleet(inventory.ranked(), fanout=inventory.fanout,
                                  **({"connect": connect} if connect else {}))
        self._lock = threading.Lock()
        self._closed = False
        self._opening = _Beside(self._open, name="connect")

    def _open(self) -> object:
        opened = self.fleet.open()
        with self._lock:
            if self._closed:  # closed while opening: what opened is closed too
                self.fleet.close()
        return opened

    def result(self) -> GroupResult[str, Transport]:
        """Every host's connection, or why it could not be opened (:meth:`.Fleet.open`)."""
        return cast("GroupResult[str, Transport]", self._opening.result())

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self.fleet.close()


def _unready(env_looks: dict[str, dict], outs: dict[str, bytes]) -> bool:
    from ...envs import nodes as env_nodes
    return env_nodes.found_ready(env_looks, outs) is None


class _Beside:
    """``fn()`` run in a thread of its own, beside what the caller does meanwhile; :meth:`result`
    waits for it and returns its value or raises what it raised."""

    def __init__(self, fn: Callable[[], object], name: str = "preflight") -> None:
        self._fn = fn
        self._value: object = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._value = self._fn()
        except BaseException as e:  # noqa: BLE001 - handed to the caller by result()
            self._error = e

    def result(self) -> object:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._value


def port_fixed(plan: ssh_plan.LaunchPlan) -> bool:
    """The master port was given (--master-port, or master.port in the inventory); otherwise the
    lease chooses a free one, from the inventory's (29500 by default)."""
    return plan.spec.port_fixed  # clusterddp.runspec.resolve


def take_lease(prep: Prepared, fleet: Fleet, *, wait: bool = False,
               on_wait: Callable[[str], None] = lambda s: None,
               on_note: Callable[[str], None] = lambda s: None) -> tuple[Prepared, Lease | None]:
    """Lease the run's GPU slots (and master port) on every node, waiting in the queue with ``wait``;
    return the run planned on them (one process per slot, ``CUDA_VISIBLE_DEVICES``, the port chosen)
    and the lease, whose :meth:`~clusterddp.leases.Lease.release` gives back what no job took. Local
    runs take none. Slots held by what a lost host kept running of a run of ours that has ended are
    taken (:mod:`.leftovers`), said to ``on_note``."""
    plan = prep.plan
    if plan.local:
        return prep, None
    from ...errors import LeaseBusy
    from ...leases import acquire, launching_user
    from . import leftovers
    # A waiting run tries once without waiting first: a leftover would hold its place in the queue for ever.
    tries = len(plan.nodes) + 1  # each try after the first has ended the leftovers on one more node
    while True:
        try:
            lease = acquire(plan, fleet, port_fixed=port_fixed(plan))
            break
        except LeaseBusy as e:
            tries -= 1
            host = next((n.host for n in plan.nodes if n.host.name == e.host), None)
            found = [] if host is None or tries == 0 else leftovers.leftovers(
                host.name, e.holders, leftovers.loader(prep.store), launching_user())
            ended = leftovers.end(fleet, host, found) if host is not None and found else []
            for x, problem in ended:
                on_note(leftovers.taken(x, problem))
            if ended and not any(problem for _, problem in ended):
                continue
            if not wait:
                raise
            lease = acquire(plan, fleet, port_fixed=port_fixed(plan), wait=True, on_wait=on_wait)
            break
    try:
        spec = replace(plan.spec, master_port=lease.port or plan.master_port)
        new = ssh_plan.build_plan(
            plan.inventory, spec, plan.run_id, grants=lease.grants, train_lookup=plan.train_lookup, attempt=plan.attempt
        )
    except BaseException:
        lease.release()
        raise
    return replace(prep, plan=new), lease


def execute(prep: Prepared, on_output: Callable[[str, bytes], None], *, detach: bool = False,
            on_collect: Callable[[CollectResult], None] = lambda r: None,
            connect: Callable | None = None, fleet: Fleet | None = None,
            source_tar: Path | None = None, join_timeout: float = 0.0, may_go_on: bool = False,
            on_detached: Callable[[Fleet, ssh_plan.LaunchPlan], None] = lambda fleet, plan: None,
            on_warn: Callable[[str], None] = lambda line: None,
            on_straggler: Callable[[stragglers.Straggler], None] | None = None,
            on_idle: Callable[[NodeIdle], None] | None = None) -> RunOutcome | None:
    """Start the run; unless ``detach``, watch it to the end, collect, and record the outcome.
    ``may_go_on``: a failed attempt may be followed by another on other hosts (what a lost node's
    collect error says). ``on_detached(fleet, plan)``: once a detached run's every node has started, before
    its connections close (node 0 is armed to tell its end: :func:`clusterddp.notify.arm`).

    ``fleet`` (from :func:`preflight`) is the run's connections, already open; ``source_tar``
    (:attr:`Upload.path` from :func:`pack`) is the tarball of the script's folder, streamed to each node.
    Raises RunFailed (exit 1) when the job failed, KeyboardInterrupt after a Ctrl-C teardown.
    While it watches, :class:`~clusterddp.mirror.Mirror` brings rank 0's checkpoints back as they
    appear (``on_warn``: its problems, one line each; never the run's outcome); with ``on_straggler``,
    :class:`~clusterddp.stragglers.Watch` tells each host the other ranks wait for, as it is named; with
    ``on_idle``, an idle policy without ``stop`` that finds the run idle is told
    (:class:`~clusterddp.metrics.idle.Watch`).
    """
    plan, store = prep.plan, prep.store
    run_id = plan.run_id

    def output(host: str, data: bytes) -> None:
        store.append_log(run_id, host, data)
        on_output(host, data)
    fleet = fleet or Fleet([n.host for n in plan.nodes], fanout=plan.inventory.fanout,
                           **({"connect": connect} if connect else {}))
    sup = Supervisor(plan, on_output=output, source_tar=source_tar, fleet=fleet, join_timeout_s=join_timeout,
                     on_note=on_warn)
    try:
        try:
            sup.start()
        except HostError as e:
            finish(store, run_id, sup, RunOutcome(RunStatus.FAILED, sup.outcomes(), e.host))
            raise
        except KeyboardInterrupt:  # Ctrl-C while nodes start: sup.start ended what started; record the stop
            finish(store, run_id, sup, RunOutcome(RunStatus.STOPPED, sup.outcomes()))
            raise
        mirror = Mirror(fleet, plan, store, warn=on_warn)
        slow = stragglers.Watch(fleet, plan.nodes, on_straggler) if on_straggler is not None and not detach else None
        idle = _idle_watch(fleet, plan, on_idle) if not detach else None
        try:
            store.update(run_id, lambda rec: rec.seen(node_states(sup)))
            if detach:
                on_detached(fleet, plan)
                return None
            mirror.start()
            if slow is not None:
                slow.start()
            if idle is not None:
                idle.start()
        except KeyboardInterrupt:  # Ctrl-C once every node started, before they are watched: as while starting
            mirror.stop()
            if slow is not None:
                slow.stop()
            if idle is not None:
                idle.stop(final=False)
            sup.teardown()
            finish(store, run_id, sup, RunOutcome(RunStatus.STOPPED, sup.outcomes()))
            raise
        stopped = False
        try:
            outcome = sup.follow()
        except KeyboardInterrupt:
            stopped = True
        finally:
            mirror.stop()
            if slow is not None:
                slow.stop()
            if idle is not None:
                idle.stop(final=not stopped)
        if stopped:
            outcome = sup.outcome  # what the Ctrl-C's teardown left of each node
        return lifecycle.end(
            store, run_id, outcome, stopped=stopped, warn=on_warn, states=lambda: node_states(sup),
            collect=lambda: collect(fleet, plan, store, on_collect, sup, may_go_on=may_go_on and not stopped),
            explain=lambda: explain(fleet, plan, store))
    finally:
        store.close_logs()
        sup.close()


def _idle_watch(fleet: Fleet, plan: ssh_plan.LaunchPlan,
                on_idle: Callable[[NodeIdle], None] | None) -> IdleWatch | None:
    """The watch of an idle policy without ``stop`` (with one, the run's end tells it), when ``on_idle`` is given."""
    policy = plan.spec.idle_policy
    if on_idle is None or policy is None or policy[2]:
        return None
    return IdleWatch(fleet, plan.nodes, on_idle, watch_every(policy[1]))


def explain(fleet: Fleet, plan: ssh_plan.LaunchPlan, store: RunStore) -> tuple[str, ...]:
    """Why the run failed (:mod:`clusterddp.postmortem`), recorded in run.json's ``failure``, as the
    summary's lines; when it cannot be worked out, a line saying why (the exit codes still say what
    they say)."""
    from ...hang import explain as postmortem  # a hang when the stall watchdog ended it
    try:
        failure: Failure = postmortem(fleet, plan.nodes, store.load(plan.run_id), store)
        store.update(plan.run_id, lambda rec: replace(rec, failure=failure))
    except Exception as e:  # noqa: BLE001 - a diagnosis that fails must not hide the run's own failure
        return (f"(the root cause could not be worked out: {type(e).__name__}: {e})",)
    return tuple(failure.lines())


def collect(fleet: Fleet, plan: ssh_plan.LaunchPlan, store: RunStore, on_collect: Callable[[CollectResult], None],
            sup: Supervisor | None = None, may_go_on: bool = False) -> list[CollectResult]:
    """Bring back every node's log and files, except from nodes ``sup`` saw lost: they are not
    tried (their link is gone), and the result says how to fetch them once they answer again
    (``may_go_on``: unless the run goes on without them, which then leaves them out of its record).
    A node whose follower sent its log whole is not asked when there are no globs (``collect_nodes``)."""
    lost = {n.name for n in sup.nodes if n.state is NodeState.LOST} if sup is not None else set()
    streamed = {n.name: n.whole for n in sup.nodes if n.whole is not None} if sup is not None else {}
    got = {r.host: r for r in collect_nodes(fleet, [n for n in plan.nodes if n.host.name not in lost], store,
                                             plan.run_id, plan.collect, streamed=streamed)}
    later = (f"`clusterddp collect {plan.run_id}` fetches its log and files once it answers again"
             + (" (unless a next attempt of the run goes on without it: they stay on it then)" if may_go_on else ""))
    results = [got.get(n.host.name) or CollectResult(
        n.host.name, error=f"{n.host.name}: not collected: it was lost during the run; {later}")
        for n in plan.nodes]
    for r in results:
        on_collect(r)
    return results


def finish(store: RunStore, run_id: str, sup: Supervisor, outcome: RunOutcome) -> RunStatus:
    """Record how the run ended; return the status recorded."""
    return base.finish(store, run_id, node_states(sup), outcome)


def resume_found(prep: Prepared, req: base.LaunchRequest, events: base.Events, connect: Callable | None = None
                 ) -> tuple[Prepared, list | None]:
    """With ``--resume`` (``prep.resumes``): the newest checkpoints that run left, here
    (:func:`clusterddp.resume.find`; ``connect``: to its nodes), and the run planned to upload none
    of the script folder's files at their paths. A run that left none is refused (exit 2), but for
    ``--resume previous``: a schedule's run then starts from scratch, said (refused, it would be
    refused at every firing after, its previous run being the same)."""
    if prep.resumes is None:
        return prep, None
    from ... import resume as resuming
    try:
        chosen = resuming.find(prep.store, prep.resumes, warn=events.warn, connect=connect)
    except UsageError as e:
        if req.resume != resuming.PREVIOUS:
            raise
        events.warn(f"[clusterddp] {e.message}; this run starts from scratch")
        return replace(prep, resumes=None), None
    return _without(prep, resuming.paths(chosen), prep.resumes.run_id, events), chosen


def _without(prep: Prepared, paths: set[str], run_id: str, events: base.Events) -> Prepared:
    """``prep`` whose upload leaves out the files at ``paths`` (the resumed checkpoints take their
    place: the upload is unpacked after they are put there), said on the terminal."""
    folder = prep.folder
    clash = sorted(paths & {rel for rel, _ in folder.entries}) if folder is not None else []
    if not clash or folder is None:
        return prep
    events.warn(f"upload: {', '.join(clash[:5])}{' ...' if len(clash) > 5 else ''} left out: run {run_id}'s "
                "checkpoint takes its place")
    return replace(prep, folder=replace(folder, entries=tuple(e for e in folder.entries if e[0] not in paths)))


class SSHLaunch(lifecycle.Launch[Prepared]):
    """The whole `up` of an SSH (or `local`) run, as :class:`.lifecycle.Launch` runs it: ready (pack,
    connections, preflight beside the lease), record, the lease and upload said, execute each attempt
    (:func:`execute`), a next attempt on other hosts after a failed one (:mod:`.attempts`).

    The run id is said once it is recorded: a run refused before (bad input, the preflight, slots
    taken) has no record, so it shows no id that `clusterddp logs` could not find.

    With ``--resume RUN`` (``prep.resumes``), RUN's newest checkpoints are found (and brought here
    from its nodes if need be) first; the upload leaves out a file of the script's folder at one of
    their paths (said), and every node gets them before its job starts (:mod:`clusterddp.resume`)."""

    def __init__(self, prep: Prepared, req: base.LaunchRequest, events: base.Events) -> None:
        super().__init__(prep, req, events)
        self.chosen: list | None = None          # --resume: the checkpoints found
        self.packed: upload.Upload | None = None
        self.fleet: Fleet | None = None          # the run's connections (none for `local`)
        self.connecting: Connecting | None = None  # they, while they open (ready)
        self.lease: Lease | None = None
        self.leased: str | None = None           # the lease, said once the run id is
        self.may_go_on = False                   # a failed attempt may be followed by another

    def ready(self) -> None:
        prep, req, events = self.prep, self.req, self.events
        # Every connection at once, opening (since prepare, or from now) while this side packs the upload
        # and finds what a resume needs: its own work and the nodes' handshakes overlap.
        connecting = None if prep.plan.local else (prep.connecting or Connecting(prep.plan.inventory))
        self.connecting = connecting
        if connecting is not None:
            self.fleet = connecting.fleet
        prep, self.chosen = resume_found(prep, req, events)
        self.packed = pack(prep, req.max_upload)
        if prep.plan.local and prep.locks:  # `up local --packages`: the same machinery, on this machine
            with Fleet(prep.plan.inventory.hosts) as here:
                prep = _environments(prep, here, events)
        if connecting is not None:
            # The connections, then the preflight beside the lease (the lease asks every node at once
            # too): each is a command per node, and a run that passes (most) need not wait
            # for one before the other. A lease taken for a run that then fails its preflight is given
            # back (give_back); a run that may wait in the queue is checked first, so it never waits in vain.
            for note in prep.notes:  # before anything starts (a quarantined host's spare)
                events.warn(note)
            fleet = connecting.fleet
            # a host that cannot be reached is reported by the preflight (or the lease), unless a spare stands in
            opened = connecting.result()
            if opened.failed and prep.plan.inventory.spares:
                prep, fleet = _spares_for_down(prep, fleet, opened.failed, events)
                self.fleet = fleet
            looks = _folded(prep, req.skip_check)  # environments ready last time: looked at in the preflight
            if prep.locks and looks is None:  # before the preflight, which then checks torch in each node's environment
                prep = _environments(prep, fleet, events)
            planned = prep.plan
            outs: dict[str, bytes] = {}  # each host's preflight output (with looks: the environment's look too)
            checked = None if req.skip_check else _Beside(lambda: preflight(planned, fleet=fleet, env_looks=looks,
                                                                            outs=outs))
            if checked is not None and req.wait:
                checked.result()
            run_id = prep.plan.run_id  # a waiting run is not recorded yet: its queue lines name it
            try:
                prep, self.lease = take_lease(prep, fleet, wait=req.wait,
                                              on_wait=lambda s: events.say(f"[clusterddp] run {run_id} {s}"),
                                              on_note=events.warn)  # at once (stdout starts with the run id)
            except KeyboardInterrupt:
                raise  # at once: closing the fleet (give_back) ends the probes
            except BaseException:
                if checked is not None:
                    checked.result()  # its failure is the one to tell, when the lease failed too
                raise
            if checked is not None:
                checked.result()
            if looks is not None:
                prep = _environments_found(prep, fleet, events, looks, outs, self.lease)
            if self.lease is not None:  # said once the run id is (begin)
                self.leased = ("leased: " + ", ".join(f"{h} GPUs {','.join(map(str, s))}"
                                                      for h, s in self.lease.grants.items())
                               + f"; master port {prep.plan.master_port}")
        self.prep = prep

    def first_record(self) -> RunRecord:
        resumed = None
        if self.chosen and self.prep.resumes is not None:
            from ... import resume as resuming
            resumed = resuming.record_of(self.prep.resumes.run_id, self.chosen)
        return new_record(self.prep, self.req.inventory_arg, schedule=self.req.schedule, resumed_from=resumed)

    def give_back(self) -> None:
        if self.lease is not None:
            self.lease.release()
        if self.connecting is not None:  # closed once opened, if they still are
            self.connecting.close()
        if self.fleet is not None:
            self.fleet.close()

    def begin(self) -> None:
        # From here the supervisor's fleet is the lease's: a node whose job was never told to start frees
        # its slots when the fleet's connections close (its holder sees its channel go).
        plan, events = self.prep.plan, self.events
        if self.leased:
            events.say(self.leased)
        if self.packed is not None:
            for line in self.packed.folder.report():
                events.say(line)
        _resume(self.prep, self.req, events, self.chosen, self.fleet, self.lease)
        events.hosts([n.host.name for n in plan.nodes])
        self.may_go_on = self.req.spec.restarts > 0  # clusterddp.runspec.resolve

    def execute(self) -> RunOutcome | None:
        req, events, store = self.req, self.events, self.prep.store

        def arm(fleet: Fleet, plan: ssh_plan.LaunchPlan) -> None:
            _arm_notify(fleet, plan, store, req, events)
        return execute(self.prep, events.output, on_collect=events.collected, detach=req.detach, fleet=self.fleet,
                       source_tar=self.packed.path if self.packed else None, join_timeout=req.join_timeout,
                       may_go_on=self.may_go_on, on_detached=arm, on_warn=events.warn,
                       on_straggler=lambda s: _tell_straggler(store, self.prep.plan.run_id, req, events, s),
                       on_idle=lambda found: _tell_idle(store, self.prep.plan.run_id, req, events, found))

    def after_failure(self) -> None:
        _set_aside(self.prep, self.events)

    def next_attempt(self) -> bool:
        following = None if self.prep.plan.local else _next_attempt(self.prep, self.req, self.events, self.attempt)
        if following is None:
            return False
        self.prep, self.fleet = following
        return True

    def after_detach(self) -> None:
        if (unwatched := unprotected(self.prep.plan)) is not None:
            self.events.warn(unwatched)

    def after_end(self) -> None:
        _after_success(self.prep, self.events)
        _end_lost(self.prep, self.events)

    def release(self) -> None:
        if self.packed is not None:
            self.packed.discard()


def _resume(prep: Prepared, req: base.LaunchRequest, events: base.Events, chosen: list | None,
            fleet: Fleet | None, lease: Lease | None) -> None:
    """What the run starts from, once it is recorded and before any job starts: with ``--resume``, the
    checkpoints ``chosen`` put on every node (:func:`clusterddp.resume.send`), said; a node that does
    not take them ends the run, recorded failed (stopped by Ctrl-C), its folders left for `prune`.
    Without it, the note that an earlier run of the script left one (:func:`clusterddp.resume.hint`)."""
    if prep.plan.local:
        return
    from ... import resume as resuming
    run_id = prep.plan.run_id
    if chosen and prep.resumes is not None:
        assert fleet is not None  # an SSH run's
        try:
            resuming.send(fleet, prep.plan.nodes, prep.store, prep.resumes.run_id, chosen)
        except BaseException as e:
            bad = e if isinstance(e, HostError) else None
            status = RunStatus.STOPPED if isinstance(e, KeyboardInterrupt) else RunStatus.FAILED
            base.finish(prep.store, run_id, {bad.host: (NodeState.FAILED, None, bad.detail)} if bad else {},
                        RunOutcome(status, (), bad.host if bad else None))
            if lease is not None:
                lease.release()
            fleet.close()
            raise
        events.say(resuming.describe(prep.resumes.run_id, chosen, [n.host.name for n in prep.plan.nodes]))
    elif req.resume is None:
        note = resuming.hint(prep.store, inventory=str(Path(req.inventory_arg).resolve()), script=req.spec.script,
                      args=req.spec.script_args, runs_dir_flag=req.runs_dir_flag, before=run_id,
                      inventory_arg=req.inventory_arg)
        if note:
            events.warn(note)


def next_attempt_record(
    r: RunRecord, plan: ssh_plan.LaunchPlan, entry: Attempt, lost: tuple[NodeRecord, ...]
) -> RunRecord:
    """The record as a new attempt starts: its nodes and master, running again, the decision appended to
    ``attempts``, and the hosts it lost added to those every earlier attempt lost (``stop`` reaches each
    once it answers: none is forgotten when a later attempt loses another)."""
    return replace(r, nodes=tuple(node_records(plan)), master_addr=plan.master_addr, master_port=plan.master_port,
                   status=RunStatus.RUNNING, failed_host=None, ended_at=None, failure=None,
                   attempts=(*r.attempts, entry), lost=(*r.lost, *lost))


def _next_attempt(prep: Prepared, req: base.LaunchRequest, events: base.Events, attempt: int
                  ) -> tuple[Prepared, Fleet] | None:
    """After attempt ``attempt`` of an attached run failed (its record says how): the next attempt
    planned, its hosts checked and leased, recorded and said, as :mod:`.attempts` decides; None when
    the run ends there (the decision said and recorded, unless the run allows no new attempt at all,
    which ends as it always did)."""
    from ... import policy
    from ...errors import ClusterDDPError
    budget = req.spec.restarts  # clusterddp.runspec.resolve: --max-restarts > restarts: > --nodes
    if budget == 0:
        return None
    rec = prep.store.load(prep.plan.run_id)
    if rec.status is not RunStatus.FAILED:  # stopped (`clusterddp stop` from elsewhere): no decision to make
        return None
    from ... import quarantine
    inv = prep.plan.inventory
    # A host that failed in an earlier run too is the machine's fault (classify: policy, quarantine)
    decision = policy.after_failure(rec, retry_job_failures=inv.retry_job_failures,
                                    struck=quarantine.Quarantine().struck(rec))

    if not decision.carry_on:
        _ends(prep, events, attempt, decision.why)
        return None
    if attempt - 1 >= budget:
        _ends(prep, events, attempt, policy.ends(decision.why, f"{req.spec.restarts_by} allows no more attempts"),
              decision.hosts)
        return None
    try:
        return _start_next(prep, req, events, attempt, rec, decision)
    except ClusterDDPError as e:
        first = next((line for line in str(e).splitlines() if line.strip()), type(e).__name__)
        _ends(prep, events, attempt, policy.ends(decision.why, f"the next attempt could not start: {first}"),
              decision.hosts)
        return None


def _ends(prep: Prepared, events: base.Events, attempt: int, why: str, out: tuple[str, ...] = ()) -> None:
    """The run ends after attempt ``attempt``: said in one line and kept in run.json's ``attempts``."""
    from ...record import MAX_WHY
    from ...store import utcnow
    events.warn(f"[clusterddp] attempt {attempt} failed; the run ends: {why}")
    entry = Attempt(None, utcnow(), out, (), why[:MAX_WHY])
    prep.store.update(prep.plan.run_id, lambda r: replace(r, attempts=(*r.attempts, entry)))


def _start_next(prep: Prepared, req: base.LaunchRequest, events: base.Events, attempt: int, rec: RunRecord,
                decision: Decision) -> tuple[Prepared, Fleet] | None:
    """:func:`_next_attempt`'s work once the run may go on: spares checked, hosts chosen, the hosts that
    stay readied, the plan leased and recorded; None when no choice of hosts lets it go on."""
    from ... import mirror, policy, quarantine
    from ...errors import QuarantineError
    from ...store import utcnow
    store, run_id, old = prep.store, prep.plan.run_id, prep.plan
    inv = old.inventory
    used = {h for a in rec.attempts for h in (*a.out, *a.in_)} | {h.name for h in inv.hosts}
    try:
        set_aside = quarantine.quarantined(inv.spares)
    except QuarantineError as e:  # a damaged file must not keep a healthy spare out; said
        events.warn(f"quarantine: not read: {e}")
        set_aside = {}
    spares = attempts.candidates(inv.spares, used, set_aside)
    left = tuple(h for h in inv.hosts if h.name not in decision.hosts)
    fleet = Fleet([*left, *spares], fanout=inv.fanout)
    lease = None
    try:
        healthy = spares if req.skip_check else _healthy_spares(old, req, events, left, spares, fleet)
        nxt = attempts.next_hosts(inv.hosts, decision.hosts, healthy, req.nodes)
        if isinstance(nxt, str):
            fleet.close()
            _ends(prep, events, attempt, policy.ends(decision.why, nxt), decision.hosts)
            return None
        # The hosts that stay start in fresh control folders (the old attempt's moved aside, on the node and here).
        kept = [n for n in old.nodes if n.host.name not in nxt.out]
        moved = fleet.each(lambda h, t: t.run(ssh_plan.retire_command(next(n for n in kept if n.host.name == h.name),
                                                               attempt + 1), timeout=60), [n.host for n in kept])
        for host, res in moved.items():
            if isinstance(res, Exception) or res.exit_code != 0:
                why = res if isinstance(res, Exception) else res.stderr.decode("utf-8", "replace").strip()
                raise HostError(host, f"cannot move attempt {attempt}'s control folder aside: {why}")
        store.set_logs_aside(run_id, attempt, [n.host.name for n in old.nodes])
        chosen = _lease_next(prep, req, events, attempt, decision, healthy, fleet, nxt)
        if isinstance(chosen, str):
            fleet.close()
            _ends(prep, events, attempt, policy.ends(decision.why, chosen), decision.hosts)
            return None
        new, lease, nxt = chosen
        for s in spares:
            if s.name not in nxt.in_:
                fleet.close_host(s)
        plan = new.plan
        entry = Attempt(attempt + 1, utcnow(), nxt.out, nxt.in_, decision.why)
        # a lost host's job may run on there: kept in the record, for `stop` to end once it answers
        lost = tuple(n for n in rec.nodes if n.state is NodeState.LOST and n.host in nxt.out)
        store.update(run_id, lambda r: next_attempt_record(r, plan, entry, lost))
        events.say(f"[clusterddp] attempt {attempt + 1} of run {run_id}: {nxt.says()} ({decision.why}); "
                   f"node 0 on {plan.nodes[0].host.name}, master {plan.master_addr}:{plan.master_port}")
        events.hosts([n.host.name for n in plan.nodes])
        # Every node starts from the same checkpoint: rank 0's last one if its host stays, else the mirror's
        m = mirror.Mirror(fleet, old, store, warn=events.warn)
        if m.active and m.host not in nxt.out:
            m.last_look()
        if m.active:
            said, warned = mirror.seed_all(fleet, plan.nodes, store, run_id)
            for line in said:
                events.say(f"[clusterddp] {line}")
            for line in warned:
                events.warn(line)
        return new, fleet
    except BaseException:
        if lease is not None:
            lease.release()
        fleet.close()
        raise


def _lease_next(prep: Prepared, req: base.LaunchRequest, events: base.Events, attempt: int, decision: Decision,
                healthy: list[inv_mod.Host], fleet: Fleet, nxt: attempts.Next
                ) -> tuple[Prepared, Lease, attempts.Next] | str:
    """The next attempt on ``nxt``'s hosts, leased, with the hosts it got. A spare whose slots another
    run holds is said and passed over for the next healthy one (another user's run on it is no reason
    to end this one); with none left, why the run cannot go on. Slots taken on a host that stays end
    the run (LeaseBusy)."""
    from ...errors import LeaseBusy
    inv, run_id = prep.plan.inventory, prep.plan.run_id
    while True:
        plan = ssh_plan.build_plan(inv.in_use(nxt.hosts), req.spec, run_id, train_lookup=prep.plan.train_lookup,
                            attempt=attempt + 1)
        try:
            new, lease = take_lease(replace(prep, plan=plan, notes=()), fleet, on_note=events.say)
        except LeaseBusy as e:
            if e.host is None or e.host not in nxt.in_:
                raise
            events.warn(f"[clusterddp] spare {e.host} is not used: {str(e).splitlines()[0]}")
            healthy = [h for h in healthy if h.name != e.host]
            again = attempts.next_hosts(inv.hosts, decision.hosts, healthy, req.nodes)
            if isinstance(again, str):
                return again
            nxt = again
            continue
        assert lease is not None  # an SSH run's
        return new, lease, nxt


def _healthy_spares(
    old: ssh_plan.LaunchPlan,
    req: base.LaunchRequest,
    events: base.Events,
    left: tuple[inv_mod.Host, ...],
    spares: list[inv_mod.Host],
    fleet: Fleet,
) -> list[inv_mod.Host]:
    """The spares that pass the preflight beside the hosts left (reachable, the same versions, an
    interface to the master), in order; each that does not is said. A host left that fails ends the
    run (PreflightFailed): it would fail the next attempt too."""
    from ...check import FAIL, preflight_failed, run_checks
    if not spares:
        return []
    inv = old.inventory.in_use((*left, *spares))
    plan = ssh_plan.build_plan(inv, req.spec, old.run_id, train_lookup=old.train_lookup)
    report = run_checks(inv, full=False, master_port=plan.master_port, fleet=fleet,
                        env={n.host.name: n.env for n in plan.nodes}, check_port=False)
    failing = {h.host: h for h in report.hosts if h.status == FAIL}
    if any(h.name in failing for h in left):
        raise preflight_failed(report, inv.path)
    for s in spares:
        if s.name in failing:
            problem = next((f.problem for f in failing[s.name].findings if f.status == FAIL), None)
            events.warn(f"[clusterddp] spare {s.name} is not used: {problem}")
    return [s for s in spares if s.name not in failing]
def _arm_notify(fleet: Fleet, plan: ssh_plan.LaunchPlan, store: RunStore, req: base.LaunchRequest,
                events: base.Events) -> None:
    """A detached run with notification targets: node 0 tells its end (:func:`clusterddp.notify.arm`)."""
    if not req.notify:
        return
    from ... import notify
    said, warned = notify.arm(fleet, plan.nodes[0], store.load(plan.run_id), req.notify)
    for line in said:
        events.say(line)
    for line in warned:
        events.warn(line)


def _tell_straggler(store: RunStore, run_id: str, req: base.LaunchRequest, events: base.Events,
                    s: stragglers.Straggler) -> None:
    """A host the other ranks wait for, named while the run goes: said, and told to the targets that want it."""
    from ... import notify
    events.warn(notify.straggler_text(run_id, s.to_json()))
    for line in notify.tell_straggler(req.notify, store, run_id, s.to_json()):
        events.warn(line)


def _tell_idle(store: RunStore, run_id: str, req: base.LaunchRequest, events: base.Events, found: NodeIdle) -> None:
    """The run found idle by its idle policy without ``stop``, going on: said, and told to the targets whose
    ``on`` lists ``idle``."""
    from ... import notify
    events.warn(notify.idle_text(run_id, found.to_json()))
    for line in notify.tell_news(req.notify, store, run_id, notify.idle_event(run_id, found.to_json())):
        events.warn(line)


def _set_aside(prep: Prepared, events: base.Events) -> None:
    """After a failed run: a machine whose GPU failed, or lost twice in a row, is quarantined for the
    inventory's ``quarantine:`` (clusterddp.quarantine), said in one line. Best effort: never the run's outcome."""
    from ... import quarantine
    try:
        added = quarantine.after_run(prep.store.load(prep.plan.run_id), prep.plan.inventory.quarantine_s,
                                     slow=_stragglers_named(prep))
    except Exception as problem:  # noqa: BLE001 - a damaged quarantine file must not hide the run's failure
        events.warn(f"quarantine: not updated: {problem}")
        return
    _said_aside(added, events)


def _stragglers_named(prep: Prepared) -> list[str]:
    """With ``quarantine_stragglers: true``: the hosts the run's samples brought back name stragglers."""
    if not prep.plan.inventory.quarantine_stragglers:
        return []
    return stragglers.hosts_named(prep.store.run_dir(prep.plan.run_id))


def _after_success(prep: Prepared, events: base.Events) -> None:
    """After an attached run that succeeded (a failed one is counted in :func:`_set_aside`): each machine that
    ran it to the end forgets its strike, and, with ``quarantine_stragglers: true``, each host named a
    straggler in it takes one, said when that sets it aside. Best effort: never the run's outcome."""
    from ... import quarantine
    try:
        rec = prep.store.load(prep.plan.run_id)
        if rec.status is not RunStatus.SUCCEEDED:
            return
        added = quarantine.after_success(rec, _stragglers_named(prep), prep.plan.inventory.quarantine_s)
    except Exception as problem:  # noqa: BLE001 - a damaged quarantine file must not change how the run ended
        events.warn(f"quarantine: not updated: {problem}")
        return
    _said_aside(added, events)


def _said_aside(added: list, events: base.Events) -> None:
    from ... import quarantine
    for e in added:
        events.warn(f"quarantine: {e.host} ({e.machine}) is set aside until {quarantine.stamp(e.until)}: {e.why}; "
                    f"runs refuse it until then (`clusterddp quarantine release {e.host}` lets it back)")


def _end_lost(prep: Prepared, events: base.Events) -> None:
    """At the end of an attached run: what its lost hosts kept running of it ended, where they answer
    (:func:`.leftovers.end_lost`), each said. Best effort: never the run's outcome."""
    from . import leftovers
    try:
        lines = leftovers.end_lost(prep.store, prep.plan.run_id)
    except Exception as problem:  # noqa: BLE001 - the run has ended as it ended; said
        events.warn(f"[clusterddp] the lost hosts' leftovers were not ended: {problem}")
        return
    for line in lines:
        events.say(line)
