"""The Slurm backend: a `slurm:` inventory. Slurm allocates, starts and kills; clusterddp renders the
batch and node scripts (:mod:`.plan`), stages and submits them and follows the job (:mod:`.job`), reaches
it again from the run record (:mod:`.control`) and checks the cluster (:mod:`.check`), all through the
login host (:mod:`.login`: this machine, or one reached over SSH)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, BinaryIO

from .. import base

if TYPE_CHECKING:
    from ...artifacts import CollectResult, Progress
    from ...check import Report
    from ...inventory import Inventory
    from ...inventory.section import Section
    from ...record import NodeRecord, RunRecord
    from ...stacks import Taken
    from ...store import RunStore


class SlurmBackend:
    name = "slurm"
    checks: frozenset[str] = frozenset()  # check --collective and --diff need an inventory that lists the hosts
    host_verbs: frozenset[str] = frozenset()  # Slurm's nodes are its to allocate: nothing runs on them outside a job
    detached_notify = True  # a detached run's batch script tells its end, on node 0 (plan.notify_lines)

    def section(self) -> Section:
        from .section import SECTION
        return SECTION

    def secrets(self, inventory: Inventory) -> tuple[tuple[str, str], ...]:
        from .section import secrets
        return secrets(inventory)

    def prepare(self, req: base.LaunchRequest, *, contact: bool = False) -> base.Prepared:
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

    def render(self, prep: base.Prepared, req: base.LaunchRequest, *, full: bool = True) -> str:
        from . import job
        assert isinstance(prep, job.Prepared)
        try:
            return job.render(prep, req, full)
        finally:
            prep.login.close()

    def launch(self, prep: base.Prepared, req: base.LaunchRequest, events: base.Events) -> base.RunOutcome | None:
        from ...errors import RunFailed
        from . import job
        assert isinstance(prep, job.Prepared)
        try:
            outcome = job.up(prep, req, events)
        except RunFailed:
            self._keep_runs(req, events)  # a failed run is a run: it counts among the kept
            raise
        self._keep_runs(req, events)
        return outcome

    def _keep_runs(self, req: base.LaunchRequest, events: base.Events) -> None:
        from .. import reach  # each run reached by the backend that ran it
        kept = base.keep_runs(req.inventory, req.runs_dir, lambda store, rec: reach(store, rec, "prune"))
        if kept is not None:
            events.kept(kept)

    def follow(self, store: RunStore, run_id: str, on_output: Callable[[str, bytes], None],
               hosts: list[str] | None, from_lines: dict[str, int]) -> dict[str, int | None]:
        from . import control
        return control.follow(store, run_id, on_output, hosts, from_lines)

    def status(self, store: RunStore, run_id: str,
               on_node: Callable[[NodeRecord], None] | None = None) -> RunRecord:
        from . import control
        return control.status(store, run_id, on_node=on_node)

    def describe(self, rec: RunRecord) -> str | None:
        from . import control
        from .jobpart import job_of
        job = job_of(rec)
        state = control.job_state(rec) or "ended"
        return f"slurm job {job.job_id}: {state}, partition {job.partition or '-'}"

    def stop(self, store: RunStore, run_id: str, grace: float) -> base.Stopped:
        from . import control
        return control.stop(store, run_id)

    def logs(self, store: RunStore, run_id: str, hosts: list[str] | None,
             show: Callable[[str, str, BinaryIO | None], None]) -> None:
        from . import control
        control.node_logs(store, run_id, hosts, show)

    def collect(self, store: RunStore, run_id: str, progress: Progress | None = None,
                globs: tuple[str, ...] | None = None) -> list[CollectResult]:
        from . import control
        return control.collect(store, run_id, globs)

    def check(self, inventory: Inventory, master_port: int | None = None) -> Report:
        from .check import run_slurm_checks
        return run_slurm_checks(inventory)

    def stacks(self, store: RunStore, rec: RunRecord, wait: float) -> Taken:
        from . import control
        return control.stacks(store, rec.run_id, wait)

    def reach(self, store: RunStore, rec: RunRecord, verb: str) -> base.Reach:
        from . import control
        return control.reach(rec, verb)


BACKEND: base.Backend = SlurmBackend()
