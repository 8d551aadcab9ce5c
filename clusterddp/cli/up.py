"""`clusterddp up INVENTORY SCRIPT [-- SCRIPT_ARGS...]`"""

from __future__ import annotations

import dataclasses
import shlex
import time

import typer

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
    err,
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
)


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
    detach: bool = option("detach"),
    skip_check: bool = option("skip_check"),
    raw: bool = RAW,
    quiet: bool = QUIET,
    join_timeout: float = option("join_timeout"),
    wait: bool = option("wait"),
    schedule: str | None = typer.Option(None, "--schedule", hidden=True,
                                           help="Set by a cron entry: the schedule that started this run."),
) -> None:
    """Start a DDP job on every host of INVENTORY (or `local`) and follow it to the end."""
    from .. import jobs, plan

    spec = run_spec(script, script_args, name, gpus, master_port, env, collect, max_restarts)
    spec = dataclasses.replace(spec, local_rank_arg=local_rank_flag(local_rank_arg))
    limit = jobs.parse_size(max_upload)
    loaded = jobs.load_inventory(inventory, gpus)
    if loaded.slurm is not None:  # Slurm allocates, starts and kills: a path of its own
        from .up_slurm import up_slurm
        return up_slurm(loaded, inventory, spec, runs_dir, host_list(hosts), limit, dry_run, detach, raw, schedule,
                        host_list(exclude, "--exclude"))
    names, slots = host_slots(hosts)
    prep = jobs.prepare(inventory, spec, runs_dir, names, exclude=host_list(exclude, "--exclude"),
                        loaded=loaded, slots=slots)
    warning = jobs.local_rank_warning(spec)
    if warning:
        err(warning)
    if dry_run:
        print(f"run {prep.plan.run_id}", flush=True)
        print(plan.render(prep.plan))
        sent = jobs.describe_upload(prep, limit)
        if sent:
            print(sent, flush=True)
        return
    upload = jobs.pack(prep, limit)
    try:
        _up(prep, upload, inventory, runs_dir, detach, skip_check, raw, schedule, quiet, join_timeout, wait)
    finally:
        if upload is not None:
            upload.discard()


def _up(prep, upload, inventory: str, runs_dir: str, detach: bool, skip_check: bool, raw: bool,
        schedule: str | None, quiet: bool = False, join_timeout: float = 0.0, wait: bool = False) -> None:
    from .. import jobs
    fleet = None if skip_check else jobs.preflight(prep.plan)
    sigterm_as_interrupt()  # a waiting run leaves the queue on SIGTERM too
    lease, leased = None, None
    try:
        if not prep.plan.local:
            from ..fleet import Fleet
            fleet = fleet or Fleet([n.host for n in prep.plan.nodes], fanout=prep.plan.inventory.fanout)
            run_id = prep.plan.run_id  # a waiting run is not recorded yet: its queue lines name it
            prep, lease = jobs.take_lease(prep, fleet, wait=wait,
                                          on_wait=lambda s: print(f"[clusterddp] run {run_id} {s}", flush=True))
            if lease is not None:  # said once the run id is (below)
                leased = ("leased: " + ", ".join(f"{h} GPUs {','.join(map(str, s))}" for h, s in lease.grants.items())
                          + f"; master port {prep.plan.master_port}")
        prep.store.create(jobs.new_record(prep, inventory, schedule=schedule))
    except BaseException:
        if lease is not None:
            lease.release()
        if fleet is not None:
            fleet.close()
        raise
    # The id is printed once it is recorded: a run refused before (bad input, the preflight, slots
    # taken) has no record, so it shows no id that `clusterddp logs` could not find. From here the
    # supervisor's fleet is the lease's: a node whose job was never told to start frees its slots
    # when the fleet's connections close (its holder sees its channel go).
    print(f"run {prep.plan.run_id}", flush=True)
    if leased:
        print(leased, flush=True)
    if upload is not None:
        print(f"upload: {upload.folder.summary()}", flush=True)
    from .common import PrefixPrinter
    hide = quiet_filter(quiet)
    printer = PrefixPrinter([n.host.name for n in prep.plan.nodes], raw=raw, hide=hide)
    started = time.monotonic()

    def on_collect(r) -> None:
        if r.error:
            err(f"collect {r.host}: {r.error}")
        elif r.fetched or r.skipped:
            print(f"collected {len(r.fetched)} file(s) from {r.host}"
                  + (f", skipped {len(r.skipped)} still being written" if r.skipped else ""), flush=True)
        tell_missing(f"collect {r.host}: ", r.missing)
    run_id = prep.plan.run_id
    from ..errors import RunFailed
    from .prune import apply_keep_runs
    try:
        jobs.execute(prep, printer, on_collect=on_collect, detach=detach, fleet=fleet,
                     source_tar=upload.path if upload else None, join_timeout=join_timeout)
    except RunFailed:
        printer.flush()
        apply_keep_runs(prep.plan.inventory, runs_dir)  # a failed run is a run: it counts among the kept
        raise
    finally:
        printer.flush()
        tell_hidden(hide, f"{prep.store.run_dir(run_id) / 'logs'}/")
    if detach:
        rd = f" --runs-dir {shlex.quote(runs_dir)}" if runs_dir != "./runs" else ""
        print(f"detached; the job runs on without this command.\n"
              f"  follow: clusterddp logs {run_id} --follow{rd}\n"
              f"  status: clusterddp status {run_id}{rd}\n"
              f"  stop:   clusterddp stop {run_id}{rd}", flush=True)
        apply_keep_runs(prep.plan.inventory, runs_dir)
        return
    took = time.monotonic() - started
    print(f"run {prep.plan.run_id} succeeded in {took:.1f}s; run folder: {prep.store.run_dir(prep.plan.run_id)}",
          flush=True)
    apply_keep_runs(prep.plan.inventory, runs_dir)
