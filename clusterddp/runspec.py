"""The run spec: what the user asked of a run, which every backend reads (the SSH plan, the
Slurm scripts, the schedule spec, the run record's request), and the stall watchdog's argument
that follows from it on every backend. Pure: no network, clock or filesystem."""

from __future__ import annotations

from dataclasses import dataclass

from . import noise
from .failure import AGENT_LINE


@dataclass(frozen=True)
class RunSpec:
    """What the user asked for on the command line (flags win over the inventory)."""

    script: str                                  # as given, relative to the launch directory or absolute
    script_args: tuple[str, ...] = ()
    name: str | None = None
    gpus: int | None = None                      # --gpus: processes per node, for every node
    master_port: int | None = None
    env: tuple[tuple[str, str], ...] = ()        # -e K=V, applied after the inventory's env
    collect: tuple[str, ...] = ()                # --collect, added to the inventory's globs
    checkpoints: tuple[str, ...] = ()            # --checkpoints: what the mirror takes (over checkpoints:)
    max_restarts: int = 0
    local_rank_arg: str | None = None            # --local-rank-arg: "--local_rank" or "--local-rank", or None
    stall_timeout: float | None = None           # --stall-timeout / stall_timeout: (the flag wins); None: off
    progress_regex: str | None = None            # --progress-regex / progress_regex:; None: any line of output
    metrics_interval: float = 5.0                # --metrics-interval / metrics_interval: seconds; 0: no sampler
    metrics_regex: str | None = None             # --metrics-regex / metrics_regex: its named groups name numbers
    idle_policy: tuple[float, float, bool] | None = None  # idle_policy: (below %, seconds, stop); None: off


def watch_args(spec: RunSpec, nnodes: int, master_addr: str | None, master_port: int | None) -> dict | None:
    """The stall watchdog's argument (the node program ``watch``, started by
    :func:`~clusterddp.nodescript.watch_lines`), or None when the run has no stall timeout. Several
    nodes agree through the run's rendezvous store, at the master's address and port (torchrun's static
    and c10d rendezvous both serve it there from the master's torchrun); None for either: the node's
    ``$MASTER_ADDR``/``$MASTER_PORT`` (a node script that finds the master on the node)."""
    if not spec.stall_timeout:
        return None
    # not progress: known torch noise (the lines, and those whose indented next line is theirs too)
    # and torch elastic's agent, whose log records say nothing of the ranks
    skip = [p for p, tail in noise.LINES if not tail] + ["^" + AGENT_LINE.pattern]
    return {"timeout": spec.stall_timeout, "regex": spec.progress_regex, "skip": skip,
            "tails": [p for p, tail in noise.LINES if tail], "nnodes": nnodes,
            "store": [master_addr, master_port] if nnodes > 1 else None}


SAMPLES_MOST = 2 << 20  # bytes of a node's metrics.jsonl (the sampler thins it to stay below)


def sampler_args(spec: RunSpec) -> dict | None:
    """The metrics sampler's argument (the node program ``sampler``, started by
    :func:`~clusterddp.nodescript.sampler_lines`), or None when the run samples nothing (interval 0)."""
    if not spec.metrics_interval:
        return None
    skip = [p for p, tail in noise.LINES if not tail] + ["^" + AGENT_LINE.pattern]
    idle = None
    if spec.idle_policy is not None:
        below, seconds, stop = spec.idle_policy
        idle = {"below": below, "seconds": seconds, "stop": stop}
    return {"interval": spec.metrics_interval, "regex": spec.metrics_regex, "progress_regex": spec.progress_regex,
            "skip": skip, "tails": [p for p, tail in noise.LINES if tail], "most": SAMPLES_MOST, "idle": idle}
