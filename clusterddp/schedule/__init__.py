"""Scheduled runs: a spec file per schedule, and one short line in the user's crontab that fires it.

A schedule is two things:

* its spec, ``<runs-dir>/schedules/NAME.json`` (mode 0600, folder 0700, written atomically): a
  frozen :class:`ScheduleSpec` with a schema version: the cron expression, the launch folder,
  the inventory and script (absolute), the `up` options, the ``-e`` values, the script's
  arguments, this environment's bin folder and executable, the agent socket;
* one crontab line, tagged ``# clusterddp:NAME``, always of this form (one line in the crontab)::

    0 2 * * * { cd /home/ann/proj && PATH=/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
      /venv/bin/clusterddp schedule fire /srv/runs/schedules/nightly.json ; }
      >> /srv/runs/schedules/nightly.log 2>&1 # clusterddp:nightly

Why the values are not on the line (before spec files, the line carried the whole `up` command):
``-e`` values are often secrets, and a crontab line is printed by ``crontab -l`` and copied into
backups and cron's mails; a 0600 file is not. Every value on a line needs two layers of quoting
(the shell's, then cron's ``%``), cannot hold a newline and counts against cron's 998-byte limit;
JSON carries any value as it is. And the shell's lock logic (``flock -E 75 -n`` then
``|| schedule _skipped``) was code nothing could test but a golden string: ``schedule fire`` does
it in Python (:func:`load_spec`, :func:`try_lock`, :func:`start_up`).

What stays on the line, and why, is said in :mod:`.crontab`.

The package, by job: :mod:`.cron` (cron's grammar: the time fields, when they fire, ``%``),
:mod:`.spec` (the spec, its file, the `up` command it stands for), :mod:`.crontab` (rendering,
parsing and editing crontab lines, the editing lock, running an entry as cron would) and
:mod:`.fire` (the schedule's lock, starting its `up`, what each firing came to). Callers use the names re-exported here.
"""

from .cron import (
    KEYWORDS,
    check_cron,
    cron_command,
    next_runs,
)
from .crontab import (
    CRON_PATH,
    LOCK_DEADLINE,
    MAX_COMMAND,
    TAG,
    Edit,
    Entry,
    add,
    cron_daemon_running,
    cron_environment,
    current_executable,
    current_user,
    editing,
    entries,
    find,
    parse_line,
    read_crontab,
    remove,
    render_command,
    render_line,
    start,
    with_line,
    without_line,
    write_crontab,
)
from .fire import (
    BUSY_EXIT,
    LOCK_HELD,
    LOCK_HELD_EXIT,
    SLOTS_BUSY,
    Firing,
    ended,
    last_firing,
    lock_holder,
    lock_within,
    open_lock,
    record_firing,
    run_since,
    skipped,
    start_up,
    try_lock,
)
from .spec import (
    MAX_SPEC_BYTES,
    NAME_RE,
    SPEC_SCHEMA,
    SYSTEM_PATH,
    ScheduleSpec,
    check_name,
    load_spec,
    lock_path,
    log_path,
    save_spec,
    schedules_dir,
    search_path,
    spec_from_json,
    spec_path,
    up_argv,
    up_options,
)

__all__ = ["BUSY_EXIT", "CRON_PATH", "Edit", "Entry", "Firing", "KEYWORDS", "LOCK_DEADLINE", "LOCK_HELD",
           "LOCK_HELD_EXIT", "MAX_COMMAND", "MAX_SPEC_BYTES", "NAME_RE", "SLOTS_BUSY", "SPEC_SCHEMA", "SYSTEM_PATH",
           "ScheduleSpec", "TAG", "add", "check_cron", "check_name", "cron_command", "cron_daemon_running",
           "cron_environment", "current_executable", "current_user", "editing", "ended", "entries", "find",
           "last_firing", "load_spec", "lock_holder", "lock_path", "lock_within", "log_path", "next_runs",
           "open_lock", "parse_line", "read_crontab", "record_firing", "remove", "render_command", "render_line",
           "run_since", "save_spec", "schedules_dir", "search_path", "skipped", "spec_from_json", "spec_path",
           "start", "start_up", "try_lock", "up_argv", "up_options", "with_line", "without_line", "write_crontab"]
