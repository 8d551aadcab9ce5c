"""Shared CLI pieces: the runs-dir option, error-to-exit-code mapping, prefixed output."""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Callable, TypeVar

import typer

from ..errors import ClusterDDPError

F = TypeVar("F", bound=Callable)

RUNS_DIR = typer.Option("./runs", "--runs-dir", envvar="CLUSTERDDP_RUNS_DIR",
                        help="Folder holding run records, logs and artifacts.")

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def err(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def handle_errors(fn: F) -> F:
    """The single exit: map clusterddp errors to a message and an exit code, never a traceback."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except ClusterDDPError as e:
            err(f"error: {e}")
            raise typer.Exit(e.exit_code) from None
        except KeyboardInterrupt:
            err("interrupted")
            raise typer.Exit(EXIT_INTERRUPTED) from None
    return wrapper  # type: ignore[return-value]


class PrefixPrinter:
    """Prints each complete line of each host as ``[host] line``; partial lines wait for their end."""

    def __init__(self, hosts: list[str], stream=None) -> None:
        self.stream = stream or sys.stdout
        self.width = max((len(h) for h in hosts), default=0)
        self._buf: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def __call__(self, host: str, data: bytes) -> None:
        with self._lock:
            buf = self._buf.get(host, b"") + data
            *lines, rest = buf.split(b"\n")
            self._buf[host] = rest
            for line in lines:
                self._emit(host, line)
            self.stream.flush()

    def _emit(self, host: str, line: bytes) -> None:
        text = line.rstrip(b"\r").decode("utf-8", "replace")
        self.stream.write(f"[{host.ljust(self.width)}] {text}\n")

    def flush(self) -> None:
        with self._lock:
            for host, rest in self._buf.items():
                if rest:
                    self._emit(host, rest)
            self._buf.clear()
            self.stream.flush()


def parse_env(pairs: list[str]) -> tuple[tuple[str, str], ...]:
    from ..errors import UsageError
    from ..inventory import ENV_NAME_RE
    out = []
    for p in pairs:
        k, sep, v = p.partition("=")
        if not sep or not ENV_NAME_RE.match(k):
            raise UsageError(f"-e/--env {p!r}: expected NAME=VALUE with a valid variable name",
                             "e.g. -e NCCL_DEBUG=INFO")
        out.append((k, v))
    return tuple(out)


def sigterm_as_interrupt() -> None:
    """Make SIGTERM end an attached run like Ctrl-C does (teardown everywhere, exit 130)."""
    import signal

    def handler(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, handler)


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"
