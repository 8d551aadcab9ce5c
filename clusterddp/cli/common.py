"""The names the commands import, each from the module of its concern (kept in one place so a
command imports its pieces from one line):

- :mod:`.options`: the shared option declarations (the launch options, ``--runs-dir``, ``--hosts``,
  ``--exclude``, ``--fanout``) and :func:`~.options.launch_options`;
- :mod:`.flags`: the flags' text read into values (``--hosts a:0,1``, ``-e``, globs, the run spec);
- :mod:`.output`: escaping what came from elsewhere, messages on stderr;
- :mod:`.prefix`: the ``[host]`` printer;
- :mod:`.exits`: the single exit (errors to exit codes), Ctrl-C, SIGTERM, the quick exit;
- :mod:`.crash`: crash reports.
"""

from __future__ import annotations

from .crash import crash_dir, crash_report, masked_argv
from .exits import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    exit_at_interrupt,
    exit_quickly_when_done,
    handle_errors,
    quick_exit,
    sigterm_as_interrupt,
)
from .flags import (
    checkpoint_globs,
    host_list,
    host_slots,
    load_inventory,
    local_rank_flag,
    parse_env,
    run_spec,
)
from .options import (
    COLLECT,
    ENV,
    EXCLUDE,
    FANOUT,
    GPUS,
    HOSTS,
    INVENTORY,
    LOCAL_RANK_ARG,
    MASTER_PORT,
    MAX_GPUS,
    MAX_RESTARTS,
    MAX_UPLOAD,
    QUIET,
    RAW,
    RUN_NAME,
    RUNS_DIR,
    SCRIPT_ARGS,
    launch_options,
    option,
    with_recorded_options,
)
from .output import MAX_SHOWN, err, is_tty, quiet_filter, tell_hidden, tell_missing, visible, visible_bytes
from .prefix import PrefixPrinter

__all__ = [
    "COLLECT", "ENV", "EXCLUDE", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "EXIT_USAGE", "FANOUT", "GPUS",
    "HOSTS", "INVENTORY", "LOCAL_RANK_ARG", "MASTER_PORT", "MAX_GPUS", "MAX_RESTARTS", "MAX_SHOWN", "MAX_UPLOAD",
    "QUIET", "RAW", "RUNS_DIR", "RUN_NAME", "SCRIPT_ARGS", "PrefixPrinter", "checkpoint_globs", "crash_dir",
    "crash_report", "err", "exit_at_interrupt", "exit_quickly_when_done", "handle_errors", "host_list", "host_slots",
    "is_tty", "launch_options", "load_inventory", "local_rank_flag", "masked_argv", "option", "parse_env",
    "quick_exit", "quiet_filter", "run_spec", "sigterm_as_interrupt", "tell_hidden", "tell_missing", "visible",
    "visible_bytes", "with_recorded_options",
]
