"""`clusterddp top [RUN]`: a live view of running runs, node by node (rich, imported when drawn)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import typer

from .common import RUNS_DIR, exit_at_interrupt, exit_quickly_when_done, handle_errors, is_tty, visible
from .pipes import stop_if_closed

if TYPE_CHECKING:
    from rich.console import Group

    from ..inventory import Host
    from ..top import NodeView, Snapshot, Watch


def _size(n: float | None) -> str:
    from ..sizes import human_size
    return "-" if n is None else human_size(n, short=True)


def _pct(p: float | None) -> str:
    return "-" if p is None else f"{p:.0f}%"


def _gpus(v: NodeView) -> str:
    if v.gpus is None:
        return "-"
    return " ".join(f"{g.index}:{_pct(g.util_percent)} {_size((g.mem_used_mib or 0) * 2**20)}"
                    f"/{_size((g.mem_total_mib or 0) * 2**20)}" for g in v.gpus) or "none"


def _since(v: NodeView) -> str:
    """Seconds since the last progress line: ``42s``, ``3m05s``, ``2h07m``; `` stalled`` past the timeout."""
    stalled = f" stalled (>{v.stall_timeout:g}s)" if v.stalled and v.stall_timeout is not None else ""
    if v.since_progress is None:  # watched, but no progress line on this node yet
        return ("none" + stalled) if v.progress_from == "watch" else "-"
    s = int(v.since_progress)
    text = f"{s}s" if s < 120 else f"{s // 60}m{s % 60:02d}s" if s < 7200 else f"{s // 3600}h{s // 60 % 60:02d}m"
    return text + stalled


def _state(v: NodeView) -> str:
    return v.state + ("" if v.exit_code is None else f" {v.exit_code}")


# under the table while a running node printed lines but none the progress regex reads
STEP_HINT = ("step -: no line of the job's output has a step the progress regex reads (step N, iter N, [N/M], "
             "Epoch N); `clusterddp top --progress-regex REGEX` says what a step line is, e.g. 'batch (\\d+)'")


def table(snap: Snapshot) -> Group:
    """The snapshot as a rich renderable: a table of every run's nodes (and the lab's leases, when
    clusterddp keeps any). Text from nodes is escaped and never read as markup."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    t = Table(box=None, pad_edge=False, header_style="bold", expand=False)
    # Every column but the last line keeps its width (no_wrap: rich never squeezes those); the last
    # line takes what is left of the terminal and is cut with an ellipsis.
    for col in ("run", "host", "rank", "state", "step", "steps/s", "progress", "job cpu", "job mem", "node cpu",
                "node mem", "gpus"):
        t.add_column(col, no_wrap=True, justify="left" if col in ("run", "host", "state", "gpus") else "right")
    t.add_column("last line", min_width=10)
    style = {"running": "green", "exited": "cyan", "lost": "red", "missing": "red", "unreachable": "bold red"}
    for run in snap.runs:
        if run.error is not None:  # its backend could not reach its nodes now (a Slurm job not started yet)
            t.add_row(Text(run.run_id), "-", "-", Text("-"), *["-"] * 8,
                      Text(visible(run.error), no_wrap=True, overflow="ellipsis"))
        for v in run.nodes:
            bad = v.state == "exited" and v.exit_code not in (0, None)
            line = v.error if v.state == "unreachable" else v.last_line
            t.add_row(Text(run.run_id), Text(v.host), str(v.node_rank),
                      Text(_state(v), style="red" if bad else style.get(v.state, "")),
                      "-" if v.step is None else str(v.step),
                      "-" if v.steps_per_sec is None else f"{v.steps_per_sec:.2f}",
                      Text(_since(v), style="bold red" if v.stalled else ""),
                      _pct(v.cpu_percent), _size(v.rss_bytes), _pct(v.node_cpu_percent),
                      f"{_size(v.node_mem_used_bytes)}/{_size(v.node_mem_total_bytes)}",
                      Text(_gpus(v)), Text(visible(line or ""), no_wrap=True, overflow="ellipsis"))
    parts: list = [Text(f"clusterddp top - {time.strftime('%H:%M:%S')} - {len(snap.runs)} run(s)", style="bold"), t]
    for run in snap.runs:  # the hosts the other ranks wait for (clusterddp.stragglers)
        for s in run.stragglers:
            parts.append(Text(visible(straggler_line(run.run_id, s)), style="bold yellow"))
    if not snap.runs:
        parts.append(Text("no running runs"))
    elif any(v.state == "running" and v.step is None and v.last_line for run in snap.runs for v in run.nodes):
        parts.append(Text(STEP_HINT))
    if snap.leases is not None:  # top --inventory: the lab's GPU leases and queue
        lt = Table(box=None, pad_edge=False, header_style="bold", title="leases")
        keys = sorted({k for lease in snap.leases for k in lease})
        for k in keys:
            lt.add_column(k)
        for lease in snap.leases:
            lt.add_row(*(Text(visible(str(lease.get(k, "")))) for k in keys))
        parts.append(lt)
    return Group(*parts)


def straggler_line(run_id: str, s: dict) -> str:
    """``run RUN: straggler node2 (ranks 2-3) since 10:04:05: why``."""
    from ..sizes import ranges
    since = time.strftime("%H:%M:%S", time.localtime(s["since"]))
    return f"run {run_id}: straggler {s['host']} (ranks {ranges(s['ranks'])}) since {since}: {s['why']}"


@handle_errors
def top(
    run: str | None = typer.Argument(None, help="A run id or unique prefix; default: every running run."),
    runs_dir: str = RUNS_DIR,
    once: bool = typer.Option(False, "--once", help="Print one snapshot and exit (it takes two looks, "
                              "--interval apart, so that rates are measured)."),
    as_json: bool = typer.Option(False, "--json", help="Print snapshots as JSON (one object per line)."),
    progress_regex: str | None = typer.Option(
        None, "--progress-regex", metavar="REGEX",
        help="Finds the step number in the job's output (its group, or the whole match): steps per second. "
             "Default: 'step N', 'iter N', '[N/M]' lines, and 'Epoch N' in a line without a step or "
             "iteration (e.g. 'step 12', 'Step: 12', 'global_step=12', 'Iter 40', '[3/100]', 'epoch 3/10')."),
    interval: float = typer.Option(1.0, "--interval", min=0.2, max=3600, help="Seconds between refreshes."),
    inventory: str | None = typer.Option(None, "--inventory", metavar="INVENTORY",
                                         help="Also list every GPU lease and queue entry on this inventory's "
                                              "hosts (who holds which slots, who waits)."),
) -> None:
    """Show what each node of RUN (or of every running run) is doing: state, last log line, steps/s,
    seconds since its last progress line (marked stalled past the run's --stall-timeout), CPU and memory
    of the job and the node, and each GPU's use where nvidia-smi answers. Refreshed every
    second; Ctrl-C ends the view (never the run). One SSH command per node per refresh."""
    from ..store import RunStore
    from ..top import DEFAULT_PROGRESS, Watch, check_progress_regex, records

    regex = check_progress_regex(progress_regex) if progress_regex is not None else DEFAULT_PROGRESS
    store = RunStore(runs_dir, read_only=True)  # top only looks
    recs = records(store, run)
    lab: tuple[Host, ...] = ()
    if inventory is not None:
        from ..backends import for_inventory, on_hosts
        from .common import load_inventory
        loaded = load_inventory(inventory, None, None)
        on_hosts(for_inventory(loaded), "top --inventory", loaded)
        lab = loaded.hosts
    from ..backends import reach
    with Watch(recs, regex, lab=lab, store=store, reach=lambda rec: reach(store, rec, "top")) as watch:
        if run is not None and watch.refusals:  # the one run asked for cannot be looked at: say why (exit 2)
            raise next(iter(watch.refusals.values()))
        if once:
            if recs:
                watch.look()
                time.sleep(interval)  # the second look measures rates against the first
            _show(watch.look(), as_json)
            return
        if as_json or not is_tty():
            _loop(watch, interval, lambda snap: _show(snap, as_json))
            return
        from rich.console import Console
        from rich.live import Live
        console = Console(highlight=False)
        with Live(console=console, auto_refresh=False, screen=False, transient=False) as live:
            _loop(watch, interval, lambda snap: live.update(table(snap), refresh=True))


def _show(snap: Snapshot, as_json: bool) -> None:
    if as_json:
        print(json.dumps(snap.to_json()), flush=True)
        return
    from rich.console import Console
    Console(highlight=False, width=None if is_tty() else 200).print(table(snap))


def _loop(watch: Watch, interval: float, show: Callable[[Snapshot], object]) -> None:
    """Look, show, wait out the rest of the interval; until Ctrl-C, which ends the view quietly.

    The view has nothing to undo: in its own process, Ctrl-C ends it at once from the first look on
    (:func:`exit_at_interrupt`), rather than by unwinding through the looks in flight, where a Ctrl-C
    landing in their teardown could keep it from ever exiting (seen once in CI, under a Ctrl-C every
    10 ms)."""
    exit_at_interrupt(0)
    try:
        while True:
            started = time.monotonic()
            show(watch.look())
            stop_if_closed()  # `top | head`: nobody reads the view any more
            time.sleep(max(0.0, interval - (time.monotonic() - started)))
    except KeyboardInterrupt:
        exit_at_interrupt(0)  # the view is over: another Ctrl-C while its connections close ends it at once
        exit_quickly_when_done()  # and nothing waits for the threads of its last look at exit
        return
