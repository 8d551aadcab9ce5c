"""What the CLI prints that came from elsewhere, made safe: control characters shown as escapes
(:func:`visible`), messages on stderr (:func:`err`), the files a collect left behind, the lines
``--quiet`` hid."""

from __future__ import annotations

import os
import re
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..noise import NoiseFilter, Teardown


# Control characters (C0 but newline and tab, DEL, C1) and lone surrogates, as visible escapes:
# text from a node must not move the cursor, clear the screen or retitle the terminal (OSC).
_VISIBLE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7f, *range(0x80, 0xa0)) if c not in (0x09, 0x0a)}
_VISIBLE.update({c: f"\\u{c:04x}" for c in range(0xd800, 0xe000)})
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")  # the keys of _VISIBLE


def visible(text: str) -> str:
    """``text`` safe for a terminal: control characters except newline and tab, and undecodable
    bytes, shown as escapes (``\\x1b``). Everything printed that came from a node goes through it."""
    # a regex, not str.translate: 20x faster on the usual text, which has nothing to escape
    return _CONTROL.sub(lambda m: _VISIBLE[ord(m.group())], text)


def visible_bytes(data: bytes) -> str:
    """Bytes from a node as :func:`visible` text (bytes that are not UTF-8 shown as ``\\xff``)."""
    return visible(data.decode("utf-8", "backslashreplace"))


def err(msg: str) -> None:
    """A message on stderr, escaped with :func:`visible` (error texts carry what nodes printed)."""
    print(visible(msg), file=sys.stderr, flush=True)


MAX_SHOWN = 20  # files not brought back named per host; the rest are counted


def tell_missing(lead: str, missing: tuple[tuple[str, str], ...]) -> None:
    """Name each file a collect did not bring back, and why (on stderr; the first MAX_SHOWN)."""
    for path, why in missing[:MAX_SHOWN]:
        err(f"{lead}not brought back: {path}: {why}")
    if len(missing) > MAX_SHOWN:
        err(f"{lead}... and {len(missing) - MAX_SHOWN} more files not brought back")



def quiet_filter(quiet: bool) -> NoiseFilter | None:
    """The line filter ``--quiet`` asks for (a :class:`~clusterddp.noise.NoiseFilter`), or None."""
    if not quiet:
        return None
    from ..noise import NoiseFilter
    return NoiseFilter()


def tell_hidden(hide: NoiseFilter | Teardown | None, where: str) -> None:
    """After the output: how many lines ``--quiet`` hid, and where they still are (stderr)."""
    said = hide.summary(where) if hide is not None else None
    if said:
        err(said)


def is_tty() -> bool:
    return sys.stdout.isatty() and os.environ.get("TERM") != "dumb"

