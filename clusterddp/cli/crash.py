"""Crash reports: a bug's traceback in a private file, one line on the terminal saying where."""

from __future__ import annotations

import os
import sys


def crash_dir() -> str:
    """Where crash reports go: ``$XDG_STATE_HOME/clusterddp`` (``~/.local/state/clusterddp``)."""
    state = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "clusterddp")


def masked_argv(argv: list[str]) -> list[str]:
    """``argv`` with every ``-e``/``--env`` value hidden (``NAME=***``): env values are secrets, and a
    crash report is a file users attach to bug reports. Names, ``@FILE`` and ``NAME`` alone stay."""
    def mask(flag_value: str) -> str:
        k, sep, _ = flag_value.partition("=")
        return f"{k}=***" if sep else flag_value
    out: list[str] = []
    after_env = False
    for i, a in enumerate(argv):
        if a == "--":  # the script's own arguments follow: not ours to read
            return out + argv[i:]
        if after_env:
            out.append(mask(a))
            after_env = False
        elif a in ("-e", "--env"):
            out.append(a)
            after_env = True
        elif a.startswith("--env="):
            out.append("--env=" + mask(a[len("--env="):]))
        elif a.startswith("-e") and not a.startswith("--") and len(a) > 2:
            out.append("-e" + mask(a[2:]))
        else:
            out.append(a)
    return out


def crash_report(e: BaseException, command: str) -> str:
    """Write ``e``'s traceback to a private crash file; return the one line telling the user where.

    The file is 0600 in a 0700 folder: a traceback's locals-free frames still name paths and
    arguments. If it cannot be written, the traceback goes to stderr after all (nothing is lost).
    """
    import time
    import traceback
    said = (str(e).strip().splitlines() or [""])[0][:200]
    what = f"internal error in `clusterddp {command.rstrip('_')}`: {type(e).__name__}" + (f": {said}" if said else "")
    from .. import __version__
    text = (f"clusterddp crash report\nclusterddp: {__version__}\n"
            f"command: {' '.join(masked_argv(sys.argv))}\npid: {os.getpid()}\n"
            f"time: {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\npython: {sys.version.split()[0]}\n\n"
            + "".join(traceback.format_exception(e)))
    folder = crash_dir()
    path = os.path.join(folder, f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt")
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace") as f:
            f.write(text)
    except OSError as why:
        return (f"{what}\n{text}(could not write a crash report to {path}: {why})\n"
                "please report this bug with the text above")
    return f"{what}; details written to {path} (please attach it to a bug report)"
