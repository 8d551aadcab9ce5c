"""The Slurm backend: a `slurm:` inventory. Slurm allocates, starts and kills; clusterddp renders the
batch and node scripts (:mod:`.plan`), stages and submits them and follows the job (:mod:`.job`), reaches
it again from the run record (:mod:`.control`) and checks the cluster (:mod:`.check`), all through the
login host (:mod:`.login`: this machine, or one reached over SSH)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .. import base, lifecycle

if TYPE_CHECKING:
    from ...inventory import Inventory
    from ...inventory.section import Section
    from .job import Prepared


class SlurmBackend(lifecycle.Basic):
    name = "slurm"
    checks: frozenset[str] = frozenset()  # check --collective and --diff need an inventory that lists the hosts
    host_verbs: frozenset[str] = frozenset()  # Slurm's nodes are its to allocate: nothing runs on them outside a job
    detached_notify = True  # a detached run's batch script tells its end, on node 0 (plan.notify_lines)

    def control(self) -> lifecycle.Control:
        from . import control
        return control

    def section(self) -> Section:
        from .section import SECTION
        return SECTION

    def secrets(self, inventory: Inventory) -> tuple[tuple[str, str], ...]:
        from .section import secrets
        return secrets(inventory)

    def prepare(self, req: base.LaunchRequest, *, contact: bool = False) -> Prepared:
        from . import job
        if req.nodes is not None:  # Slurm allocates the nodes: its own range says how many
            from ...errors import UsageError
            raise UsageError(f"--nodes: for inventories that list hosts; {req.inventory.path} is a slurm: inventory, "
                             "where Slurm allocates the nodes",
                             "leave --nodes out and set the count or range in the inventory's slurm.nodes "
                             "(e.g. nodes: \"2:4\")")
        if req.resume is not None:
            from ...errors import UsageError
            raise UsageError(f"--resume: for inventories that list hosts; {req.inventory.path} is a slurm: inventory",
                             "leave --resume out, and give the script the checkpoint's path (a Slurm run's folder "
                             "is new each time too)")
        return job.prepare_request(req, contact=contact)

    def render(self, prep: Prepared, req: base.LaunchRequest, *, full: bool = True) -> str:
        from . import job
        try:
            return job.render(prep, req, full)
        finally:
            prep.login.close()

    def launch(self, prep: Prepared, req: base.LaunchRequest, events: base.Events) -> base.RunOutcome | None:
        from . import job
        return job.SlurmLaunch(prep, req, events).run()


BACKEND: base.Backend[Prepared] = SlurmBackend()
