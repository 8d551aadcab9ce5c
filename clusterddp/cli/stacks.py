"""`clusterddp stacks RUN`: every rank's Python stack now, the odd one(s) out first."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING

import typer

from .common import RUNS_DIR, err, handle_errors, visible

if TYPE_CHECKING:
    from ..stacks import Group, Proc, Taken


@handle_errors
def stacks(
    run: str = typer.Argument(..., help="A run id, or a unique part of one."),
    runs_dir: str = RUNS_DIR,
    as_json: bool = typer.Option(False, "--json", help="Print the stacks as one JSON object."),
    wait: float = typer.Option(3.0, "--wait", min=0.1, max=60,
                               help="Seconds each process has to write its stacks once asked."),
) -> None:
    """Show where every rank of a running RUN is now: each process's Python stack (every thread),
    taken on every node at once, grouped by where the main threads stand, the rank(s) that differ
    from the others first. The job is not disturbed. Every dump is saved under the run folder, in
    stacks/<time>/<host>/rank<N>.txt. Exit 1 when a node did not answer (the others are shown)."""
    from .. import backends
    from ..errors import StoreError, UsageError
    from ..stacks import group, running_record, save, to_json
    from ..store import RunStore

    store = RunStore(runs_dir)
    rec = running_record(store, run)
    taken = backends.for_record(rec).stacks(store, rec, wait)
    if not taken.procs and not taken.unanswered:
        codes = ", ".join(f"{h}: {'exit ' + str(c) if c is not None else 'no exit code'}"
                          for h, c in taken.ended.items())
        raise UsageError(f"run {rec.run_id} has ended on every node ({codes}): it has no stacks to take",
                         f"`clusterddp status {rec.run_id}` records how it ended")
    if taken.procs:
        try:
            save(store, taken)
        except StoreError as e:  # the stacks are still shown; only the copy on disk is missing
            err(f"warning: the dumps are not saved: {e}")
    groups = group(taken.procs)
    if as_json:
        print(json.dumps(to_json(taken, groups)), flush=True)
    else:
        for line in render(taken, groups):
            print(visible(line), flush=True)
    for host, why in taken.unanswered.items():
        err(f"{host}: no stacks: {why}")
    if taken.unanswered:
        raise typer.Exit(1)


def _who(g: Group) -> str:
    hosts = list(dict.fromkeys(p.host for p in g.procs))
    if len(g.procs) == 1:
        p = g.procs[0]
        return f"rank {p.rank} ({p.host} local {p.local_rank}, pid {p.pid})"
    from ..sizes import ranges
    return f"ranks {ranges(g.ranks)} ({', '.join(hosts)})"


def _frames(p: Proc) -> list[str]:
    from ..stacks import innermost_users
    return [f"    {fn} ({f}:{'?' if ln is None else ln})" for f, ln, fn in innermost_users(p.main)]


def render(taken: Taken, groups: list[Group]) -> list[str]:
    """The text of `stacks`: a heading, each group in a line (an odd one out with the innermost
    frames of the user's code of each of its ranks), the agents, where the dumps are."""
    from ..stacks import summary
    ranks = [p for p in taken.procs if p.role == "rank"]
    hosts = {p.host for p in ranks}
    at = time.strftime("%H:%M:%S", time.gmtime(taken.at))
    out = [f"run {taken.run_id}: {len(ranks)} rank(s) on {len(hosts)} node(s), stacks at {at} UTC"]
    if groups and not any(g.odd for g in groups) and len(groups) > 1:
        out.append("no majority: the ranks stand in groups of the same size")
    for g in groups:
        if not g.procs[0].main:
            notes = sorted({p.note or p.how for p in g.procs})
            out.append(f"{_who(g)}: no stack: {'; '.join(notes)}")
            continue
        out.append(f"{_who(g)}: {summary(g.procs[0].main)}" + ("  <- the odd one out" if g.odd else ""))
        if g.odd:
            for p in g.procs:
                if len(g.procs) > 1:
                    out.append(f"  rank {p.rank} ({p.host} local {p.local_rank}, pid {p.pid}):")
                out += _frames(p)
    for p in taken.procs:
        if p.role == "agent":
            out.append(f"torchrun agent ({p.host}, pid {p.pid}): "
                       + (summary(p.main) if p.main else f"no stack: {p.note or p.how}"))
    for host, code in taken.ended.items():
        out.append(f"{host}: the job has ended here ({'exit ' + str(code) if code is not None else 'no exit code'})")
    if taken.saved is not None:
        out.append(f"every thread of every process: {taken.saved}/")
    return out
