"""The ``[host] line`` printer of every command that shows nodes' output."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from .output import visible_bytes
from .pipes import stop_if_closed

if TYPE_CHECKING:
    from ..noise import Teardown


class PrefixPrinter:
    """Prints each complete line of each host as ``[host] line``; partial lines wait for their end.

    Lines are escaped with :func:`visible`; ``raw`` passes the job's bytes through untouched
    (colours, or a pipe to other tools), only the prefix added.

    A node can send a line that never ends (a binary file, a progress bar): what is held of a
    partial line is bounded by :data:`MAX_PARTIAL` (past it, it is printed as a line of its own)
    and each byte is copied a fixed number of times, however it is split into chunks. A progress
    bar that redraws itself with ``\\r`` is shown as a terminal would leave it: only the text after
    the last ``\\r`` of a line, and, while its line goes on, its latest state once every
    ``redraw_every`` seconds (``raw`` keeps the bytes as they came)."""

    MAX_PARTIAL = 64 * 1024  # bytes of one host's unfinished line held before it is printed anyway

    def __init__(self, hosts: list[str], stream: TextIO | None = None, raw: bool = False,
                 hide: Callable[[str, bytes], bool] | None = None, *, redraw_every: float = 10.0,
                 clock: Callable[[], float] | None = None, teardown: Teardown | None = None) -> None:
        import time
        self.stream = stream or sys.stdout
        self.raw = raw
        self.hide = hide  # `--quiet`: lines it says to hide are not printed (the log files keep them)
        # `up`: torchrun's teardown (clusterddp.noise.Teardown) is not printed (the log files keep it)
        self.teardown = teardown
        self.width = max((len(h) for h in hosts), default=0)
        self.redraw_every = redraw_every
        self._clock = clock or time.monotonic
        self._parts: dict[str, list[bytes]] = {}  # each host's unfinished line, in pieces (joined once)
        self._held: dict[str, int] = {}
        self._shown: dict[str, float] = {}  # when a host's redrawn line was last printed unfinished
        self._lock = threading.Lock()

    def held(self, host: str) -> int:
        """Bytes of ``host``'s unfinished line held now (at most :data:`MAX_PARTIAL`)."""
        return self._held.get(host, 0)

    def __call__(self, host: str, data: bytes) -> None:
        with self._lock:
            start = 0
            while (end := data.find(b"\n", start)) >= 0:
                self._end_line(host, data[start:end])
                start = end + 1
            if start < len(data):
                self._hold(host, data[start:] if start else data)
            self.stream.flush()

    def until_closed(self, host: str, data: bytes) -> None:
        """As a call, for output that goes on for as long as someone reads it (`logs --follow`):
        once nobody reads standard output, the command ends there (:class:`~clusterddp.errors.StdoutClosed`)."""
        self(host, data)
        stop_if_closed()

    def _end_line(self, host: str, piece: bytes) -> None:
        parts = self._parts.pop(host, None)
        self._held.pop(host, None)
        self._shown.pop(host, None)
        line = b"".join((*parts, piece)) if parts else piece
        if not self.raw:
            line = self._last_redraw(line.rstrip(b"\r"))
        self._emit(host, line)

    @staticmethod
    def _last_redraw(line: bytes) -> bytes:
        cr = line.rfind(b"\r")
        return line if cr < 0 else line[cr + 1:]

    def _hold(self, host: str, piece: bytes) -> None:
        parts = self._parts.setdefault(host, [])
        if self.raw:
            pass
        elif (cr := piece.rfind(b"\r", 0, len(piece) - 1)) >= 0 or parts and parts[-1].endswith(b"\r"):
            # a redraw: what came before it on this line is overwritten (a final \r may be a CRLF's)
            parts.clear()
            self._held[host] = 0
            piece = piece[cr + 1:]
            now = self._clock()
            if now - self._shown.setdefault(host, now) >= self.redraw_every and piece.rstrip(b"\r"):
                self._shown[host] = now
                self._emit(host, piece.rstrip(b"\r"))
        parts.append(piece)
        self._held[host] = self._held.get(host, 0) + len(piece)
        if self._held[host] > self.MAX_PARTIAL:
            line = b"".join(parts)
            at = 0
            while len(line) - at > self.MAX_PARTIAL:
                cut = at + self.MAX_PARTIAL
                while cut > at + self.MAX_PARTIAL - 3 and 0x80 <= line[cut] < 0xc0:  # not inside a UTF-8 character
                    cut -= 1
                self._emit(host, line[at:cut])
                at = cut
            self._parts[host] = [line[at:]]
            self._held[host] = len(line) - at

    def _emit(self, host: str, line: bytes) -> None:
        if self.teardown is None:
            self._show(host, line)
            return
        for shown in self.teardown.feed(host, line):
            self._show(host, shown)

    def _show(self, host: str, line: bytes) -> None:
        if self.hide is not None and self.hide(host, line.rstrip(b"\r")):
            return
        prefix = f"[{host.ljust(self.width)}] "
        if not self.raw:
            self.stream.write(prefix + visible_bytes(line.rstrip(b"\r")) + "\n")
            return
        binary = getattr(self.stream, "buffer", None)
        if binary is None:  # a text-only stream (tests): the bytes as they decode
            self.stream.write(prefix + line.decode("utf-8", "surrogateescape") + "\n")
            return
        self.stream.flush()  # what was printed as text goes first
        binary.write(prefix.encode() + line + b"\n")
        binary.flush()

    def flush(self) -> None:
        with self._lock:
            for host in list(self._parts):
                if self._held.get(host):
                    self._end_line(host, b"")
            for host, line in self.teardown.drain() if self.teardown is not None else ():
                self._show(host, line)  # a traceback whose end never came: shown after all
            self._parts.clear()
            self._held.clear()
            self._shown.clear()
            self.stream.flush()
