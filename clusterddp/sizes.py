"""Byte counts for people: the one formatter every command prints sizes with."""

from __future__ import annotations

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
