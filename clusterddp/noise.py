"""Lines torch prints on every node of every run that say nothing about the job, for `--quiet`.

Only the terminal is quieted: the node's log file (and its local copy) keep every byte. Each
pattern is one torch habit, matched anywhere in the line (torch prefixes some with its logger's
``W1130 14:00:00.000 123 file.py:45]`` header); a match may also hide the indented line that
Python's ``warnings`` prints under it (the source line).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# (pattern, whether the indented line after it belongs to it)
KNOWN: tuple[tuple[re.Pattern[bytes], bool], ...] = (
    # c10d, when a peer's address has no reverse DNS name (most lab networks)
    (re.compile(rb"socket\.cpp:\d+\].*hostname of the client socket cannot be retrieved"), False),
    # torchrun's OMP_NUM_THREADS banner: a row of stars, the sentence, a row of stars
    (re.compile(rb"Setting OMP_NUM_THREADS environment variable for each process to be 1 in default"), False),
    (re.compile(rb"^(?:.*\] )?\*{20,}\s*$"), False),
    # torch imported without numpy (clusterddp.train needs none); the warning names its source line
    (re.compile(rb"UserWarning: Failed to initialize NumPy: No module named 'numpy'"), True),
)


@dataclass
class NoiseFilter:
    """Says which lines of each host to hide; counts them. One per command (it keeps per-host state)."""

    hidden: int = 0
    _continues: set[str] = field(default_factory=set)  # hosts whose next indented line is a warning's tail

    def __call__(self, host: str, line: bytes) -> bool:
        if host in self._continues:
            self._continues.discard(host)
            if line.startswith((b" ", b"\t")):
                self.hidden += 1
                return True
        for pattern, tail in KNOWN:
            if pattern.search(line):
                if tail:
                    self._continues.add(host)
                self.hidden += 1
                return True
        return False

    def summary(self, where: str) -> str | None:
        """The note for the end of the output, or None when nothing was hidden."""
        if not self.hidden:
            return None
        return f"--quiet hid {self.hidden} line(s) of known torch noise; {where} keeps them"
