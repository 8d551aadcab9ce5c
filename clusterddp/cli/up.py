"""`clusterddp up INVENTORY SCRIPT [-- SCRIPT_ARGS...]`"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import typer

from .collect import tell_unmatched
from .common import (
    COLLECT,
    ENV,
    EXCLUDE,
    GPUS,
    HOSTS,
    INVENTORY,
    LOCAL_RANK_ARG,
    MASTER_PORT,
    MAX_RESTARTS,
    MAX_UPLOAD,
    QUIET,
    RAW,
    RUN_NAME,
    RUNS_DIR,
    SCRIPT_ARGS,
    PrefixPrinter,
    checkpoint_globs,
    err,
    exit_quickly_when_done,
    handle_errors,
    host_list,
    host_slots,
    local_rank_flag,
    option,
    quiet_filter,
    run_spec,
    sigterm_as_interrupt,
    tell_hidden,
    tell_missing,
    visible,
)

if TYPE_CHECKING:
    from ..artifacts import CollectResult
    from ..backends.base import KeptRuns, LaunchRequest
    from ..inventory import Inventory
    from ..noise import NoiseFilter


@handle_errors
def up(
    inventory: str = INVENTORY,
    script: str = typer.Argument(..., help="Training script; its folder is copied to every node."),
    script_args: list[str] | None = SCRIPT_ARGS,
    runs_dir: str = RUNS_DIR,
    name: str | None = RUN_NAME,
    hosts: str | None = HOSTS,
    exclude: str | None = EXCLUDE,
    gpus: int | None = GPUS,
    master_port: int | None = MASTER_PORT,
    env: list[str] = ENV,
    collect: list[str] = COLLECT,
    max_restarts: int = MAX_RESTARTS,
    max_upload: str = MAX_UPLOAD,
    local_rank_arg: str | None = LOCAL_RANK_ARG,
    dry_run: bool = option("dry_run"),
    show_secrets: bool = option("show_secrets"),
    full: bool = option("full"),
    detach: bool = option("detach"),
    skip_check: bool = option("skip_check"),
    raw: bool = RAW,
    quiet: bool = QUIET,
    join_timeout: float = option("join_timeout"),
    stall_timeout: float | None = option("stall_timeout"),
    progress_regex: str | None = option("progress_regex"),
    wait: bool = option("wait"),
    notify: list[str] = option("notify"),
    checkpoints: list[str] = option("checkpoints"),
    nodes: str | None = option("nodes"),
    resume: str | None = option("resume"),
    packages: str | None = option("packages"),
    schedule: str | None = typer.Option(None, "--schedule", hidden=True,
                                           help="Set by a cron entry: the schedule that started this run."),
) -> None:
    """Start a DDP job on every host of INVENTORY (or `local`) and follow it to the end."""
    from .. import backends
    from ..backends.base import LaunchRequest, local_rank_warning
    from ..launch import parse_nodes
    from ..upload import parse_size

    spec = run_spec(script, script_args, name, gpus, master_port, env, collect, max_restarts)
    limit = parse_size(max_upload)
    loaded = backends.load_inventory(inventory, gpus)
    if packages is not None:
        from ..envs.nodes import with_packages
        loaded = with_packages(loaded, packages)
    spec = dataclasses.replace(spec, local_rank_arg=local_rank_flag(local_rank_arg),
                               checkpoints=checkpoint_globs(checkpoints),
                               **watchdog(stall_timeout, progress_regex, loaded))
    names, slots = host_slots(hosts)
    req = LaunchRequest(inventory_arg=inventory, inventory=loaded, spec=spec, runs_dir=runs_dir, hosts=names,
                        slots=slots, exclude=host_list(exclude, "--exclude"), max_upload=limit, detach=detach,
                        skip_check=skip_check, join_timeout=join_timeout, wait=wait, schedule=schedule,
                        nodes=parse_nodes(nodes), env_files=tuple(e[1:] for e in env if e.startswith("@")),
                        resume=resume)
    backend = backends.for_inventory(loaded)
    from .. import notify as N
    targets = N.targets_for(loaded.notify, notify)
    req = dataclasses.replace(req, notify=targets)
    prep = backend.prepare(req, contact=not dry_run)
    warning = local_rank_warning(spec)
    if warning:
        err(warning)
    if dry_run:
        text = backend.render(prep, req, full=full) + ("" if full else f"\n{FULL_HINT}")
        print(dry_run_text(text, prep.plan.run_id, () if show_secrets else secrets(req)), flush=True)
        return
    if full:
        from ..errors import UsageError
        raise UsageError("--full goes with --dry-run: it says how much a dry run prints",
                         "add --dry-run, or leave --full out")
    if detach and targets and not backend.detached_notify:
        err(f"warning: notify: a detached `{backend.name}:` run is not told of its end (no launcher is attached to "
            "see it); leave --detach out to be told, e.g. under nohup or tmux")
    events = Printed(raw=raw, hide=quiet_filter(quiet))
    sigterm_as_interrupt()  # SIGTERM ends an attached run as Ctrl-C does (a waiting one leaves the queue)
    told = {"run_id": prep.plan.run_id, "name": spec.name, "schedule": schedule, "inventory": inventory}
    try:
        backend.launch(prep, req, events)
    except KeyboardInterrupt:
        _said(N.tell_run_end(targets, prep.store, interrupted=True, **told))
        raise
    except Exception as e:
        _said(N.tell_run_end(targets, prep.store, error=e, **told))
        raise
    else:
        if not detach:
            _said(N.tell_run_end(targets, prep.store, **told))
    finally:
        events.printer.flush()
        tell_unmatched(events.results, "collect: ")  # at the end of the run: a glob that brought nothing back
        tell_hidden(events.hide, f"{prep.store.run_dir(prep.plan.run_id) / 'logs'}/")
        tell_hidden(events.teardown, f"{prep.store.run_dir(prep.plan.run_id) / 'logs'}/")
    # The run is recorded, told and printed, and its connections are closed: nothing is left for the
    # interpreter's teardown, which took 0.11-0.14 s after every run (paramiko's and the nodes' threads).
    exit_quickly_when_done()


def _said(lines: list[str]) -> None:
    for line in lines:  # a receiver's words: escaped
        err(visible(line))


def watchdog(stall_timeout: float | None, progress_regex: str | None, inv: Inventory) -> dict:
    """The run's stall timeout and progress regex: the flags over the inventory's (``--stall-timeout 0``:
    off for this run); bad values are bad input (exit 2)."""
    from ..errors import UsageError
    from ..top import check_progress_regex
    s = stall_timeout if stall_timeout is not None else inv.stall_timeout
    if s is not None and 0 < s < 1:
        raise UsageError(f"--stall-timeout {s:g}: under a second, any pause of the job would end it",
                         "give it in seconds, at least 1 (see docs/failures.md, \"The stall watchdog\"), or 0 for off")
    regex = progress_regex if progress_regex is not None else inv.progress_regex
    if progress_regex is not None:
        check_progress_regex(progress_regex)
    return {"stall_timeout": s or None, "progress_regex": regex}


FULL_HINT = "(--dry-run --full prints every node's whole start command and launch script)"
DRY_RUN_ID = "RUN_ID"  # what a dry run shows for the run id: it records no run, so it has none
MASK = "***"


def secrets(req: LaunchRequest) -> tuple[tuple[str, str], ...]:
    """The env values a dry run hides: ``-e``'s and the inventory's (every host's, a Slurm cluster's)."""
    inv = req.inventory
    slurm = getattr(inv, "slurm", None)
    return (*req.spec.env, *(kv for h in inv.hosts for kv in h.env), *(slurm.env if slurm is not None else ()))


def dry_run_text(text: str, run_id: str, hidden: tuple[tuple[str, str], ...]) -> str:
    """What ``up --dry-run`` prints of the backend's rendering: the run id it planned with (never
    recorded) as :data:`DRY_RUN_ID`, and each ``export NAME=VALUE`` of ``hidden`` as ``NAME=***``
    (``--show-secrets`` hides none). The plan is the one a real run executes; only its words change."""
    import re

    from ..nodescript import q
    text = text.replace(run_id, DRY_RUN_ID)
    if text.startswith(f"run {DRY_RUN_ID}\n"):  # the backend's first line names the run
        text = (f"run {DRY_RUN_ID} (a dry run: nothing is started or recorded; a real run gets an id of its own)"
                + text[len(f"run {DRY_RUN_ID}"):])
    masked = 0
    for name, value in hidden:
        text, n = re.subn(re.escape(f"export {name}={q(value)}") + r"(?=\s|$)", f"export {name}={MASK}", text,
                          flags=re.MULTILINE)
        masked += n
    if masked:
        text += f"\n(env values are shown as {MASK}; --show-secrets shows them)"
    return text


class Printed:
    """What a launch tells (:class:`clusterddp.backends.base.Events`), printed: lines, node output
    with ``[host]`` prefixes, what was collected, what keep_runs did."""

    def __init__(self, raw: bool, hide: NoiseFilter | None) -> None:
        from ..noise import Teardown
        self.hide = hide
        self.teardown = Teardown()  # torchrun's teardown on a failure or a stop: the summary says it
        self.printer = PrefixPrinter([], raw=raw, hide=hide, teardown=self.teardown)
        self.results: list = []  # every host's collect, for the end of the run (cli.collect.tell_unmatched)

    def say(self, line: str) -> None:
        print(visible(line), flush=True)  # lines quote Slurm's words (a job's Reason) and hosts' names

    def warn(self, line: str) -> None:
        err(line)

    def hosts(self, names: Sequence[str]) -> None:
        self.printer.width = max((len(h) for h in names), default=0)

    def output(self, host: str, data: bytes) -> None:
        self.printer(host, data)

    def collected(self, r: CollectResult, source: str | None = None) -> None:
        self.results.append(r)
        lead = f"collect {r.host}: " if source is None else "collect: "
        if r.error:
            err(f"{lead}{r.error}")
        elif r.fetched or r.skipped:
            print(f"collected {len(r.fetched)} file(s) from {source or r.host}"
                  + (f", skipped {len(r.skipped)} still being written" if r.skipped else ""), flush=True)
        tell_missing(lead, r.missing)

    def kept(self, kept: KeptRuns) -> None:
        from ..errors import ClusterDDPError
        from .common import crash_report
        from .prune import report
        self.printer.flush()
        lead = kept.lead
        if kept.interrupted:
            err(f"{lead}interrupted; old runs were not all pruned (`clusterddp prune` finishes it)")
        elif kept.error is not None:
            e = kept.error
            said = str(e).replace("\n", "; ") if isinstance(e, ClusterDDPError) else crash_report(e, "up")
            err(f"{lead}could not prune old runs: {said}")
        elif kept.results is not None and kept.selection is not None:
            report(kept.results, kept.selection, dry_run=False, lead=lead)
