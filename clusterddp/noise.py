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
