"""A run's series as `clusterddp metrics` shows and exports them: a sparkline table per node on the terminal,
JSON, Prometheus' textfile format (the latest values) and CSV (every point). Pure text."""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Sequence

from .samples import IdleFound
from .series import NodeSeries, Straggler, unit

BARS = "▁▂▃▄▅▆▇█"
WIDTH = 40  # characters of a sparkline


def sparkline(values: Sequence[float], width: int = WIDTH) -> str:
    """``values`` as at most ``width`` bars (each the mean of its share of the points), low to high."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return ""
    if len(vals) > width:
        step = len(vals) / width
        vals = [sum(chunk) / len(chunk) for i in range(width)
                if (chunk := vals[int(i * step):max(int((i + 1) * step), int(i * step) + 1)])]
    lo, hi = min(vals), max(vals)
    if hi - lo <= 0:
        return BARS[0] * len(vals)
    return "".join(BARS[min(len(BARS) - 1, int((v - lo) / (hi - lo) * len(BARS)))] for v in vals)


def number(v: float, u: str = "") -> str:
    """A value short, with its unit (bytes in KB/MB/GB)."""
    if u.startswith("bytes"):
        for n, word in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")):
            if abs(v) >= n:
                return f"{v / n:.1f} {word}{u[5:]}"
        return f"{v:.0f} B{u[5:]}"
    text = f"{v:.4g}"
    return f"{text} {u}" if u else text


def order(name: str) -> tuple:
    """Parsed metrics first, then progress, GPUs, the host, ranks."""
    first = 0 if name.startswith("m.") else 1 if name == "rate" else 2 if name.startswith("gpu") else \
        4 if re.match(r"r\d+\.", name) else 3
    return (first, name)


def table(nodes: Sequence[NodeSeries], stragglers: Sequence[Straggler], running: bool) -> str:
    """The terminal view: for each node, one line a series: its name, sparkline over the whole run, then
    min, max and last (``now`` for a running run)."""
    out: list[str] = []
    for n in nodes:
        count = max((len(v) for v in n.series.values()), default=0)
        out.append(f"{n.key}: {count} sample(s)")
        names = sorted((k for k in n.series if not re.match(r"r\d+\.", k)), key=order)
        width = max((len(k) for k in names), default=0)
        for k in names:
            vals = [v for _, v in n.series[k]]
            u = unit(k)
            out.append(f"  {k:<{width}}  {sparkline(vals):<{WIDTH}}  min {number(min(vals), u)}  "
                       f"max {number(max(vals), u)}  {'now' if running else 'last'} {number(vals[-1], u)}")
        if not names:
            out.append("  (no samples)")
        for i, c in sorted(n.throttled.items()):
            out.append(f"  gpu{i} throttled in {c} sample(s) (nvidia-smi's clocks_throttle_reasons)")
        out += [f"  note: {t}" for t in n.notes]
    for s in stragglers:
        out.append(f"straggler: {s.label}: {s.why}")
    found = idle_found(nodes)
    if found is not None:
        out.append(f"idle: {idle_words(found)}")
    return "\n".join(out)


def idle_found(nodes: Sequence[NodeSeries]) -> IdleFound | None:
    """When the idle policy first found the run idle (each node's sampler says so; the earliest), or None."""
    return min((e for n in nodes for e in n.idle), key=lambda e: e.t, default=None)


def idle_words(e: IdleFound) -> str:
    """``every GPU of the run below 10% for 30 min (found by node1) at 10:04:05; the run went on``."""
    import time

    from .idle import minutes
    by = f", found by {e.decided_by}" if e.decided_by else ""
    return (f"every GPU of the run ({e.nnodes} node(s)) below {e.below:g}% for {minutes(e.seconds)}{by}, at "
            f"{time.strftime('%H:%M:%S', time.localtime(e.t))}; "
            + ("the idle policy ended the run" if e.stop else "the run went on (idle_policy without stop)"))


def to_json(run_id: str, nodes: Sequence[NodeSeries], stragglers: Sequence[Straggler], running: bool) -> dict:
    return {"run": run_id, "running": running,
            "nodes": {n.key: {"host": n.host, "attempt": n.attempt, "latest": n.latest(),
                              "series": {k: [[t, v] for t, v in pts] for k, pts in sorted(n.series.items())},
                              "throttled": {str(i): c for i, c in n.throttled.items()}, "notes": n.notes}
                      for n in nodes},
            "stragglers": [s.to_json() for s in stragglers],
            "idle": [{"host": n.host, "node": n.key, **e.to_json()} for n in nodes for e in n.idle]}


def _label(v: str) -> str:
    return v.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def prometheus(run_id: str, nodes: Sequence[NodeSeries]) -> str:
    """Each node's latest values in Prometheus' text format (for node_exporter's textfile collector)."""
    out: dict[str, list[str]] = {}
    for n in nodes:
        if n.attempt is not None:
            continue  # earlier attempts have no "now"
        for k, v in sorted(n.latest().items()):
            labels = {"run": run_id, "host": n.host}
            if (m := re.match(r"gpu(\d+)\.(.+)$", k)):
                labels["gpu"], name = m.group(1), f"gpu_{m.group(2)}"
            elif (m := re.match(r"r(\d+)\.(.+)$", k)):
                labels["rank"], name = m.group(1), f"rank_{m.group(2)}"
            elif k.startswith("m."):
                name = f"metric_{k[2:]}"
            else:
                name = k
            metric = "clusterddp_" + re.sub(r"[^a-zA-Z0-9_]", "_", name)
            text = ",".join(f'{a}="{_label(b)}"' for a, b in labels.items())
            out.setdefault(metric, []).append(f"{metric}{{{text}}} {v!r}")
    lines: list[str] = []
    for metric, rows in sorted(out.items()):
        lines += [f"# TYPE {metric} gauge", *rows]
    return "\n".join(lines) + "\n" if lines else ""


def to_csv(run_id: str, nodes: Sequence[NodeSeries]) -> str:
    """Every point: run, node, host, attempt, series, time (epoch seconds, node clock), value."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["run", "node", "host", "attempt", "series", "time", "value"])
    for n in nodes:
        for k, pts in sorted(n.series.items()):
            for t, v in pts:
                w.writerow([run_id, n.key, n.host, "" if n.attempt is None else n.attempt, k, f"{t:.3f}", repr(v)])
    return buf.getvalue()
