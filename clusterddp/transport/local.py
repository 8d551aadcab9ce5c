"""Run node commands on this machine with bash (``clusterddp up local``)."""

from __future__ import annotations

import io
import subprocess
import threading
from collections.abc import Callable
from typing import cast

from ..errors import HostError, HostErrorKind
from ..inventory import Host
from .base import CommandResult, Stdin, stdin_bytes


class LocalTransport:
    """The local machine as a node: the same shell commands, no SSH."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def run(self, command: str, *, timeout: float | None = None, stdin: Stdin = None) -> CommandResult:
        try:
            p = subprocess.run(["bash", "-c", command], input=stdin_bytes(stdin),
                               capture_output=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise HostError(self.name, f"command timed out after {timeout:g}s", kind=HostErrorKind.TIMEOUT) from None
        return CommandResult(p.returncode, p.stdout, p.stderr)

    def stream(self, command: str, on_data: Callable[[bytes], None], *, timeout: float | None = None,
               stderr_to: bytearray | None = None, stdin: bytes | None = None) -> int:
        p = subprocess.Popen(["bash", "-c", command], stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
                             stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT if stderr_to is None else subprocess.PIPE)
        with self._lock:
            self._procs.add(p)
        try:
            assert p.stdout is not None
            stdout = cast(io.BufferedReader, p.stdout)  # stdout=PIPE, default bufsize: it has read1
            if stdin is not None and p.stdin is not None:
                try:
                    with p.stdin:
                        p.stdin.write(stdin)
                except BrokenPipeError:  # the command ended without reading it; its exit code says why
                    pass
            while chunk := stdout.read1(1 << 20):
                on_data(chunk)
            if stderr_to is not None and p.stderr is not None:
                stderr_to += p.stderr.read()  # small: a status line; stdout is already drained
            return p.wait()
        finally:
            with self._lock:
                self._procs.discard(p)

    def ping(self) -> None:
        """This machine is always there: no link to lose."""

    def close(self) -> None:
        with self._lock:
            for p in self._procs:
                p.kill()


def open(host: Host) -> LocalTransport:  # noqa: A001 - the backend entry point
    return LocalTransport(host.name)
