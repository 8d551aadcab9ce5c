"""The narrow seam between clusterddp and a node: run a command, stream a command, close."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

Stdin = bytes | os.PathLike | tuple[bytes | os.PathLike, ...] | None  # what Transport.run feeds a command


def stdin_parts(stdin: Stdin) -> tuple[bytes | os.PathLike, ...]:
    """``stdin``'s parts, in the order they are fed (none for None)."""
    if stdin is None:
        return ()
    return stdin if isinstance(stdin, tuple) else (stdin,)


def stdin_bytes(stdin: Stdin) -> bytes:
    """``stdin`` as one bytes (a path's file read whole): for a transport that feeds it at once."""
    return b"".join(Path(p).read_bytes() if isinstance(p, os.PathLike) else p for p in stdin_parts(stdin))


@dataclass(frozen=True)
class CommandResult:
    """Exit status and captured output of one command on one host."""

    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode("utf-8", "replace")


class Tail(bytearray):
    """Keeps only the last 64 KiB written to it with ``+=`` (or ``extend``): a node's stderr, of
    which only the last line is shown, need not be held whole."""

    def __iadd__(self, data):  # type: ignore[misc]  # returns the Tail itself, not bytearray.__add__'s bytearray
        super().__iadd__(data)
        del self[:-(64 << 10)]
        return self

    def extend(self, data) -> None:
        self += data


class Transport(Protocol):
    """A connection to one node. Commands are POSIX shell text rendered by :mod:`clusterddp.plan`.

    Every method raises :class:`~clusterddp.errors.HostError` when the host cannot be reached
    or stops answering within ``timeout``; a command's own non-zero exit is not an error.
    """

    name: str

    def run(self, command: str, *, timeout: float | None = None, stdin: Stdin = None) -> CommandResult:
        """Run ``command`` to completion, feeding ``stdin`` if given: bytes, a file's path (the
        upload's tarball, which the SSH transport sends in chunks; only it is given a path), or a
        tuple of those, one after another (a node's start: launch.sh, then the tarball)."""
        ...

    def stream(self, command: str, on_data: Callable[[bytes], None], *, timeout: float | None = None,
               stderr_to: bytearray | None = None, stdin: bytes | None = None) -> int:
        """Run ``command``, passing output chunks to ``on_data`` as they come; return its exit code.

        ``stdin`` is written in full before any output is read, so the command must read all of
        its input before it writes much.

        stderr is merged into the stream unless ``stderr_to`` is given, which then collects it.
        ``timeout`` bounds the wait for each chunk (not the whole command).
        """
        ...

    def ping(self) -> None:
        """Return once the host has answered a request that runs nothing there (over SSH, a global
        request the server must reply to): proof that the link and the node's sshd are alive, at
        no cost to the node. Raises HostError when the connection ends first; no bound of its own,
        so a caller that must not wait counts the time since the last answer (the heartbeats)."""
        ...

    def close(self) -> None:
        """Close the connection; pending streams end with a HostError."""
        ...
