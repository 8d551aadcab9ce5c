"""`clusterddp report`: one self-contained HTML file about a run, read in a minute, opened from disk with no
server and no network: outcome and root cause first, then charts (parsed metrics such as the loss, progress
rate per node, GPU utilisation and memory per GPU), then the run's timeline and notes.

The charts are drawn by matplotlib (the optional extra ``clusterddp[report]``) as SVG, inlined: no script, no
font or file fetched, a few hundred kB for a long run (matplotlib's SVG of a 1,000-point line is about 20 kB),
where plotly's offline page carries its 3.5 MB of JavaScript in every report. Each plotted line is an SVG group
whose id names it (``series:<chart>:<node>:<series>``), and the points it draws are in the page too, as JSON
(``<script type="application/json" id="clusterddp-data">``), so a reader (and the test) can check a chart against
the run's numbers. Without matplotlib the page still holds the outcome, timeline and the data, and says how to
get the charts.
"""

from __future__ import annotations

import html
import io
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..record import RunRecord
from .series import NodeSeries, Straggler, unit

CHARTS_EXTRA = "pip install 'clusterddp[report]'"


@dataclass(frozen=True)
class Chart:
    """One chart: its id, title, y label, and the lines it draws: (node key, series name)."""

    id: str
    title: str
    ylabel: str
    lines: tuple[tuple[str, str], ...]


def charts_of(nodes: Sequence[NodeSeries]) -> list[Chart]:
    """The charts the run's series make: each parsed metric, the progress rate, each GPU's utilisation and
    memory (one line a node and GPU), the hosts' CPU; a chart with no line is left out."""
    def lines(pick) -> tuple[tuple[str, str], ...]:
        return tuple((n.key, k) for n in nodes for k in sorted(n.series) if pick(k) and len(n.series[k]) > 0)
    metric_names = sorted({k for n in nodes for k in n.series if k.startswith("m.")})
    out = [Chart(f"metric-{k[2:]}", f"{k[2:]} (parsed from the job's output)", k[2:], lines(lambda s, k=k: s == k))
           for k in metric_names]
    out += [
        Chart("rate", "progress rate per node", "progress lines/s", lines(lambda s: s == "rate")),
        Chart("gpu-util", "GPU utilisation per GPU", "%", lines(lambda s: s.startswith("gpu") and s.endswith(".util"))),
        Chart("gpu-mem", "GPU memory used per GPU", "MiB", lines(lambda s: s.startswith("gpu") and s.endswith(".mem"))),
        Chart("cpu", "host CPU busy", "%", lines(lambda s: s == "cpu")),
    ]
    return [c for c in out if c.lines]


def _svg(chart: Chart, nodes: dict[str, NodeSeries], t0: float) -> str:
    import matplotlib
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure
    matplotlib.rcParams["svg.fonttype"] = "none"  # text as text: no glyph paths, readable in the page
    matplotlib.rcParams["svg.hashsalt"] = "clusterddp"  # the same ids for the same data
    fig = Figure(figsize=(8, 3), dpi=72)
    ax = fig.add_subplot()
    for key, name in chart.lines:
        pts = nodes[key].series[name]
        label = key if chart.id in ("rate", "cpu") or chart.id.startswith("metric-") else f"{key} {name.split('.')[0]}"
        (line,) = ax.plot([(t - t0) / 60 for t, _ in pts], [v for _, v in pts], label=label,
                          marker="." if len(pts) < 50 else None)
        line.set_gid(f"series:{chart.id}:{key}:{name}")
    ax.set_title(chart.title)
    ax.set_xlabel("minutes since the first sample")
    ax.set_ylabel(chart.ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize="small")
    fig.tight_layout()
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    text = buf.getvalue()
    return text[text.index("<svg"):]  # the XML prolog and doctype have no place inside HTML


def charts_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def timeline(rec: RunRecord, run_dir: Path, nodes: Sequence[NodeSeries] = ()) -> list[tuple[str, str]]:
    """The run's events, oldest first: (when, what); ``nodes``' samples say when the idle policy found the run
    idle."""
    from datetime import datetime, timezone

    from .render import idle_found, idle_words
    ev: list[tuple[str, str]] = [(rec.started_at, f"started on {', '.join(n.host for n in rec.nodes)}"
                                                  f" ({len(rec.nodes)} node(s))")]
    if rec.resumed_from is not None:
        ev.append((rec.started_at, rec.resumed_from.describe()))
    for a in rec.attempts:
        lost = ", ".join(f"{h} lost" for h in a.out)
        spare = ", ".join(f"spare {h} in" for h in a.in_)
        what = f"attempt {a.attempt}" if a.attempt is not None else "no further attempt"
        ev.append((a.at, f"{what}: {'; '.join(x for x in (lost, spare) if x) or 'no host changed'}: {a.why}"))
    f = rec.failure
    if f is not None and f.hang is not None:
        when = rec.ended_at or rec.updated_at or ""
        ev.append((when, f"stall: no progress for {f.hang.silent_s:.0f}s (stall timeout {f.hang.timeout:g}s)"
                         + (f", seen first on {f.hang.decided_by}" if f.hang.decided_by else "")))
    found = idle_found(nodes)
    if found is not None:
        ev.append((datetime.fromtimestamp(found.t, timezone.utc).isoformat(timespec="seconds"),
                   f"idle: {idle_words(found)}"))
    stacks = run_dir / "stacks"
    try:
        for host in sorted(p for p in stacks.iterdir() if p.is_dir()):
            for p in sorted(host.iterdir())[:20]:
                when = datetime.fromtimestamp(p.stat().st_mtime, timezone.utc).isoformat(timespec="seconds")
                ev.append((when, f"stacks taken on {host.name}: {p.name}"))
    except OSError:
        pass
    if rec.ended_at:
        ev.append((rec.ended_at, f"ended: {rec.status}" + (f" ({f.host}: {f.summary.splitlines()[0]})"
                                                           if f is not None and f.summary else "")))
    return sorted(ev, key=lambda e: e[0])


CSS = """body{font:14px/1.45 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:2rem;border-bottom:1px solid #ddd}
.outcome{padding:.8rem 1rem;border-radius:6px;background:#eef7ee;border-left:6px solid #3a3}
.outcome.failed,.outcome.stopped{background:#fbeeee;border-left-color:#c33}
.outcome.running{background:#eef2fb;border-left-color:#36c}
pre{background:#f6f6f6;padding:.6rem;overflow-x:auto;font-size:12px}table{border-collapse:collapse}
td,th{padding:.2rem .6rem;border-bottom:1px solid #eee;text-align:left;vertical-align:top}
svg{max-width:100%;height:auto}
.note{color:#a60}"""


def render(rec: RunRecord, run_dir: Path, nodes: Sequence[NodeSeries], stragglers: Sequence[Straggler]) -> str:
    """The whole page."""
    e = html.escape
    status = str(rec.status)
    title = f"run {rec.run_id}" + (f" ({rec.name})" if rec.name else "")
    out = ["<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
           # nothing may be fetched: the page is read from disk, offline
           "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; "
           "img-src data:\">",
           f"<title>{e(title)}</title><style>{CSS}</style></head><body>", f"<h1>{e(title)}</h1>",
           f'<div class="outcome {e(status)}" id="outcome"><b>{e(status)}</b>'
           f" &middot; {e(rec.script)} &middot; started {e(rec.started_at)}"
           + (f" &middot; ended {e(rec.ended_at)}" if rec.ended_at else "")]
    if rec.failure is not None:
        lines = rec.failure.lines(others=True)
        out.append(f'<p id="root-cause"><b>{e(lines[0])}</b></p>')
        if len(lines) > 1:
            out.append(f"<pre>{e(chr(10).join(lines[1:40]))}</pre>")
    out.append("</div>")
    for s in stragglers:
        out.append(f'<p class="note" id="straggler">straggler: <b>{e(s.label)}</b>: {e(s.why)}</p>')
    by_key = {n.key: n for n in nodes}
    charts = charts_of(nodes)
    data = {"run": rec.run_id, "charts": {c.id: {"title": c.title, "lines": [
        {"node": k, "series": s, "unit": unit(s), "points": by_key[k].series[s]} for k, s in c.lines]}
        for c in charts}}
    out.append("<h2>Charts</h2>")
    if not charts:
        out.append('<p id="no-samples">No samples were kept for this run (the sampler was off, or the nodes\' '
                   "sample files were not brought back: <code>clusterddp collect RUN</code>).</p>")
    elif not charts_available():
        out.append(f'<p id="no-charts">The charts need matplotlib: <code>{e(CHARTS_EXTRA)}</code>; their '
                   "data is in this page (clusterddp-data).</p>")
    else:
        t0 = min(p[0] for n in nodes for pts in n.series.values() for p in pts[:1])
        for c in charts:
            out.append(f'<figure id="chart-{e(c.id)}">{_svg(c, by_key, t0)}</figure>')
    out.append("<h2>Timeline</h2><table id=\"timeline\"><tr><th>when (UTC)</th><th>what</th></tr>")
    out += [f"<tr><td>{e(w)}</td><td>{e(what)}</td></tr>" for w, what in timeline(rec, run_dir, nodes)]
    out.append("</table>")
    notes = [t for n in nodes for t in n.notes]
    if notes:
        out.append('<h2>Notes</h2><ul id="notes">' + "".join(f"<li>{e(t)}</li>" for t in notes) + "</ul>")
    blob = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    out.append(f'<script type="application/json" id="clusterddp-data">{blob}</script>')
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write(path: str, text: str) -> Path:
    """The page as ``path`` (0644: a report is meant to be shared), replaced whole."""
    p = Path(path)
    tmp = p.with_name(f".{p.name}.{os.getpid()}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, p)
    return p
