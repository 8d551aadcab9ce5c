"""Shared bits for the benchmarks: alternate runs of two commands, report medians and the ratio."""

from __future__ import annotations

import statistics
import subprocess
import time
from collections.abc import Callable

# The start of Debian's and Ubuntu's /etc/skel/.bashrc: what a lab node's account has unless someone
# put work above that line. The SSH benchmarks give it to their test-bed nodes (TestBed(login_rc=...))
# unless told to keep this machine's own ~/.bashrc, whose `pyenv init` costs every SSH command's shell
# 0.1 CPU-s on the team's machines.
STOCK_BASHRC = """# If not running interactively, don't do anything
case $- in
    *i*) ;;
      *) return;;
esac
"""


def timed(fn: Callable[[], object]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def compare(name_a: str, a: Callable[[], object], name_b: str, b: Callable[[], object], rounds: int,
            before_each: Callable[[], object] = lambda: None) -> dict:
    """Run a and b alternately ``rounds`` times (alternating evens out machine noise); medians and a/b."""
    ta, tb = [], []
    for _ in range(rounds):
        before_each()
        ta.append(timed(a))
        before_each()
        tb.append(timed(b))
    ma, mb = statistics.median(ta), statistics.median(tb)
    print(f"{name_a}: median {ma:.3f}s  (runs: {', '.join(f'{x:.2f}' for x in ta)})")
    print(f"{name_b}: median {mb:.3f}s  (runs: {', '.join(f'{x:.2f}' for x in tb)})")
    print(f"ratio {name_a} / {name_b}: {ma / mb:.3f}")
    return {"a": ma, "b": mb, "ratio": ma / mb}


def interleave(tools: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Run every tool once per round, in turn, ``rounds`` times; print each median and its ratio to
    the first tool's (the baseline); return the medians."""
    times: dict[str, list[float]] = {k: [] for k in tools}
    for _ in range(rounds):
        for k, f in tools.items():
            times[k].append(timed(f))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = next(iter(med.values()))
    for k, v in times.items():
        print(f"{k}: median {med[k]:.3f}s, {med[k] / base:.3f}x  (runs: {', '.join(f'{x:.2f}' for x in v)})")
    return med


def run(cmd: list[str], **kw) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
