"""`clusterddp collect RUN [--glob GLOB]`: bring a run's logs and files back, after the fact; and the one
way `up` and `collect` say that a collect glob matched nothing."""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer

from .common import RUNS_DIR, err, handle_errors, is_tty, tell_missing, visible
from .runs import RUN

if TYPE_CHECKING:
    from ..artifacts import CollectResult, Progress

GLOB = typer.Option(None, "--glob", metavar="GLOB",
                    help="Bring back the files this glob matches in each node's run folder instead of the run's "
                         "collect globs (repeatable), e.g. 'checkpoints/**': for files the run was not started "
                         "to collect.")


@contextmanager
def _progress() -> Iterator[Progress | None]:
    """A rich transfer bar per host on a terminal; silent otherwise."""
    if not is_tty():
        yield None
        return
    from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn
    with Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                  TransferSpeedColumn(), transient=True) as bar:
        class P:
            ids: dict = {}

            def start(self, host: str, total: int) -> None:
                if total > 8 << 20:  # small transfers need no bar
                    self.ids[host] = bar.add_task(host, total=total)

            def advance(self, host: str, n: int) -> None:
                if host in self.ids:
                    bar.advance(self.ids[host], n)
        yield P()


def _report(results: Sequence[CollectResult]) -> int:
    """Each host's collect: counts, then (on stderr) its error and every file not brought back.
    Returns how many hosts had a problem."""
    failed = 0
    for r in sorted(results, key=lambda r: r.host):
        if r.fetched or r.whole or r.skipped or r.missing or not r.error:
            extra = f", {len(r.skipped)} skipped (still being written)" if r.skipped else ""
            extra += f", {len(r.missing)} not brought back" if r.missing else ""
            print(f"  {r.host}: {len(r.fetched)} fetched ({r.bytes / 1e6:.1f} MB), {len(r.whole)} already whole"
                  f"{extra}")
        if r.error:
            err(f"  {r.host}: error: {r.error}")
        tell_missing(f"  {r.host}: ", r.missing)
        failed += not r.ok
    return failed


def tell_unmatched(results: Sequence[CollectResult], lead: str = "") -> None:
    """Say (on stderr, after the hosts' own lines) each collect glob that matched no file on any host:
    a glob that brings nothing back is a mistake `up` would otherwise keep quiet about."""
    from ..artifacts import matched_nowhere
    nowhere, everywhere = matched_nowhere(results)
    where = "any node" if everywhere else "any node that answered"
    for glob in nowhere:
        err(visible(f"{lead}warning: collect glob {glob!r} matched no file on {where}; collect globs are "
                    "relative to each node's run folder, where the script runs (e.g. 'checkpoints/**')"))


@handle_errors
def collect(run: str = RUN, runs_dir: str = RUNS_DIR, glob: list[str] | None = GLOB) -> None:
    """Bring back RUN's logs and collect globs (or --glob's) from every node, verifying each file by sha256."""
    from .. import backends
    from ..errors import UsageError
    from ..inventory import glob_problem, show
    for g in glob or ():  # the node's own rule, as for --collect: refused here, before any node is asked
        problem = glob_problem(g)
        if problem:
            raise UsageError(f"--glob {show(g)}: {problem}", "give a glob relative to the run folder, "
                             "e.g. --glob 'checkpoints/**'")
    from ..store import RunStore
    store = RunStore(runs_dir)
    run_id = store.resolve(run)
    rec = store.load(run_id)
    store.check_writable(run_id, index=False)  # collect writes the run folder only, not runs.db
    held = store.hold(run_id)  # no prune removes the run's folders while they are collected
    if held is None:
        raise UsageError(f"run {run_id} is being pruned by another clusterddp command",
                         "a run that `prune` (or keep_runs) removes cannot be collected; "
                         "`clusterddp runs` lists what is left")
    with held, _progress() as progress:
        results = backends.for_record(rec).collect(store, run_id, progress=progress,
                                                   globs=tuple(glob) if glob else None)
    print(f"run {run_id}: collected into {store.run_dir(run_id) / 'artifacts'}")
    failed = _report(results)
    tell_unmatched(results)
    if failed:
        raise typer.Exit(1)
    sys.stdout.flush()
