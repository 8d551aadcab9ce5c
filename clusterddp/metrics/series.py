"""A run's samples as named time series, by node (and GPU, and rank), with each node's latest values and the
run's stragglers. Pure: :func:`series_of` takes what :func:`clusterddp.metrics.samples.load_run` read."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .samples import IdleFound, NodeSamples

Point = tuple[float, float]

# name -> (unit, what it is); a GPU's are "gpu<i>.<name>", a parsed metric is "m.<name>", a rank's "r<k>.<name>"
KNOWN = {
    "rate": ("lines/s", "progress lines a second"),
    "cpu": ("%", "host CPU busy"),
    "mem": ("bytes", "host memory used"),
    "net_rx": ("bytes/s", "network received"),
    "net_tx": ("bytes/s", "network sent"),
    "disk_r": ("bytes/s", "disk read"),
    "disk_w": ("bytes/s", "disk written"),
    "util": ("%", "GPU utilisation"),
    "gpu_mem": ("MiB", "GPU memory used"),
    "power": ("W", "GPU power"),
    "temp": ("C", "GPU temperature"),
    "sm_clock": ("MHz", "GPU SM clock"),
}


@dataclass(frozen=True)
class NodeSeries:
    """One node's (one attempt's) series: name -> points (node clock, value), oldest first."""

    key: str
    host: str
    attempt: int | None
    series: dict[str, list[Point]]
    throttled: dict[int, int]     # GPU -> samples with an active throttle reason (other than idle)
    notes: list[str]
    idle: tuple[IdleFound, ...] = ()  # the idle policy found the run idle (this node's sampler said so)

    def latest(self) -> dict[str, float]:
        return {k: v[-1][1] for k, v in self.series.items() if v}


def series_of(node: NodeSamples) -> NodeSeries:
    """``node``'s samples as series: ``rate``, the host's, ``gpu<i>.<util|mem|...>``, ``m.<metric>`` and
    ``r<rank>.<metric>``."""
    out: dict[str, list[Point]] = {}
    throttled: dict[int, int] = {}

    def add(name: str, t: float, v: float | None) -> None:
        if v is not None:
            out.setdefault(name, []).append((t, v))
    for s in node.samples:
        add("rate", s.t, s.rate)
        for k, v in s.host.items():
            if k != "mem_total":
                add(k, s.t, v)
        for i, g in sorted(s.gpus.items()):
            for k, v in g.items():
                if k != "mem_total":
                    add(f"gpu{i}.{k}", s.t, v)
        for i, mask in s.throttle.items():
            if mask & ~0x1:  # 0x1: GPU idle, not a slowdown
                throttled[i] = throttled.get(i, 0) + 1
        for k, v in s.metrics.items():
            add(f"m.{k}", s.t, v)
        for r, m in sorted(s.ranks.items()):
            for k, v in m.items():
                add(f"r{r}.{k}", s.t, v)
    return NodeSeries(node.key, node.host, node.attempt, out, throttled, node.notes(), node.idle)


def unit(name: str) -> str:
    base = name.split(".", 1)[1] if name.startswith("gpu") and "." in name else name
    if name.startswith("gpu") and base == "mem":
        base = "gpu_mem"
    return KNOWN.get(base, ("", ""))[0]


# ---- stragglers ----

SLOW = 0.8     # a node whose GPUs are busy while the others' are below this share of its: it is the slow one
MIN_POINTS = 3  # samples a node needs before it is judged


@dataclass(frozen=True)
class Straggler:
    """A node the others wait for, and why it is named; from the rank sampler (:func:`of_run`) with its ranks
    and since when (epoch seconds; ``until`` None: to the newest sample)."""

    key: str
    why: str
    ranks: tuple[int, ...] = ()
    since: float | None = None
    until: float | None = None

    @property
    def label(self) -> str:
        """``node2 (ranks 2-3) since 10:04:05``, as much of it as is known."""
        import time

        from ..sizes import ranges
        ranks = f" (ranks {ranges(self.ranks)})" if self.ranks else ""
        since = f" since {time.strftime('%H:%M:%S', time.localtime(self.since))}" if self.since is not None else ""
        return f"{self.key}{ranks}{since}"

    def to_json(self) -> dict:
        return {"node": self.key, "host": self.key, "ranks": list(self.ranks), "since": self.since,
                "until": self.until, "why": self.why}


def of_run(run_dir: Path, nodes: Sequence[NodeSeries]) -> list[Straggler]:
    """The run's stragglers: the rank sampler's (:func:`clusterddp.stragglers.stragglers_of`: the host the
    other ranks wait for, its ranks, since when, why) where the run has its samples; otherwise
    :func:`stragglers`, from the GPUs' (or CPUs') busy shares."""
    from ..stragglers import read_run, stragglers_of
    if any(h.samples for h in read_run(run_dir)):
        return [Straggler(s["host"], s["why"], tuple(s["ranks"]), s["since"], s["until"])
                for s in stragglers_of(run_dir)]
    return stragglers(nodes)


def _median(points: list[Point]) -> float | None:
    return statistics.median(v for _, v in points) if len(points) >= MIN_POINTS else None


def stragglers(nodes: Sequence[NodeSeries]) -> list[Straggler]:
    """The nodes the others wait for. In synchronous DDP every rank steps at the slowest one's pace, so
    progress rates agree and say nothing; what differs is where the time goes: the slow node's GPUs (or, with
    no GPU, CPUs) stay busy while the others' sit waiting in the collective. A node is named when its median
    busy share is above every other node's and the others' are below :data:`SLOW` of it; when all slow down
    together their shares stay alike and none is named."""
    busy: dict[str, float] = {}
    by_gpu = any(k.startswith("gpu") for n in nodes for k in n.series)
    for n in nodes:
        if n.attempt is not None:
            continue  # the last attempt's nodes are the run's
        if by_gpu:
            meds = [m for k, v in n.series.items() if k.startswith("gpu") and k.endswith(".util")
                    if (m := _median(v)) is not None]
            if meds:
                busy[n.key] = statistics.mean(meds)
        elif (m := _median(n.series.get("cpu", []))) is not None:
            busy[n.key] = m
    if len(busy) < 2:
        return []
    top = max(busy, key=lambda k: busy[k])
    others = [v for k, v in busy.items() if k != top]
    if busy[top] <= 0 or max(others) >= SLOW * busy[top]:
        return []
    what = "GPU utilisation" if by_gpu else "CPU"
    return [Straggler(top, f"its {what} stays at {busy[top]:.0f}% (median) while the other nodes' stays at "
                           f"{statistics.median(others):.0f}%: they wait for it")]
