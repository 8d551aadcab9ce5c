"""`clusterddp up INVENTORY SCRIPT [-- SCRIPT_ARGS...]`"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import typer

from .. import launch
from .collect import tell_unmatched
from .common import (
    INVENTORY,
    RUNS_DIR,
    SCRIPT_ARGS,
    PrefixPrinter,
    err,
    exit_quickly_when_done,
    handle_errors,
    host_list,
    host_slots,
    launch_options,
    quiet_filter,
    run_spec,
    sigterm_as_interrupt,
    tell_hidden,
    tell_missing,
    visible,
)
from .metrics import write_report

if TYPE_CHECKING:
    from ..artifacts import CollectResult
    from ..backends.base import KeptRuns, LaunchRequest
    from ..noise import NoiseFilter


@handle_errors
@launch_options(o.name for o in launch.OPTIONS)  # every option of `up`, from its one declaration
def up(
    inventory: str = INVENTORY,
    script: str = typer.Argument(..., help="Training script; its folder is copied to every node."),
    script_args: list[str] | None = SCRIPT_ARGS,
    runs_dir: str = RUNS_DIR,
    schedule: str | None = typer.Option(None, "--schedule", hidden=True,
                                           help="Set by a cron entry: the schedule that started this run."),
    options: dict[str, Any] | None = None,
) -> None:
    """Start a DDP job on every host of INVENTORY (or `local`) and follow it to the end."""
    from .. import backends
    from ..backends.base import local_rank_warning

    o = options or {}
    req = request(inventory, script, script_args, runs_dir, o, schedule)
    spec, targets, detach = req.spec, req.notify, req.detach
    backend = backends.for_inventory(req.inventory)
    prep = backend.prepare(req, contact=not o["dry_run"])
    warning = local_rank_warning(spec)
    if warning:
        err(warning)
    if o["dry_run"]:
        from ..backends.base import dry_run_text
        text = backend.render(prep, req, full=o["full"]) + ("" if o["full"] else f"\n{FULL_HINT}")
        print(dry_run_text(text, prep.plan.run_id, () if o["show_secrets"] else secrets(req)), flush=True)
        return
    if o["full"]:
        from ..errors import UsageError
        raise UsageError("--full goes with --dry-run: it says how much a dry run prints",
                         "add --dry-run, or leave --full out")
    if detach and targets and not backend.detached_notify:
        err(f"warning: notify: a detached `{backend.name}:` run is not told of its end (no launcher is attached to "
            "see it); leave --detach out to be told, e.g. under nohup or tmux")
    from .. import notify as notifier
    events = Printed(raw=o["raw"], hide=quiet_filter(o["quiet"]))
    sigterm_as_interrupt()  # SIGTERM ends an attached run as Ctrl-C does (a waiting one leaves the queue)
    told = {"run_id": prep.plan.run_id, "name": spec.name, "schedule": schedule, "inventory": inventory}
    try:
        try:
            backend.launch(prep, req, events)
        finally:
            if o["report"] and not detach:
                told["report"] = write_report(prep.store, prep.plan.run_id, o["report"])
    except KeyboardInterrupt:
        _said(notifier.tell_run_end(targets, prep.store, interrupted=True, **told))
        raise
    except Exception as e:
        _said(notifier.tell_run_end(targets, prep.store, error=e, **told))
        raise
    else:
        if not detach:
            _said(notifier.tell_run_end(targets, prep.store, **told))
    finally:
        events.printer.flush()
        tell_unmatched(events.results, "collect: ")  # at the end of the run: a glob that brought nothing back
        tell_hidden(events.hide, f"{prep.store.run_dir(prep.plan.run_id) / 'logs'}/")
        tell_hidden(events.teardown, f"{prep.store.run_dir(prep.plan.run_id) / 'logs'}/")
    # The run is recorded, told and printed, and its connections are closed: nothing is left for the
    # interpreter's teardown, which took 0.11-0.14 s after every run (paramiko's and the nodes' threads).
    exit_quickly_when_done()


def request(inventory: str, script: str, script_args: list[str] | None, runs_dir: str, o: Mapping[str, Any],
            schedule: str | None = None) -> LaunchRequest:
    """What `up`'s options (``o``: name -> value, each option of :data:`clusterddp.launch.OPTIONS`) ask of a
    backend: the flags read (each refusal names its flag), the inventory loaded, and the run spec resolved
    against it once (:func:`clusterddp.runspec.resolve`: flag > host entry > inventory defaults > built-in)."""
    from .. import backends
    from .. import notify as notifier
    from ..backends.base import LaunchRequest
    from ..launch import parse_nodes
    from ..runspec import resolve
    from ..upload import parse_size

    asked = run_spec(script, script_args, o)
    limit = parse_size(o["max_upload"])
    loaded = backends.load_inventory(inventory, asked.gpus)
    if o["packages"] is not None:  # --packages over every host's packages: (docs/environments.md)
        from ..envs.nodes import with_packages
        loaded = with_packages(loaded, o["packages"])
    names, slots = host_slots(o["hosts"])
    nodes = parse_nodes(o["nodes"])
    return LaunchRequest(inventory_arg=inventory, inventory=loaded, spec=resolve(asked, loaded, nodes),
                         runs_dir=runs_dir, hosts=names, slots=slots, exclude=host_list(o["exclude"], "--exclude"),
                         max_upload=limit, detach=o["detach"], skip_check=o["skip_check"],
                         join_timeout=o["join_timeout"], wait=o["wait"], schedule=schedule, nodes=nodes,
                         env_files=tuple(e[1:] for e in o["env"] if e.startswith("@")), resume=o["resume"],
                         notify=notifier.targets_for(loaded.notify, o["notify"]))


def _said(lines: list[str]) -> None:
    for line in lines:  # a receiver's words: escaped
        err(visible(line))


FULL_HINT = "(--dry-run --full prints every node's whole start command and launch script)"


def secrets(req: LaunchRequest) -> tuple[tuple[str, str], ...]:
    """The env values a dry run hides: ``-e``'s and the inventory's, as its backend says (every host's;
    a cluster section's own env)."""
    from .. import backends
    return (*req.spec.env, *backends.for_inventory(req.inventory).secrets(req.inventory))


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
