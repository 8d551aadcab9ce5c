"""`clusterddp up INVENTORY SCRIPT [-- SCRIPT_ARGS...]`"""

from __future__ import annotations

import shlex
import time

import typer

from .common import (
    COLLECT,
    ENV,
    GPUS,
    HOSTS,
    INVENTORY,
    MASTER_PORT,
    MAX_RESTARTS,
    MAX_UPLOAD,
    RAW,
    RUN_NAME,
    RUNS_DIR,
    SCRIPT_ARGS,
    err,
    handle_errors,
    host_slots,
    run_spec,
    sigterm_as_interrupt,
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
    gpus: int | None = GPUS,
    master_port: int | None = MASTER_PORT,
    env: list[str] = ENV,
    collect: list[str] = COLLECT,
    max_restarts: int = MAX_RESTARTS,
    max_upload: str = MAX_UPLOAD,
    dry_run: bool = typer.Option(False, "--dry-run", help="Print every node's command; contact no host."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Start the job and return; it runs on without us."),
    skip_check: bool = typer.Option(False, "--skip-check", help="Start without the preflight check (hosts answer, "
                                    "versions agree, master port free)."),
    raw: bool = RAW,
    wait: bool = typer.Option(False, "--wait", help="When the GPU slots are taken, wait in the queue for them "
                              "instead of refusing (exit 75)."),
    schedule: str | None = typer.Option(None, "--schedule", hidden=True,
                                           help="Set by a cron entry: the schedule that started this run."),
) -> None:
    """Start a DDP job on every host of INVENTORY (or `local`) and follow it to the end."""
    from .. import jobs, plan

    spec = run_spec(script, script_args, name, gpus, master_port, env, collect, max_restarts)
    limit = jobs.parse_size(max_upload)
    names, slots = host_slots(hosts)
    prep = jobs.prepare(inventory, spec, runs_dir, names, slots=slots)
    print(f"run {prep.plan.run_id}", flush=True)
    if dry_run:
        print(plan.render(prep.plan))
        sent = jobs.describe_upload(prep, limit)
        if sent:
            print(sent, flush=True)
        return
    upload = jobs.pack(prep, limit)
    if upload is not None:
        print(f"upload: {upload.folder.summary()}", flush=True)
    try:
        _up(prep, upload, inventory, runs_dir, detach, skip_check, raw, schedule, wait)
    finally:
        if upload is not None:
            upload.discard()


def _up(prep, upload, inventory: str, runs_dir: str, detach: bool, skip_check: bool, raw: bool,
        schedule: str | None, wait: bool = False) -> None:
    from .. import jobs
    fleet = None if skip_check else jobs.preflight(prep.plan)
    sigterm_as_interrupt()  # a waiting run leaves the queue on SIGTERM too
    lease = None
    try:
        if not prep.plan.local:
            from ..fleet import Fleet
            fleet = fleet or Fleet([n.host for n in prep.plan.nodes], fanout=prep.plan.inventory.fanout)
            prep, lease = jobs.take_lease(prep, fleet, wait=wait,
                                          on_wait=lambda s: print(f"[clusterddp] {s}", flush=True))
            if lease is not None:
                print("leased: " + ", ".join(f"{h} GPUs {','.join(map(str, s))}" for h, s in lease.grants.items())
                      + f"; master port {prep.plan.master_port}", flush=True)
        prep.store.create(jobs.new_record(prep, inventory, schedule=schedule))
    except BaseException:
        if lease is not None:
            lease.release()
        if fleet is not None:
            fleet.close()
        raise
    # From here the supervisor's fleet is the lease's: a node whose job was never told to start
    # frees its slots when the fleet's connections close (its holder sees its channel go).
    _follow(prep, upload, fleet, runs_dir, detach, raw)


def _follow(prep, upload, fleet, runs_dir: str, detach: bool, raw: bool) -> None:
    from .. import jobs
    from .common import PrefixPrinter
    printer = PrefixPrinter([n.host.name for n in prep.plan.nodes], raw=raw)
    started = time.monotonic()

    def on_collect(r) -> None:
        if r.error:
            err(f"collect {r.host}: {r.error}")
        elif r.fetched or r.skipped:
            print(f"collected {len(r.fetched)} file(s) from {r.host}"
                  + (f", skipped {len(r.skipped)} still being written" if r.skipped else ""), flush=True)
        tell_missing(f"collect {r.host}: ", r.missing)
    run_id = prep.plan.run_id
    try:
        jobs.execute(prep, printer, on_collect=on_collect, detach=detach, fleet=fleet,
                     source_tar=upload.path if upload else None)
    finally:
        printer.flush()
    if detach:
        rd = f" --runs-dir {shlex.quote(runs_dir)}" if runs_dir != "./runs" else ""
        print(f"detached; the job runs on without this command.\n"
              f"  follow: clusterddp logs {run_id} --follow{rd}\n"
              f"  status: clusterddp status {run_id}{rd}\n"
              f"  stop:   clusterddp stop {run_id}{rd}", flush=True)
        return
    took = time.monotonic() - started
    print(f"run {prep.plan.run_id} succeeded in {took:.1f}s; run folder: {prep.store.run_dir(prep.plan.run_id)}",
          flush=True)
