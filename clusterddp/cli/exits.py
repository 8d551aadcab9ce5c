"""How a command ends: errors mapped to a message and an exit code (the single exit), Ctrl-C and
SIGTERM, and the quick exit of commands that leave nothing for the interpreter's teardown."""

from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any, TypeVar

import typer

from ..errors import ClusterDDPError, StdoutClosed
from .crash import crash_report
from .output import err

F = TypeVar("F", bound=Callable)

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def handle_errors(fn: F) -> F:
    """The single exit: map clusterddp errors to a message and an exit code, never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except ClusterDDPError as e:
            err(f"error: {e}")
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            err("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except StdoutClosed:  # nobody reads what the command prints any more: it ends quietly
            raise typer.Exit(EXIT_OK) from None
        except Exception as e:  # a bug: one line and a crash report, not a traceback on the terminal
            if type(e).__module__.partition(".")[0] in ("typer", "click"):
                raise  # typer's/click's own ways out (Exit, Abort, BadParameter: RuntimeErrors some): it handles them
            err(crash_report(e, fn.__name__))
            raise typer.Exit(EXIT_FAILED) from None
    return wrapper  # type: ignore[return-value]


_quick_exit = False


def exit_quickly_when_done() -> None:
    """Let :func:`clusterddp.cli.app.main` end the process with ``os._exit`` once this command returns.

    For a command that leaves nothing for exit handlers (``exec``: its connections are closed,
    its output printed). Tearing the interpreter down after paramiko, cryptography and
    a thread per host costs about 0.07 CPU-s and, on a busy 2-core machine, 0.3-0.5 s of wall
    time, a tenth of `exec -- true` on 16 hosts (bench/RESULTS-exec.md). Commands run in-process
    (tests, CliRunner) never go through ``main``, so this changes nothing for them.
    """
    global _quick_exit
    _quick_exit = True


def quick_exit(code: object) -> None:
    """``os._exit(code)`` after flushing stdout, stderr and logging, if :func:`exit_quickly_when_done`
    was called and ``code`` is an exit status; otherwise return (Python exits as usual: a failed
    flush, a closed pipe, is reported then as always)."""
    if not _quick_exit or not (code is None or isinstance(code, int)):
        return
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        return
    if "logging" in sys.modules:
        sys.modules["logging"].shutdown()
    os._exit(code or 0)


def exit_at_interrupt(code: int) -> None:
    """From now on, Ctrl-C ends the process at once with ``code``, without a word: for when the
    command's work is over and only teardown is left (Python joining the threads a command left, such
    as `top`'s SSH looks; a Ctrl-C there printed a traceback of ``threading``'s shutdown). Only in the
    command's own process (:func:`~clusterddp.cli.pipes.guarded`): never in a test's."""
    import signal

    from .pipes import guarded

    def now(signum: int, frame: FrameType | None) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - closed, broken, or a write this signal interrupted (reentrant)
                pass
        os._exit(code)
    if guarded() and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, now)


def sigterm_as_interrupt() -> None:
    """Make SIGTERM end an attached run like Ctrl-C does (teardown everywhere, exit 130)."""
    import signal

    def handler(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)
