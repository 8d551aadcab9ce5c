"""`clusterddp check --diff`: only what differs from the master, per host."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING

from .common import visible

if TYPE_CHECKING:
    from ..envdiff import DiffReport


def show(report: DiffReport, took: float, as_json: bool) -> bool:
    """Print the differences (a table or JSON); True when every host agrees with the master."""
    if as_json:
        print(json.dumps({**report.to_dict(), "seconds": round(took, 2)}, indent=2))
        return bool(report.ok)
    compared = f"python, torch, CUDA, NCCL, driver, {report.packages} packages" + (
        f", the script folder of run {report.run_id}" if report.run_id else "") + (
        f"; {visible(report.note)}" if report.note else "")
    if report.differences:
        rows = [("host", "what", f"{report.master} (master)", "this host")]
        rows += [(d.host, visible(d.what), visible(d.master), visible(d.value)) for d in report.differences]
        widths = [max(len(r[i]) for r in rows) for i in range(4)]
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    for host, why in report.errors.items():
        print(f"FAIL {host}: not compared: {visible(why)}")
    n = len(report.hosts)
    odd = sorted({d.host for d in report.differences} | set(report.errors))
    if odd:
        print(f"DIFF: {len(odd)} of {n} host(s) differ from the master {report.master} or could not be compared: "
              f"{', '.join(odd)} (compared: {compared}) [{took:.1f}s]")
    else:
        print(f"SAME: all {n} host(s) agree with the master {report.master} ({compared}) [{took:.1f}s]")
    sys.stdout.flush()
    return bool(report.ok)
