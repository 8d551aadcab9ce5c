"""A closed standard output or error (`clusterddp runs | head -3`, `up --detach | head -1`) ends no
command halfway.

Python ignores SIGPIPE, so a write to a pipe whose reader has gone raises ``BrokenPipeError``
wherever the command happens to print: in the middle of `up` (after the run was recorded, before it
started: a phantom run), or as an "internal error" of `runs`. :func:`guard` (called once, by
:func:`clusterddp.cli.app.main`) puts the process's ``sys.stdout`` and ``sys.stderr`` on a file
that never raises it: the first write that finds the reader gone points that descriptor at
``/dev/null`` and is counted as written, so every later write is dropped and the command finishes
(or undoes) what it started as if its output were /dev/null, and exits with the status it would
have had, without a word (a reader that left wants no message). A command whose only work is
printing for as long as someone reads (`top`, `logs --follow`) asks :func:`closed` at its next
line and ends there, as Unix tools end at their next write after the reader left.
"""

from __future__ import annotations

import io
import os
import sys
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer
import threading

from ..errors import StdoutClosed

_closed: set[int] = set()  # the descriptors (1, 2) whose reader went away, now on /dev/null
_lock = threading.Lock()
_guarded_process = False  # guard() ran: this is the installed command's process, not a test's


def guarded() -> bool:
    """Whether :func:`guard` ran: the process is the command's own (``python -m clusterddp``)."""
    return _guarded_process


def closed(fd: int = 1) -> bool:
    """Whether ``fd``'s reader has gone (a write found it so); its output now goes to /dev/null."""
    return fd in _closed


def stop_if_closed() -> None:
    """For a command that prints for as long as someone reads: end it (:class:`StdoutClosed`) once
    nobody reads its standard output."""
    if 1 in _closed:
        raise StdoutClosed


def _gone(fd: int) -> None:
    with _lock:
        if fd in _closed:
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
        _closed.add(fd)


class _PipeSafe(io.RawIOBase):
    """A file descriptor that a write to a reader-less pipe leaves on /dev/null instead of raising.
    Closing it leaves the descriptor open (RawIOBase closes nothing): it is the process's."""

    def __init__(self, fd: int) -> None:
        super().__init__()
        self._fd = fd

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, b: ReadableBuffer) -> int:
        try:
            return os.write(self._fd, b)
        except BrokenPipeError:
            _gone(self._fd)
            return len(memoryview(b))  # dropped, as /dev/null drops it


def _guarded(stream: TextIO, fd: int) -> io.TextIOWrapper:
    """``stream`` (sys.stdout or sys.stderr on ``fd``) again, on a :class:`_PipeSafe` descriptor."""
    line_buffering = getattr(stream, "line_buffering", False)
    buffered = io.BufferedWriter(_PipeSafe(fd))
    return io.TextIOWrapper(buffered, encoding=stream.encoding, errors=stream.errors, newline="\n",
                            line_buffering=line_buffering, write_through=getattr(stream, "write_through", fd == 2))


def guard() -> None:
    """Put ``sys.stdout`` and ``sys.stderr`` (where they are the process's descriptors 1 and 2) on
    descriptors that survive their reader going away. For the installed command only: tests that
    capture output (CliRunner) never come through :func:`clusterddp.cli.app.main`."""
    global _guarded_process
    _guarded_process = True
    for name, fd in (("stdout", 1), ("stderr", 2)):
        stream = getattr(sys, name)
        try:
            if stream is None or stream.fileno() != fd:
                continue
            stream.flush()
        except (OSError, ValueError, AttributeError, io.UnsupportedOperation):
            continue  # not a real descriptor (or already broken): left as it is
        setattr(sys, name, _guarded(stream, fd))  # the old one stays alive as sys.__stdout__/__stderr__
