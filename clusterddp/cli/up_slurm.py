"""`clusterddp up` with a `slurm:` inventory: submit, show the queue state, follow, cancel on Ctrl-C."""

from __future__ import annotations

import shlex
import time

from .common import PrefixPrinter, err, sigterm_as_interrupt, tell_missing


def prepare_slurm(inv, spec, runs_dir: str, hosts: list[str] | None, exclude: list[str] | None = None,
                  contact: bool = False):
    """Check the input and plan the run, as for SSH inventories; no network unless ``contact`` (a remote
    login host is then asked where its home is, for slurm.shared_dir)."""
    from .. import jobs, slurm
    from ..errors import UsageError
    if hosts is not None:
        raise UsageError("--hosts does not apply to a `slurm:` inventory: Slurm chooses the hosts",
                         "set slurm.nodes (and slurm.constraint, or `sbatch` options) in the inventory")
    if exclude:
        raise UsageError("--exclude: a `slurm:` inventory lists no hosts; Slurm picks them",
                         "leave --exclude out (Slurm's own --exclude goes in the inventory's `sbatch:` list)")
    return slurm.prepare(inv, spec, runs_dir, jobs.check_script(spec.script), contact=contact)


def up_slurm(inv, inventory_arg: str, spec, runs_dir: str, hosts: list[str] | None, limit: int, dry_run: bool,
             detach: bool, raw: bool, schedule: str | None, exclude: list[str] | None = None) -> None:
    prep = prepare_slurm(inv, spec, runs_dir, hosts, exclude, contact=not dry_run)
    try:
        _up(prep, inventory_arg, runs_dir, limit, dry_run, detach, raw, schedule)
    finally:
        prep.login.close()


def _up(prep, inventory_arg: str, runs_dir: str, limit: int, dry_run: bool, detach: bool, raw: bool,
        schedule: str | None) -> None:
    from .. import slurm
    from .. import slurm_plan as SP
    run_id = prep.plan.run_id
    from .. import upload
    folder = upload.scan(prep.source_dir, prep.store.root)
    upload.check_upload_size(folder, limit)
    if dry_run:
        print(f"run {run_id}", flush=True)
        print(SP.render(prep.plan))
        if prep.login.host is not None:
            print(f"login host: {prep.login.name} over SSH (not contacted by --dry-run; ~ is the home there)")
        print(f"upload: {folder.summary()}", flush=True)
        return
    prep.store.create(slurm.new_record(prep, inventory_arg, schedule=schedule))
    print(f"run {run_id}", flush=True)  # once recorded, so `logs`/`status` find it (as for SSH runs)
    print(f"upload: {folder.summary()}", flush=True)
    printer = PrefixPrinter([], raw=raw)
    sigterm_as_interrupt()
    started = time.monotonic()

    def on_state(info: slurm.JobInfo) -> None:
        where = f" on {','.join(info.hosts)}" if info.hosts else ""
        why = f" ({info.reason})" if info.reason not in ("None", "") else ""
        print(f"slurm job {info.job_id} {info.state.lower()}{why}{where}", flush=True)
        if info.hosts:
            printer.width = max(len(h) for h in info.hosts)

    def on_collect(r) -> None:
        if r.error:
            err(f"collect: {r.error}")
        elif r.fetched or r.skipped:
            print(f"collected {len(r.fetched)} file(s) from the run folder", flush=True)
        tell_missing("collect: ", r.missing)
    rd = f" --runs-dir {shlex.quote(runs_dir)}" if runs_dir != "./runs" else ""
    try:
        slurm.execute(prep, printer, detach=detach, on_state=on_state, on_collect=on_collect, folder=folder,
                      on_note=err, runs_dir_flag=rd)
    finally:
        printer.flush()
    if detach:
        rec = prep.store.load(run_id)
        job = rec.slurm.job_id if rec.slurm else "?"
        print(f"detached; slurm job {job} runs on without this command.\n"
              f"  follow: clusterddp logs {run_id} --follow{rd}\n"
              f"  status: clusterddp status {run_id}{rd}\n"
              f"  stop:   clusterddp stop {run_id}{rd}", flush=True)
        return
    print(f"run {run_id} succeeded in {time.monotonic() - started:.1f}s; run folder: {prep.store.run_dir(run_id)}",
          flush=True)
