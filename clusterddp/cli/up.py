"""`clusterddp up INVENTORY SCRIPT [-- SCRIPT_ARGS...]`"""

from __future__ import annotations

import shlex
import time
from typing import Optional

import typer

from .common import RUNS_DIR, err, handle_errors, parse_env, sigterm_as_interrupt


@handle_errors
def up(
    inventory: str = typer.Argument(..., help="Inventory YAML file, or `local` for this machine's GPUs."),
    script: str = typer.Argument(..., help="Training script; its folder is copied to every node."),
    script_args: Optional[list[str]] = typer.Argument(None, help="Arguments for the script, after `--`."),
    runs_dir: str = RUNS_DIR,
    name: Optional[str] = typer.Option(None, "--name", help="A name for this run."),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Run on these hosts only: a,b,c."),
    gpus: Optional[int] = typer.Option(None, "--gpus", min=1, help="Processes per node (overrides the inventory)."),
    master_port: Optional[int] = typer.Option(None, "--master-port", min=1, max=65535),
    env: list[str] = typer.Option([], "-e", "--env", help="NAME=VALUE for the job (repeatable)."),
    collect: list[str] = typer.Option([], "--collect", help="Glob to bring back, relative to the run folder."),
    max_restarts: int = typer.Option(0, "--max-restarts", min=0, help="Passed to torchrun."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print every node's command; contact no host."),
    detach: bool = typer.Option(False, "--detach", "-d", help="Start the job and return; it runs on without us."),
    skip_check: bool = typer.Option(False, "--skip-check", help="Start without the preflight check (hosts answer, "
                                    "versions agree, master port free)."),
    schedule: Optional[str] = typer.Option(None, "--schedule", hidden=True,
                                           help="Set by a cron entry: the schedule that started this run."),
) -> None:
    """Start a DDP job on every host of INVENTORY (or `local`) and follow it to the end."""
    from .. import jobs, plan

    spec = plan.RunSpec(script=script, script_args=tuple(script_args or ()), name=name, gpus=gpus,
                        master_port=master_port, env=parse_env(env), collect=tuple(collect),
                        max_restarts=max_restarts)
    host_list = [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None
    prep = jobs.prepare(inventory, spec, runs_dir, host_list)
    print(f"run {prep.plan.run_id}", flush=True)
    if dry_run:
        print(plan.render(prep.plan))
        return
    fleet = None if skip_check else jobs.preflight(prep.plan)
    prep.store.create(jobs.new_record(prep, inventory, schedule=schedule))
    from .common import PrefixPrinter
    printer = PrefixPrinter([n.host.name for n in prep.plan.nodes])
    sigterm_as_interrupt()
    started = time.monotonic()

    def on_collect(r) -> None:
        if r.error:
            err(f"collect {r.host}: {r.error}")
        elif r.fetched or r.skipped:
            print(f"collected {len(r.fetched)} file(s) from {r.host}"
                  + (f", skipped {len(r.skipped)} still being written" if r.skipped else ""), flush=True)
    run_id = prep.plan.run_id
    try:
        jobs.execute(prep, printer, on_collect=on_collect, detach=detach, fleet=fleet)
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
