"""Numbers for people: the one formatter of byte counts every command prints sizes with, and the one
of rank lists (``ranks 0-2, 5``)."""

from __future__ import annotations

from collections.abc import Iterable

UNITS = ("B", "KiB", "MiB", "GiB", "TiB")


def human_size(n: float, short: bool = False, digits: int = 1) -> str:
    """``n`` bytes in binary units: ``512 B``, ``1.5 KiB``, ``16.0 MiB`` (``digits`` after the point,
    bytes always whole); ``short``: ``512B``, ``1.5K``, ``16.0M`` for tables."""
    x = float(n)
    unit = UNITS[0]
    for unit in UNITS:
        if x < 1024 or unit == UNITS[-1]:
            break
        x /= 1024
    name, sep = (unit[0], "") if short else (unit, " ")
    return f"{float(n):.0f}{sep}{name}" if unit == "B" else f"{x:.{digits}f}{sep}{name}"


def ranges(numbers: Iterable[int]) -> str:
    """``0-2, 5``: sorted numbers, runs written as ranges."""
    runs: list[list[int]] = []
    for n in sorted(numbers):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in runs)
