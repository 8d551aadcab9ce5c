"""`clusterddp check --collective`: the report of a short all_reduce job over every host."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from .common import visible

if TYPE_CHECKING:
    from ..collective import CollectiveReport


def show(report: CollectiveReport, took: float, as_json: bool) -> bool:
    """Print the report (a table or JSON); True when every host joined and none is slow."""
    if as_json:
        print(json.dumps({**report.to_dict(), "seconds": round(took, 2)}, indent=2))
        return bool(report.ok)
    from ..collective import NEVER_JOINED, NOT_MEASURED, OK, RULE, SLOW, rate, size_text

    n = len(report.hosts)
    print(f"collective: all_reduce over {n} host(s), {report.backend or 'no backend (no group formed)'}; "
          f"master {report.master}:{report.port}; join bound {report.join_s:g}s after the master is ready")
    if report.world:
        print(f"\n{'size':>8}  {'time':>10}  {'busbw':>11}   (all {n} hosts)")
        for f in report.world:
            print(f"{size_text(f.size):>8}  {f.seconds * 1e3:>7.3f} ms  {rate(f.busbw):>11}")
    rows = [("host", "rank", "iface", "latency", "busbw", "verdict")]
    for h in report.hosts:
        lat = f"{h.latency * 1e3:.3g} ms" if h.latency is not None else "-"
        bw = f"{rate(h.bandwidth.busbw)} @{size_text(h.bandwidth.size)}" if h.bandwidth else "-"
        rows.append((h.host, str(h.rank), visible(str(h.facts.get("iface") or "-")), lat, bw, h.status.upper()))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    print()
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for h in report.hosts:
        if h.status in (OK, NOT_MEASURED) or h.problem is None:
            continue
        print(f"{'SLOW' if h.status == SLOW else 'FAIL'} {h.host}: {visible(h.problem)}")
        if h.fix:
            print(f"     fix: {visible(h.fix)}")
    waited = [h.host for h in report.hosts if h.status == NOT_MEASURED]
    if waited:
        print(f"joined, not measured (the test stops when a host is missing): {', '.join(waited)}")
    for li in report.links:
        if li.slow and li.bandwidth:
            print(f"SLOW link {li.a} <-> {li.b}: bus bandwidth {rate(li.bandwidth.busbw)}, though both hosts are "
                  "faster with their other neighbour")
    if report.world and n >= 3:
        print(f"rule: {RULE}")
    elif report.world:
        print("rule: a slow host can only be singled out among 3 hosts or more; with fewer, read the figures")
    bad = [h.host for h in report.hosts if h.status in (NEVER_JOINED, "failed")]
    slow = [h.host for h in report.hosts if h.status == SLOW] + [f"{li.a}<->{li.b}" for li in report.links
                                                                  if li.slow]
    if bad or slow:
        parts = ([f"{len(bad)} host(s) not in the job: {', '.join(bad)}"] if bad else []) + (
            [f"slow: {', '.join(slow)}"] if slow else [])
        print(f"FAIL: {'; '.join(parts)} [{took:.1f}s]")
    else:
        print(f"PASS: all {n} host(s) joined and ran all_reduce; none slow [{took:.1f}s]")
    sys.stdout.flush()
    return bool(report.ok)
