"""The run spec: what the user asked of a run (:class:`RunSpec`, the flags); :func:`resolve`, the one
place its flags meet the inventory (flag > host entry > inventory defaults > built-in), once, giving the
:class:`ResolvedSpec` every backend reads (the SSH plan, the Slurm scripts, the run record's request); and
the stall watchdog's argument that follows from it on every backend. Pure: no network, clock or filesystem."""

from __future__ import annotations

import re
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from . import noise
from .errors import UsageError
from .failure import AGENT_LINE
from .node.watch import regex_problem

if TYPE_CHECKING:
    from .inventory import Host, Inventory


@dataclass(frozen=True)
class RunSpec:
    """What the user asked for on the command line (a schedule's spec keeps it as it was asked):
    :func:`resolve` makes the :class:`ResolvedSpec` of it that a run reads."""

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
    metrics_interval: float | None = None       # --metrics-interval / metrics_interval: seconds (5); 0: off
    metrics_regex: str | None = None             # --metrics-regex / metrics_regex: its named groups name numbers
    idle_policy: tuple[float, float, bool] | None = None  # idle_policy: (below %, seconds, stop); None: off


@dataclass(frozen=True)
class ResolvedSpec(RunSpec):
    """A run's spec resolved against its inventory, made only by :func:`resolve` (once: `up` and
    `schedule add` resolve a run's flags as they read its inventory): the effective values every backend
    reads (``master_port`` set, the inventory's values where no flag gave one), and what only a resolved
    spec knows."""

    port_fixed: bool = False                     # master_port was given (flag or master.port), not chosen
    restarts: int = 0                            # new attempts after a failed one (an attached SSH run)
    restarts_by: str = ""                        # what allows them, in the user's words ("--max-restarts 2")


def resolve(asked: RunSpec, inventory: Inventory, nodes: tuple[int, int] | None = None) -> ResolvedSpec:
    """The effective spec of a run of ``asked`` (the flags) on ``inventory``: every "flag over
    inventory" rule, here once (flag > host entry > inventory defaults > built-in; each tested by name in
    ``tests/runspec/test_resolve.py``). A :class:`ResolvedSpec` is refused (TypeError): it was resolved once
    already, and its master port, given again as a flag, would pass for fixed. Bad values are bad input
    (:class:`~clusterddp.errors.UsageError`, exit 2). Per host, :func:`nproc` and :func:`fixed_slots`.

    - ``master_port``: --master-port > the inventory's ``master.port`` > built-in 29500 (the inventory's
      default); ``port_fixed`` when the flag or the inventory gave it (otherwise the lease, or a
      Slurm job, chooses a free one from it).
    - ``collect``: the inventory's globs, then the flag's (each once).
    - ``checkpoints``: --checkpoints > the inventory's ``checkpoints:`` > () (the mirror's own default).
    - ``stall_timeout``: --stall-timeout > the inventory's ``stall_timeout:`` > off; 0 is off.
    - ``progress_regex``: --progress-regex > the inventory's ``progress_regex:`` > any line.
    - ``metrics_interval``: --metrics-interval > the inventory's ``metrics_interval:`` > 5 s; 0 is off.
    - ``metrics_regex``: --metrics-regex > the inventory's ``metrics_regex:`` > none.
    - ``idle_policy``: the inventory's ``idle_policy:`` (no flag).
    - ``restarts`` (new attempts of an attached SSH run after a failed one, :mod:`clusterddp.backends.ssh.attempts`):
      --max-restarts > the inventory's ``restarts:`` > what ``nodes`` (--nodes MIN:MAX) lets the run lose,
      MAX - MIN > none; ``restarts_by`` names the one that decided.
    """
    if isinstance(asked, ResolvedSpec):
        raise TypeError("a run's spec is resolved once (the caller that read its inventory did it)")
    stall = asked.stall_timeout if asked.stall_timeout is not None else inventory.stall_timeout
    if stall is not None and 0 < stall < 1:
        raise UsageError(f"--stall-timeout {stall:g}: under a second, any pause of the job would end it",
                         "give it in seconds, at least 1 (see docs/run-hangs.md, \"Choosing the stall timeout\"), "
                         "or 0 for off")
    if asked.progress_regex is not None:
        check_progress_regex(asked.progress_regex)
    interval = asked.metrics_interval if asked.metrics_interval is not None else inventory.metrics_interval
    if interval is not None and 0 < interval < 0.5:
        raise UsageError(f"--metrics-interval {interval:g}: under half a second, sampling would cost the job",
                         "give it in seconds, e.g. 5 (the default), or 0 for no sampler")
    from .inventory.loader import metrics_regex_problem
    if asked.metrics_regex is not None and (why := metrics_regex_problem(asked.metrics_regex)) is not None:
        raise UsageError(f"--metrics-regex {asked.metrics_regex!r}: {why}",
                         "see docs/watching.md, \"Numbers from the job's output\"")
    restarts, restarts_by = _restarts(asked.max_restarts, inventory.restarts, nodes)
    asked_values = {f.name: getattr(asked, f.name) for f in fields(RunSpec)}
    asked_values.update(
        metrics_interval=METRICS_INTERVAL if interval is None else interval,
        metrics_regex=asked.metrics_regex if asked.metrics_regex is not None else inventory.metrics_regex,
        idle_policy=asked.idle_policy if asked.idle_policy is not None else inventory.idle_policy,
        master_port=asked.master_port if asked.master_port is not None else inventory.master.port,
        collect=tuple(dict.fromkeys((*inventory.collect, *asked.collect))),
        checkpoints=asked.checkpoints or inventory.checkpoints,
        stall_timeout=stall or None,
        progress_regex=asked.progress_regex if asked.progress_regex is not None else inventory.progress_regex)
    return ResolvedSpec(**asked_values, port_fixed=asked.master_port is not None or inventory.master.port_fixed,
                        restarts=restarts, restarts_by=restarts_by)


def _restarts(flag: int, inventory: int | None, nodes: tuple[int, int] | None) -> tuple[int, str]:
    """New attempts after a failed one, and what allows them: ``--max-restarts`` > ``restarts:`` > --nodes."""
    if flag > 0:
        return flag, f"--max-restarts {flag}"
    if inventory is not None:
        return inventory, f"restarts: {inventory} (the inventory's)"
    if nodes is not None:
        return nodes[1] - nodes[0], "--nodes {}:{}".format(*nodes)
    return 0, ""


def fanout_of(flag: int | None, inventory: Inventory) -> int:
    """Hosts contacted at once: --fanout > the inventory's ``fanout:`` > built-in 32 (the inventory's default,
    :data:`clusterddp.inventory.model.DEFAULT_FANOUT`). Not in :func:`resolve`: `up` has no --fanout; the
    commands that have it (check, exec, leases) load their inventory through
    :func:`clusterddp.backends.base.load_inventory`, which asks here."""
    return flag or inventory.fanout


def master_port_of(flag: int | None, inventory: Inventory) -> tuple[int, bool]:
    """--master-port ``flag`` resolved against ``inventory`` (as :func:`resolve` does it): the port, and
    whether it was given (a busy fixed port fails `check`; an unfixed one is only where `up` starts looking)."""
    spec = resolve(RunSpec(script="", master_port=flag), inventory)
    assert spec.master_port is not None
    return spec.master_port, spec.port_fixed


def nproc(spec: RunSpec, host: Host) -> int | str:
    """Processes on ``host``: --gpus > the host's entry (``gpus:``, or its fixed choice's count; the
    inventory's ``defaults:`` and the built-in ``auto`` already below it)."""
    return spec.gpus or host.gpus


def fixed_slots(spec: RunSpec, host: Host) -> tuple[int, ...] | None:
    """The GPUs ``host`` must use (its ``gpus: [0, 1]``, or --hosts host:0,1), unless --gpus N, which
    wins over a host's fixed choice (any N free slots then)."""
    return host.slots if spec.gpus is None else None


def check_progress_regex(text: str) -> str:
    """``--progress-regex``: it must compile, and have at most one group (the step number)."""
    try:
        rx = re.compile(text)
    except (re.error, RecursionError, OverflowError) as e:  # nested past the parser's depth, a count past its range
        raise UsageError(f"--progress-regex {text!r}: not a regular expression ({e})",
                         r"e.g. --progress-regex 'iter (\d+)'") from None
    if rx.groups > 1:
        raise UsageError(f"--progress-regex {text!r}: {rx.groups} groups; give at most one, around the step number",
                         r"use (?:...) for the other groups, e.g. '(?:step|iter) (\d+)'")
    if (slow := regex_problem(text)) is not None:
        raise UsageError(f"--progress-regex {text!r}: {slow}", r"match the line's words, e.g. 'step (\d+)'")
    return text


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


METRICS_INTERVAL = 5.0  # seconds between two samples by default
SAMPLES_MOST = 2 << 20  # bytes of a node's metrics.jsonl (the sampler thins it to stay below)


def sampler_args(spec: RunSpec, nnodes: int = 1, master_addr: str | None = None,
                 master_port: int | None = None) -> dict | None:
    """The metrics sampler's argument (the node program ``sampler``, started by
    :func:`~clusterddp.nodescript.sampler_lines`), or None when the run samples nothing (interval 0).
    With an idle policy and several nodes, the nodes decide together through the run's rendezvous store,
    as the stall watchdog's do (:func:`watch_args`: None for the address or port, the node's
    ``$MASTER_ADDR``/``$MASTER_PORT``)."""
    interval = METRICS_INTERVAL if spec.metrics_interval is None else spec.metrics_interval
    if not interval:
        return None
    skip = [p for p, tail in noise.LINES if not tail] + ["^" + AGENT_LINE.pattern]
    idle = None
    if spec.idle_policy is not None:
        below, seconds, stop = spec.idle_policy
        idle = {"below": below, "seconds": seconds, "stop": stop}
    out: dict[str, Any] = {"interval": interval, "regex": spec.metrics_regex, "progress_regex": spec.progress_regex,
           "skip": skip, "tails": [p for p, tail in noise.LINES if tail], "most": SAMPLES_MOST, "idle": idle}
    if idle is not None and nnodes > 1:
        out.update(nnodes=nnodes, store=[master_addr or None, master_port or None])
    return out
