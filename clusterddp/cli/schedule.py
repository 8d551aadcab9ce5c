"""`clusterddp schedule add|list|remove|run` (and the hidden `fire`): scheduled runs on the system cron."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING, Any

import typer

from .. import launch
from .common import (
    COLLECT,
    ENV,
    EXCLUDE,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    GPUS,
    HOSTS,
    INVENTORY,
    LOCAL_RANK_ARG,
    MASTER_PORT,
    MAX_RESTARTS,
    RUN_NAME,
    RUNS_DIR,
    SCRIPT_ARGS,
    err,
    handle_errors,
    host_list,
    load_inventory,
    option,
    run_spec,
    visible,
    with_recorded_options,
)
from .examples import epilog
from .script_args import NoSuchOption, ScriptCommand

if TYPE_CHECKING:
    from ..schedule import Entry, Firing, ScheduleSpec

# The `up` options a schedule does not record (launch.Option.recorded is None), and why: `schedule add`
# says so, instead of calling them the script's arguments (they are `up`'s). Every one has a reason here
# (tests/schedule/test_schedule.py checks it).
NOT_SCHEDULED = {
    "detach": "a scheduled run is never detached: `schedule fire` waits for its run, holding the schedule's "
              "lock, so that the next firing cannot start a second run beside it",
    "dry_run": "a schedule runs its job when it fires; to see the commands it would run, give `clusterddp up` "
               "the same options and --dry-run",
    "show_secrets": "it only changes what --dry-run prints, and a schedule has no dry run: give `clusterddp up` "
                    "the same options, --dry-run and --show-secrets",
    "full": "it only changes what --dry-run prints, and a schedule has no dry run: give `clusterddp up` the same "
            "options, --dry-run and --full",
}


class ScheduleAddCommand(ScriptCommand):
    """`schedule add`: an `up` option it does not take is named as such, with why; any other unknown
    option is what :class:`ScriptCommand` says (the script's argument, missing its ``--``)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:  # click's option parser alone, on a copy: no callbacks, nothing set on ctx
            self.make_parser(ctx).parse_args(list(args))
        except NoSuchOption as e:
            flag = e.option_name
            up = next((o for o in launch.OPTIONS if o.recorded is None and flag in o.flags), None)
            if up is not None:
                err(f"error: `{ctx.command_path}` does not take `up`'s {flag}: {NOT_SCHEDULED[up.name]}; "
                    f"if {flag} is meant for the script, it goes after `--`")
                raise typer.Exit(EXIT_USAGE) from None
        except Exception:  # noqa: BLE001, S110 - any other problem is for the parse below to say
            pass
        return super().parse_args(ctx, args)  # ScriptCommand's: every other unknown option, swapped arguments


app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  context_settings={"help_option_names": ["-h", "--help"]},
                  help="Run `clusterddp up` on a timetable, from your crontab.")


@app.command("add", cls=ScheduleAddCommand, epilog=epilog("schedule add"))
@with_recorded_options
@handle_errors
def add(
    name: str = typer.Argument(..., help="Schedule name: letters, digits, '.', '_', '-'."),
    inventory: str = INVENTORY,
    script: str = typer.Argument(..., help="Training script."),
    script_args: list[str] | None = SCRIPT_ARGS,
    cron: str = typer.Option(..., "--cron", help="When to run, as cron fields: '0 2 * * *', or @daily."),
    runs_dir: str = RUNS_DIR,
    replace: bool = typer.Option(False, "--replace", help="Overwrite a schedule of the same name."),
    agent_socket: str | None = typer.Option(
        None, "--agent-socket", help="SSH_AUTH_SOCK for the runs (cron has no ssh-agent of its own)."),
    run_name: str | None = RUN_NAME,
    hosts: str | None = HOSTS,
    exclude: str | None = EXCLUDE,
    gpus: int | None = GPUS,
    master_port: int | None = MASTER_PORT,
    env: list[str] = ENV,
    collect: list[str] = COLLECT,
    max_restarts: int = MAX_RESTARTS,
    local_rank_arg: str | None = LOCAL_RANK_ARG,
    wait: bool = option("wait"),
    up_options: dict | None = None,
) -> None:
    """Add a crontab entry that runs `clusterddp up INVENTORY SCRIPT` at the --cron times, from here.

    The options, -e values and script arguments go to a 0600 spec file in <runs-dir>/schedules/,
    not into the crontab."""
    from .. import backends
    from .. import schedule as schedules
    from ..backends.base import LaunchRequest
    from ..inventory import LOCAL

    schedules.check_name(name)
    expr = schedules.check_cron(cron)
    run = run_spec(script, script_args, {"name": run_name, "gpus": gpus, "master_port": master_port, "env": env,
                                         "collect": collect, "max_restarts": max_restarts,
                                         "local_rank_arg": local_rank_arg})
    hosts_ = host_list(hosts)
    excluded = host_list(exclude, "--exclude")
    loaded = load_inventory(inventory, gpus=gpus)
    # the same checks as `up`, through the inventory's backend; no network
    from ..launch import parse_nodes
    from ..runspec import resolve
    nodes = parse_nodes((up_options or {}).get("nodes"))
    request = LaunchRequest(inventory, loaded, resolve(run, loaded, nodes), runs_dir, hosts_, exclude=excluded,
                            nodes=nodes,
                            resume=_resume((up_options or {}).get("resume")), schedule=name)
    backend = backends.for_inventory(loaded)
    prep = backend.prepare(request)
    from .. import notify
    notify.targets_for(loaded.notify, (up_options or {}).get("notify", []))  # a wrong target: exit 2 now, not at 2 a.m.
    if excluded:  # the spec records the hosts that are left, as --hosts
        hosts_ = [h.name for h in prep.plan.inventory.hosts]
    run = dataclasses.replace(run, script=os.path.abspath(script))
    executable, bin_dir = schedules.current_executable()
    spec = schedules.ScheduleSpec(
        name=name, cron=expr, launch_dir=os.getcwd(), runs_dir=str(prep.store.root), executable=executable,
        bin_dir=bin_dir, inventory=inventory if inventory == LOCAL else os.path.abspath(inventory), run=run,
        hosts=tuple(hosts_ or ()),
        agent_socket=os.path.abspath(os.path.expanduser(agent_socket)) if agent_socket else None, wait=wait,
        up=tuple((k, v) for k, v in (up_options or {}).items() if v != launch.BY_NAME[k].default))
    edit = schedules.add(spec, replace)

    print(f"{'replaced' if edit.replaced else 'added'} schedule {name}: {expr}")
    print("  next:  " + ", ".join(t.strftime("%Y-%m-%d %H:%M %Z") for t in schedules.next_runs(expr, 3)))
    print(f"  runs:  {spec.runs_dir}\n  spec:  {spec.spec_path}\n  log:   {spec.log_path}")
    if backend.name == "ssh" and not prep.plan.local:  # SSH runs lease GPU slots (Slurm allocates its own)
        print("  slots: " + ("taken by another run: it waits in the queue (--wait)" if wait else
                             "taken by another run: the firing is skipped (add --wait to wait in the queue)"))
    print(f"  try it now: clusterddp schedule run {name}")
    no_key = [h.name for h in prep.plan.inventory.hosts if h.transport == "ssh" and not h.identity_file]
    if no_key and not spec.agent_socket:
        err(f"warning: cron runs without your ssh-agent, and {', '.join(no_key)} "
            f"{'has' if len(no_key) == 1 else 'have'} no identity_file in the inventory: the runs can only log "
            "in with a key from ~/.ssh/config or a default key without a passphrase.\n"
            "  set identity_file in the inventory, or pass --agent-socket PATH")
    if spec.agent_socket and not _is_socket(spec.agent_socket):
        err(f"warning: --agent-socket {spec.agent_socket} is not a socket now; the runs need an agent there")
    if not schedules.cron_daemon_running():
        err("warning: no cron daemon is running on this machine; start it (e.g. `service cron start`) "
            "or the schedule never fires")


def _resume(given: str | None) -> str | None:
    """A schedule's ``--resume``: only ``previous`` (the run this schedule started last); a fixed run would
    be resumed from again at every firing."""
    from ..errors import UsageError
    from ..resume import PREVIOUS
    if given is not None and given != PREVIOUS:
        raise UsageError(f"--resume {given}: a schedule resumes from the run it started last",
                         f"give --resume {PREVIOUS}")
    return given


SCHEDULES_RUNS_DIR = typer.Option(None, "--runs-dir", envvar="CLUSTERDDP_RUNS_DIR",
                                  help="Only the schedules whose runs go to this folder (default: every schedule "
                                       "in your crontab; each line names its own runs folder).")


def _in_runs_dir(entry: Entry, runs_dir: str | None) -> bool:
    """Whether ``entry`` keeps its runs in ``runs_dir`` (always, when no --runs-dir was given)."""
    from ..store import RunStore
    return runs_dir is None or (entry.runs_dir is not None
                                and os.path.normpath(entry.runs_dir) == str(RunStore(runs_dir).root))


def _entry(text: str, name: str, runs_dir: str | None) -> Entry:
    """Schedule ``name``'s crontab entry; UnknownSchedule if none, UsageError if --runs-dir names another folder."""
    from .. import schedule as schedules
    from ..errors import UnknownSchedule, UsageError

    entry = schedules.find(text, schedules.check_name(name))
    if entry is None:
        raise UnknownSchedule(name, schedules.current_user().pw_name)
    if not _in_runs_dir(entry, runs_dir):
        raise UsageError(f"schedule {name!r} keeps its runs in {entry.runs_dir or '(a folder its line does not say)'}"
                         f", not in {runs_dir}", "leave --runs-dir out, or give the schedule's own runs folder")
    return entry


def _is_socket(path: str) -> bool:
    import stat
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


@app.command("list", epilog=epilog("schedule list"))
@handle_errors
def list_(runs_dir: str | None = SCHEDULES_RUNS_DIR) -> None:
    """Every schedule in your crontab: expression, next three runs, and its last firing: when, what
    it came to (succeeded, failed, stopped, running, skipped: lock held, skipped: slots busy) and its run."""
    from datetime import datetime

    from .. import schedule as schedules
    from ..store import RunStore

    found = [e for e in schedules.entries(schedules.read_crontab()) if _in_runs_dir(e, runs_dir)]
    if not found:
        print(f"no schedules in the crontab of {schedules.current_user().pw_name}"
              + (f" with runs in {RunStore(runs_dir).root}" if runs_dir else "")
              + "; add one with `clusterddp schedule add`")
        return
    now = datetime.now().astimezone()
    rows = [("NAME", "CRON", f"NEXT RUNS ({now.tzname()})", "LAST FIRED", "OUTCOME", "RUN", "SKIPS")]
    for e in found:
        try:
            nxt = "  ".join(t.strftime("%Y-%m-%d %H:%M") for t in schedules.next_runs(e.cron, 3, now))
        except Exception:  # an entry edited by hand into something croniter cannot follow
            nxt = "?"
        store = RunStore(e.runs_dir) if e.runs_dir else None
        last = schedules.last_firing(store, e.name) if store else None
        skips = len(store.skips(e.name)) if store else 0
        rows.append((e.name, e.cron, nxt, _local(last["at"]) if last else "-", last["outcome"] if last else "-",
                     (last["run_id"] or last["holder"] or "-") if last else "-", str(skips)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) + "  " + r[-1])  # last column unpadded


def _local(stamp: str | None) -> str:
    """A stored UTC time as local time, to the minute, as NEXT RUNS shows its times."""
    from datetime import datetime
    try:
        return datetime.fromisoformat(str(stamp)).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return "?"


@app.command("remove", epilog=epilog("schedule remove"))
@handle_errors
def remove(name: str = typer.Argument(..., help="The schedule to remove."),
           runs_dir: str | None = SCHEDULES_RUNS_DIR) -> None:
    """Remove a schedule's crontab entry and its spec file (its runs, log and lock file stay)."""
    from .. import schedule as schedules

    if runs_dir is not None:
        _entry(schedules.read_crontab(), name, runs_dir)
    schedules.remove(schedules.check_name(name))
    print(f"removed schedule {name}")


@app.command("run", epilog=epilog("schedule run"))
@handle_errors
def run(name: str = typer.Argument(..., help="The schedule to run now."),
        runs_dir: str | None = SCHEDULES_RUNS_DIR) -> None:
    """Run a schedule's entry now, exactly as cron would (same command and environment), and wait."""
    from .. import schedule as schedules

    text = schedules.read_crontab()
    entry = _entry(text, name, runs_dir)
    log = entry.log_path
    pos = os.path.getsize(log) if log and os.path.exists(log) else 0
    print(f"running schedule {name} as cron would" + (f"; its log: {log}" if log else ""), flush=True)
    proc = schedules.start(text, entry)
    try:
        while True:
            done = proc.poll() is not None
            pos = _copy_new(log, pos)
            if done:
                break
            time.sleep(0.2)
    except KeyboardInterrupt:  # the run got the Ctrl-C too, and tears down; wait for it
        proc.wait()
        _copy_new(log, pos)
        err("interrupted")
        raise typer.Exit(EXIT_INTERRUPTED) from None
    rc = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
    if rc == schedules.LOCK_HELD_EXIT:
        err(f"schedule {name}: skipped, its previous run still holds the schedule's lock (nothing started)")
    elif rc == schedules.BUSY_EXIT:
        err(f"schedule {name}: skipped, the GPU slots it needs are taken (nothing started)")
    raise typer.Exit(rc)


def _copy_new(log: str | None, pos: int) -> int:
    """Print what was appended to ``log`` since ``pos``; return the new position."""
    if not log:
        return pos
    try:
        with open(log, "rb") as f:
            f.seek(pos)
            data = f.read()
    except FileNotFoundError:
        return pos
    if data:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
    return pos + len(data)


@app.command("fire", hidden=True)
@handle_errors
def fire(spec_file: str = typer.Argument(..., help="The schedule's spec file.")) -> None:
    """What a schedule's crontab line runs: check the spec, take the schedule's lock without
    waiting (held: the previous run still runs, so record a skip and exit 3), run `clusterddp up`,
    record what the firing came to (`schedule list` shows it) and exit with `up`'s exit code."""
    from .. import schedule as schedules
    from ..store import utcnow

    spec = schedules.load_spec(spec_file)
    lock = schedules.try_lock(spec)
    if lock is None:
        from .. import backends, notify
        firing = _record_skip(spec.name, spec.runs_dir)
        assert firing.reason is not None
        for line in notify.tell_skip(spec.inventory, dict(spec.up).get("notify", []), spec.name, firing.reason,
                                     firing.holder, sections=backends.inventory_section):
            err(visible(line))
        raise typer.Exit(schedules.LOCK_HELD_EXIT)
    since = utcnow("milliseconds")
    print(f"[clusterddp] {utcnow()} schedule {spec.name}: starting clusterddp up (spec {spec.spec_path})", flush=True)
    proc = schedules.start_up(spec, lock)
    while True:
        try:
            rc = proc.wait()
            break
        except KeyboardInterrupt:  # the run got the Ctrl-C too, and tears down; wait for it
            continue
    rc = rc if rc >= 0 else 128 - rc
    _record_end(spec, since, rc)
    raise typer.Exit(rc)


def _record_skip(name: str, runs_dir: str) -> Firing:
    from .. import schedule as schedules
    from ..record import RunStatus
    from ..store import RunStore, utcnow

    last = RunStore(runs_dir).last_run(name)
    holder = last["run_id"] if last and last["status"] == RunStatus.RUNNING else None
    # milliseconds, as a started firing's: two firings of one second are listed in their order
    firing = schedules.skipped(name, str(RunStore(runs_dir).root), utcnow("milliseconds"), holder)
    schedules.record_firing(runs_dir, name, firing)
    print(f"[clusterddp] {firing.at} schedule {name}: {firing.says()}", flush=True)
    return firing


def _record_end(spec: ScheduleSpec, since: str, rc: int) -> None:
    """Record and say what the firing came to; a runs folder that cannot take it is said, and the
    exit code stays `up`'s."""
    from .. import schedule as schedules
    from ..errors import ClusterDDPError
    from ..store import utcnow

    try:
        firing = schedules.ended(spec, since, rc, schedules.run_since(spec.runs_dir, spec.name, since))
        schedules.record_firing(spec.runs_dir, spec.name, firing)
    except ClusterDDPError as e:
        err(f"warning: schedule {spec.name}: this firing was not recorded: {str(e).splitlines()[0]}")
        return
    print(f"[clusterddp] {utcnow()} schedule {spec.name}: {firing.says()}", flush=True)
