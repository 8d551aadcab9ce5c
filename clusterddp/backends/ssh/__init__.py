"""The SSH backend: hosts reached over SSH (Fabric), and ``local``, its one-host form on this
machine. clusterddp starts each node's job itself (:mod:`.launch`), watches it (:mod:`.supervisor`)
and reaches it again from the run record (:mod:`.control`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from .. import base

if TYPE_CHECKING:
    from ...artifacts import CollectResult, Progress
    from ...check import Report
    from ...inventory import Inventory
    from ...record import NodeRecord, RunRecord
    from ...stacks import Taken
    from ...store import RunStore


class SSHBackend:
    name = "ssh"
    checks: frozenset[str] = frozenset({"collective", "diff"})  # check --collective and --diff run on its hosts
    detached_notify = True  # node 0 tells a detached run's end (clusterddp.notify.arm)
    host_verbs: frozenset[str] = frozenset({"exec", "leases", "top --inventory"})

    def section(self) -> None:  # its inventories list their hosts (the inventory's own `hosts:`)
        return None

    def secrets(self, inventory: Inventory) -> tuple[tuple[str, str], ...]:
        return tuple(kv for h in inventory.hosts for kv in h.env)

    def prepare(self, req: base.LaunchRequest, *, contact: bool = False) -> base.Prepared:
        from ... import upload
        from . import launch
        return launch.prepare(req.inventory_arg, req.spec, req.runs_dir, req.hosts, exclude=req.exclude,
                              loaded=req.inventory, slots=req.slots, nodes=req.nodes,
                              secrets=upload.secret_files(req.inventory, req.notify, req.env_files),
                              resume=req.resume, schedule=req.schedule)

    def render(self, prep: base.Prepared, req: base.LaunchRequest, *, full: bool = True) -> str:
        from ... import plan
        from . import launch
        assert isinstance(prep, launch.Prepared)
        sent = launch.describe_upload(prep, req.max_upload)
        shown = plan.render(prep.plan) if full else plan.summary(prep.plan)
        # a spare in place of a quarantined host is said here too: the plan shows the spare
        resume = ([f"resume: the newest checkpoint run {prep.resumes.run_id} left is looked for as the run starts, "
                   "and put on every node before its job starts"] if prep.resumes is not None else [])
        return "\n".join([f"run {prep.plan.run_id}", *prep.notes, *resume, shown, *([sent] if sent else [])])

    def launch(self, prep: base.Prepared, req: base.LaunchRequest, events: base.Events) -> base.RunOutcome | None:
        from . import launch
        assert isinstance(prep, launch.Prepared)
        return launch.up(prep, req, events)

    def follow(self, store: RunStore, run_id: str, on_output: Callable[[str, bytes], None],
               hosts: list[str] | None, from_lines: dict[str, int]) -> dict[str, int | None]:
        from . import control
        return control.follow(store, run_id, on_output, hosts, from_lines)

    def status(self, store: RunStore, run_id: str,
               on_node: Callable[[NodeRecord], None] | None = None) -> RunRecord:
        from . import control
        return control.status(store, run_id, on_node=on_node)

    def describe(self, rec: RunRecord) -> str | None:
        return None

    def stop(self, store: RunStore, run_id: str, grace: float) -> base.Stopped:
        from . import control
        return control.stop(store, run_id, grace)

    def logs(self, store: RunStore, run_id: str, hosts: list[str] | None,
             show: Callable[[str, str, BinaryIO | None], None]) -> None:
        from . import control
        control.node_logs(store, run_id, hosts, show)

    def collect(self, store: RunStore, run_id: str, progress: Progress | None = None,
                globs: tuple[str, ...] | None = None) -> list[CollectResult]:
        from . import control
        return control.collect(store, run_id, progress=progress, globs=globs)

    def check(self, inventory: Inventory, master_port: int | None = None) -> Report:
        from ...check import run_checks
        return run_checks(inventory, full=True, master_port=master_port)

    def stacks(self, store: RunStore, rec: RunRecord, wait: float) -> Taken:
        from ... import stacks
        return stacks.take(rec, wait=wait)

    def reach(self, store: RunStore, rec: RunRecord, verb: str) -> base.Reach:
        from ...nodeops import HostsReach, nodes_of
        return HostsReach(tuple(nodes_of(rec)))


BACKEND: base.Backend = SSHBackend()
