"""Shared bits for the benchmarks: interleaved runs of commands, their medians and ratios."""

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


def interleave(tools: dict[str, Callable[[], object]], rounds: int,
               before_each: Callable[[], object] = lambda: None) -> dict[str, float]:
    """Run every tool once per round, in turn, ``rounds`` times (alternating evens out machine
    noise), ``before_each`` untimed before every run; print each median and its ratio to the first
    tool's (the baseline); return the medians."""
    times: dict[str, list[float]] = {k: [] for k in tools}
    for _ in range(rounds):
        for k, f in tools.items():
            before_each()
            times[k].append(timed(f))
    med = {k: statistics.median(v) for k, v in times.items()}
    base = next(iter(med.values()))
    for k, v in times.items():
        print(f"{k}: median {med[k]:.3f}s, {med[k] / base:.3f}x  (runs: {', '.join(f'{x:.2f}' for x in v)})")
    return med


def run(cmd: list[str], **kw) -> None:
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)
