"""`clusterddp prune`: remove old runs' folders on the nodes and here; and `keep_runs` after `up`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import typer

from .common import RUNS_DIR, err, handle_errors, visible

if TYPE_CHECKING:
    from ..prune import RunResult, Selection


def _size(n: int | None) -> str:
    from ..sizes import human_size
    return "?" if n is None else human_size(n)


def _where(r: RunResult) -> str:
    parts = [f"here {_size(r.local_bytes)}"]
    for n in r.nodes:
        if n.word in ("removed", "would"):
            parts.append(f"{n.host} {_size(None if n.kib is None else n.kib * 1024)}")
        elif n.word == "missing":
            parts.append(f"{n.host} (no folder)")
    return ", ".join(parts)


def _what(r: RunResult) -> str:
    rec = r.record
    return f"{rec.run_id} ({rec.status}, {(rec.ended_at or rec.started_at or '-')[:16].replace('T', ' ')})"


def report(results: list[RunResult], sel: Selection, dry_run: bool, lead: str = "") -> int:
    """Print what was (or would be) removed and what was not; return how many chosen runs stayed."""
    stayed = 0
    for r in results:
        if r.removed:
            print(f"{lead}{'would remove' if dry_run else 'removed'} {_what(r)}: {_where(r)}", flush=True)
        else:
            stayed += 1
            words = {n.word for n in r.nodes}
            then = ("its record points outside a run folder: nothing of it was removed; check "
                    f"{r.record.run_id}/run.json, or delete that folder by hand" if "damaged" in words
                    else "its job still runs there" if words <= {"running", "removed", "missing"} and words
                    else "its record is kept, so a later prune finishes it")
            err(f"{lead}not removed {_what(r)}: {r.why_kept}; {then}")
    for run_id in sel.running:
        err(f"{lead}kept {run_id}: its record says running (a running run is never removed; "
            f"`clusterddp status {run_id}` updates the record)")
    for problem in sel.damaged:
        err(f"{lead}skipped {visible(problem)}")
    gone = [r for r in results if r.removed]
    part = [r for r in results if not r.removed and r.freed]  # some node folders went, the run stays
    total = sum(r.freed for r in results)
    verb = "would remove" if dry_run else "removed"
    print(f"{lead}{verb} {len(gone)} run(s)" + (f" and node folders of {len(part)} more" if part else "")
          + f", {_size(total)}; kept {sel.kept} by the rules"
          + (f", {len(sel.running)} running" if sel.running else "")
          + ("; dry run: nothing was removed" if dry_run else ""), flush=True)
    return stayed


@handle_errors
def prune(keep: int | None = typer.Option(None, "--keep", min=0, metavar="N", help="Keep the newest N runs."),
          older_than: str | None = typer.Option(None, "--older-than", metavar="AGE",
                                                help="Only runs that ended more than AGE ago: 30m, 12h, 7d, 2w."),
          inventory: str | None = typer.Option(None, "--inventory", metavar="INVENTORY",
                                               help="Only runs launched with this inventory file (or `local`)."),
          dry_run: bool = typer.Option(False, "--dry-run", help="Show what would go, with sizes; remove nothing."),
          runs_dir: str = RUNS_DIR) -> None:
    """Remove old runs: their folders on every node, then here. Never a running run."""
    from .. import prune as pruning
    from ..errors import UsageError
    from ..store import RunStore
    if keep is None and older_than is None:
        raise UsageError("say which runs go: --keep N and/or --older-than AGE",
                         "e.g. `clusterddp prune --keep 10 --dry-run` shows what keeping the 10 newest removes")
    age = None if older_than is None else pruning.parse_age(older_than)
    inv = None if inventory is None else inventory if inventory == "local" else str(Path(inventory).resolve())
    store = RunStore(runs_dir)
    sel = pruning.select(store, pruning.Policy(keep, age, inv))
    if not dry_run and sel.remove:
        store.check_writable()  # a record that cannot be deleted must not lose its node folders first
    from ..backends import reach
    if report(pruning.prune(store, sel, dry_run, reach=lambda rec: reach(store, rec, "prune")), sel, dry_run):
        raise typer.Exit(1)
