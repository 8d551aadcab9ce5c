"""`clusterddp metrics RUN` and `clusterddp report RUN -o FILE`: a run's samples over time (docs/watching.md)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import typer

from .common import RUNS_DIR, err, handle_errors, visible
from .runs import RUN

if TYPE_CHECKING:
    from ..metrics.series import NodeSeries, Straggler
    from ..record import RunRecord
    from ..store import RunStore

JSON = typer.Option(False, "--json", help="Print every series, each node's latest values and the stragglers as "
                                          "one JSON object.")
PROMETHEUS = typer.Option(None, "--prometheus", metavar="FILE", help="Also write each node's latest values to FILE "
                          "in Prometheus' text format (for node_exporter's textfile collector); - for stdout.")
CSV = typer.Option(None, "--csv", metavar="FILE", help="Also write every point (run, node, host, attempt, series, "
                   "time, value) to FILE as CSV; - for stdout.")
NO_FETCH = typer.Option(False, "--no-fetch", help="Use the samples already brought back; ask no node (by default "
                        "a running run's nodes are asked for their latest samples first).")
OUTPUT = typer.Option(..., "--output", "-o", metavar="FILE", help="Where to write the HTML report (one file: open it "
                      "from disk, no server or network needed).")


def load(runs_dir: str, run: str, fetch: bool) -> tuple[RunStore, RunRecord, list[NodeSeries], list[Straggler], str]:
    """The run's series (its nodes asked first when it is running and ``fetch``), its stragglers, and what the
    fetch said when it could not reach a node."""
    from .. import backends
    from ..metrics.samples import load_run
    from ..metrics.series import of_run, series_of
    from ..store import RunStore
    store = RunStore(runs_dir, read_only=not fetch)
    run_id = store.resolve(run)
    rec = store.load(run_id)
    said = ""
    if fetch and not rec.status.is_terminal():
        try:  # the logs and samples as they are now (a running run's are brought back with them)
            results = backends.for_record(rec).collect(store, run_id, globs=())
            said = "; ".join(r.error for r in results if r.error)
        except Exception as e:  # noqa: BLE001 - what was brought back before is shown all the same
            said = str(e)
    nodes = [series_of(n) for n in load_run(store.run_dir(run_id))]
    return store, rec, nodes, of_run(store.run_dir(run_id), nodes), said


def _write(path: str, text: str) -> None:
    if path == "-":
        print(text, end="")
        return
    from pathlib import Path
    Path(path).write_text(text, encoding="utf-8")


@handle_errors
def metrics(run: str = RUN, runs_dir: str = RUNS_DIR, as_json: bool = JSON, prometheus: str | None = PROMETHEUS,
            csv: str | None = CSV, no_fetch: bool = NO_FETCH) -> None:
    """RUN's samples over time: per node, GPU and parsed metric, as sparklines (the whole run) or JSON;
    a running run's latest values."""
    from ..metrics import render as render_module
    store, rec, nodes, slow, said = load(runs_dir, run, not no_fetch)
    running = not rec.status.is_terminal()
    if said:
        err(visible(f"warning: not every node gave its latest samples: {said}"))
    if prometheus:
        _write(prometheus, render_module.prometheus(rec.run_id, nodes))
    if csv:
        _write(csv, render_module.to_csv(rec.run_id, nodes))
    if as_json:
        print(json.dumps(render_module.to_json(rec.run_id, nodes, slow, running), indent=1))
        return
    if prometheus == "-" or csv == "-":
        return
    print(f"run {rec.run_id}: {rec.status}")
    if not nodes:
        print("no samples kept (the sampler was off: --metrics-interval 0, or the samples were not brought back: "
              "clusterddp collect RUN)")
        return
    print(visible(render_module.table(nodes, slow, running)))


@handle_errors
def report(run: str = RUN, output: str = OUTPUT, runs_dir: str = RUNS_DIR, no_fetch: bool = NO_FETCH) -> None:
    """Write RUN's report: one HTML file with the outcome and root cause, charts of the parsed metrics, progress
    and GPUs over time, and the run's timeline."""
    from ..metrics import report as report_module
    store, rec, nodes, slow, said = load(runs_dir, run, not no_fetch)
    if said:
        err(visible(f"warning: not every node gave its latest samples: {said}"))
    path = report_module.write(output, report_module.render(rec, store.run_dir(rec.run_id), nodes, slow))
    if nodes and not report_module.charts_available():
        err(f"note: the report has no charts: they need matplotlib ({report_module.CHARTS_EXTRA})")
    print(f"run {rec.run_id}: report written to {path}")


def write_report(store: RunStore, run_id: str, path: str) -> str | None:
    """`up --report FILE`: the run's report at its end (its absolute path, for the run's notification); a report
    that cannot be written is said, not raised (the run's own outcome is what `up` reports)."""
    from ..metrics import report as report_module
    from ..metrics.samples import load_run
    from ..metrics.series import of_run, series_of
    try:
        rec = store.load(run_id)
        nodes = [series_of(n) for n in load_run(store.run_dir(run_id))]
        written = report_module.write(
            path, report_module.render(rec, store.run_dir(run_id), nodes, of_run(store.run_dir(run_id), nodes))
        )
    except Exception as e:  # noqa: BLE001 - a report is a by-product: the run's outcome stands
        err(visible(f"warning: --report {path}: not written: {e}"))
        return None
    err(f"report written to {written}")
    return str(written.absolute())
