"""The SSH backend: hosts reached over SSH (Fabric), and ``local``, its one-host form on this
machine. clusterddp starts each node's job itself (:mod:`.launch`), watches it (:mod:`.supervisor`)
and reaches it again from the run record (:mod:`.control`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import base, lifecycle

if TYPE_CHECKING:
    from ...inventory import Inventory
    from .launch import Prepared


class SSHBackend(lifecycle.Basic):
    name = "ssh"
    checks: frozenset[str] = frozenset({"collective", "diff"})  # check --collective and --diff run on its hosts
    detached_notify = True  # node 0 tells a detached run's end (clusterddp.notify.arm)
    host_verbs: frozenset[str] = frozenset({"exec", "leases", "top --inventory"})

    def control(self) -> lifecycle.Control:
        from . import control
        return control

    def section(self) -> None:  # its inventories list their hosts (the inventory's own `hosts:`)
        return None

    def secrets(self, inventory: Inventory) -> tuple[tuple[str, str], ...]:
        return tuple(kv for h in inventory.hosts for kv in h.env)

    def prepare(self, req: base.LaunchRequest, *, contact: bool = False) -> Prepared:
        from ... import upload
        from . import launch
        return launch.prepare(req.inventory_arg, req.spec, req.runs_dir, req.hosts, exclude=req.exclude,
                              loaded=req.inventory, slots=req.slots, nodes=req.nodes,
                              secrets=upload.secret_files(req.inventory, req.notify, req.env_files),
                              resume=req.resume, schedule=req.schedule, contact=contact)

    def render(self, prep: Prepared, req: base.LaunchRequest, *, full: bool = True) -> str:
        from ... import plan
        from . import launch
        sent = launch.describe_upload(prep, req.max_upload)
        shown = plan.render(prep.plan) if full else plan.summary(prep.plan)
        # a spare in place of a quarantined host is said here too: the plan shows the spare
        resume = ([f"resume: the newest checkpoint run {prep.resumes.run_id} left is looked for as the run starts, "
                   "and put on every node before its job starts"] if prep.resumes is not None else [])
        return "\n".join([f"run {prep.plan.run_id}", *prep.notes, *resume, shown, *([sent] if sent else [])])

    def launch(self, prep: Prepared, req: base.LaunchRequest, events: base.Events) -> base.RunOutcome | None:
        from . import launch
        return launch.SSHLaunch(prep, req, events).run()


BACKEND: base.Backend[Prepared] = SSHBackend()
