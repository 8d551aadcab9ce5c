"""Lines torch prints on every node of every run that say nothing about the job, for `--quiet`, for
the last line `top` shows and for the log tail a failure summary shows.

Only the terminal is quieted: the node's log file (and its local copy) keep every byte. Each
pattern is one torch habit, matched anywhere in the line (torch prefixes its log records with a
``W1130 14:00:00.000 123 file.py:45]`` header, on every line of a record); a match may also hide
the indented line that Python's ``warnings`` prints under it (the source line). Blocks are known by
their first line and go on while the lines carry the same header (one record, several lines).

Imports nothing of clusterddp: the CLI, ``top`` and the failure summary share this one list (and
``top``'s node program gets the line patterns as text, :data:`LINE_PATTERNS`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

# (pattern, whether the indented line after it belongs to it): each a line of its own
LINES: tuple[tuple[str, bool], ...] = (
    # c10d, when a peer's address has no reverse DNS name (most lab networks)
    (r"socket\.cpp:\d+\].*hostname of the client socket cannot be retrieved", False),
    # torchrun's OMP_NUM_THREADS banner: a header with no message, a row of stars, the sentence, a row of stars
    (r"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default", False),
    (r"^(?:.*\] )?\*{20,}\s*$", False),
    # torch imported without numpy (clusterddp.train needs none); the warning names its source line
    (r"UserWarning: Failed to initialize NumPy: No module named 'numpy'", True),
    # a torch log record's header with nothing after it (the first line of torchrun's banner)
    (r"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ [^\]]*:\d+\]\s*$", False),
)
LINE_PATTERNS: tuple[str, ...] = tuple(p for p, _ in LINES)  # as text, for `top`'s node program

# The first line of a multi-line torch record that is noise as a whole: every following line with
# the same header (``E1201 ... api.py:963] ``) is part of it. torch elastic's agent logs this one
# (with a traceback of 30-40 lines ending in DistNetworkError) when another node's agent finished
# first and took the store with it: the job itself succeeded.
BLOCKS: tuple[str, ...] = (r"Error waiting on exit barrier\. Elapsed: ",)

_LINES = tuple((re.compile(p.encode()), tail) for p, tail in LINES)
_BLOCKS = tuple(re.compile(p.encode()) for p in BLOCKS)
_HEADER = re.compile(rb"^\[?[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ \d+ [^\]]*:\d+\] ")


@dataclass
class NoiseFilter:
    """Says which lines of each host to hide; counts them. One per command (it keeps per-host state).
    A blank line right after hidden noise is hidden with it (a banner's spacing, a block's end)."""

    hidden: int = 0
    _continues: set[str] = field(default_factory=set)  # hosts whose next indented line is a warning's tail
    _block: dict[str, bytes] = field(default_factory=dict)  # host -> the header of the noise block it is in
    _after: set[str] = field(default_factory=set)  # hosts whose last line was hidden

    def __call__(self, host: str, line: bytes) -> bool:
        hide = self._noise(host, line)
        if not hide and host in self._after and not line.strip():
            hide = True  # an empty line left where the noise was
        if hide:
            self.hidden += 1
            self._after.add(host)
        else:
            self._after.discard(host)
        return hide

    def _noise(self, host: str, line: bytes) -> bool:
        header = self._block.get(host)
        if header is not None:
            if line.startswith(header):
                return True
            del self._block[host]
        if host in self._continues:
            self._continues.discard(host)
            if line.startswith((b" ", b"\t")):
                return True
        for pattern in _BLOCKS:
            if pattern.search(line):
                m = _HEADER.match(line)
                if m is not None:
                    self._block[host] = m.group()
                return True
        for pattern, tail in _LINES:
            if pattern.search(line):
                if tail:
                    self._continues.add(host)
                return True
        return False

    def summary(self, where: str) -> str | None:
        """The note for the end of the output, or None when nothing was hidden."""
        if not self.hidden:
            return None
        return f"--quiet hid {self.hidden} line(s) of known torch noise; {where} keeps them"


def without_noise(lines: Iterable[str]) -> list[str]:
    """The lines of one node's log that are not known torch noise, in order (a log tail, before
    its last lines are shown)."""
    keep = NoiseFilter()
    return [line for line in lines if not keep("", line.encode("utf-8", "surrogateescape"))]


# ---- torchrun's teardown ----
# When a rank fails or the run is stopped, every node's torchrun says so at length: its agent's log
# records (one line each) and its own traceback, through torch/distributed/run.py, ending in
# ChildFailedError (then a table of the node's failed ranks between two rows of '=') or in
# SignalException (it was sent SIGTERM). Per node, 25-45 lines that the failure summary says in one;
# `up` shows the summary instead. Known by these markers only: a rank's own traceback (``[rank1]:``
# or not) is the job's and is always shown.
TEARDOWN_LINES: tuple[str, ...] = (
    r"torch/distributed/elastic/\S{1,200}\] Sending process \d+ closing signal ",
    r"torch/distributed/elastic/\S{1,200}\] Received \S{1,40} death signal, shutting down workers",
    r"torch/distributed/elastic/\S{1,200}\] failed \(exitcode: ",
    r"^Terminated\s*$",  # the node's shell, of torchrun ended by the stop
)
# the exception line that ends torchrun's own traceback (a KeyboardInterrupt alone: a Ctrl-C on `up local`)
TEARDOWN_ERROR = (r"^(?:torch\.distributed\.elastic\.(?:multiprocessing\.(?:errors\.ChildFailedError|"
                  r"api\.SignalException)|rendezvous\.api\.RendezvousClosedError)\b|KeyboardInterrupt\s*$)")

_TEARDOWN_LINES = tuple(re.compile(p.encode()) for p in TEARDOWN_LINES)
_TEARDOWN_ERROR = re.compile(TEARDOWN_ERROR.encode())
_TRACEBACK = b"Traceback (most recent call last):"
_RULE = re.compile(rb"^={20,}\s*$")


@dataclass
class Teardown:
    """Holds each host's unprefixed traceback until its exception line says whose it is: torchrun's
    (:data:`TEARDOWN_ERROR`: hidden with its table) or not (shown as it came, in order). Lines of
    :data:`TEARDOWN_LINES` are hidden. One per command (per-host state); what it hides is counted, and
    the log files keep every byte. Bounded: a traceback longer than :data:`MOST` lines, or a table
    longer than that, is shown from there on."""

    MOST = 200
    hidden: int = 0
    _held: dict[str, list[bytes]] = field(default_factory=dict)   # host -> its traceback so far
    _table: dict[str, list[int]] = field(default_factory=dict)    # host -> [rules of '=' left, lines seen]

    def feed(self, host: str, line: bytes) -> list[bytes]:
        """The lines of ``host`` to show now, ``line`` the next one it printed (without its newline)."""
        bare = line.rstrip(b"\r")
        table = self._table.get(host)
        if table is not None:
            if table[1] == 0 and not _RULE.match(bare):  # no table after it: an older torch's words
                del self._table[host]
            else:
                table[1] += 1
                table[0] -= 1 if _RULE.match(bare) else 0
                if table[0] <= 0 or table[1] >= self.MOST:
                    del self._table[host]
                self.hidden += 1
                return []
        held = self._held.get(host)
        if held is not None:
            if bare.startswith((b" ", b"\t")) and len(held) < self.MOST:
                held.append(line)
                return []
            del self._held[host]
            if _TEARDOWN_ERROR.match(bare):
                self.hidden += len(held) + 1
                if b"ChildFailedError" in bare:
                    self._table[host] = [2, 0]
                return []
            return [*held, *self.feed(host, line)]  # not torchrun's: as it came (the line may start another)
        if bare == _TRACEBACK:
            self._held[host] = [line]
            return []
        if any(p.search(bare) for p in _TEARDOWN_LINES):
            self.hidden += 1
            return []
        return [line]

    def drain(self) -> list[tuple[str, bytes]]:
        """Every line still held (a traceback not ended yet), as (host, line), to show at the end."""
        out = [(host, line) for host, lines in self._held.items() for line in lines]
        self._held.clear()
        self._table.clear()
        return out

    def summary(self, where: str) -> str | None:
        """The note for the end of the output, or None when nothing was hidden."""
        if not self.hidden:
            return None
        return f"{self.hidden} line(s) of torchrun's teardown not shown; {where} keeps them"


def without_teardown(lines: Iterable[str]) -> list[str]:
    """``lines`` of one node's log without torchrun's teardown (:class:`Teardown`), in order."""
    keep = Teardown()
    out = [shown for line in lines for shown in keep.feed("", line.encode("utf-8", "surrogateescape"))]
    out += [line for _, line in keep.drain()]
    return [line.decode("utf-8", "surrogateescape") for line in out]
