"""Cron's grammar: the five time fields (and the @ keywords) cron itself accepts, when they fire,
and how cron splits an entry's command at ``%`` (pure; croniter is imported when asked)."""

from __future__ import annotations

import re
from datetime import datetime

from ..errors import UsageError
from ..inventory.model import show

KEYWORDS = ("@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly")
_MONTHS = "jan|feb|mar|apr|may|jun|jul|aug|sep|oct|nov|dec"
_DAYS = "sun|mon|tue|wed|thu|fri|sat"
# What cron itself accepts per field; croniter knows more (L, #, ?, seconds) that cron would misread.
_FIELD_RES = [re.compile(p, re.IGNORECASE) for p in (
    r"^[0-9*/,-]+$", r"^[0-9*/,-]+$", r"^[0-9*/,-]+$",
    rf"^(?:[0-9*/,-]|{_MONTHS})+$", rf"^(?:[0-9*/,-]|{_DAYS})+$")]
_FIELD_NAMES = ("minute", "hour", "day of month", "month", "day of week")
_FIELD_MAX = (59, 23, 31, 12, 7)  # every number of a field, steps included, is at most this


def check_cron(expr: str, now: datetime | None = None) -> str:
    """The expression, whitespace normalised, if cron and croniter both accept it and it ever fires."""
    from croniter import croniter

    norm = " ".join(expr.split())
    example = "e.g. --cron '0 2 * * *' (02:00 every day) or --cron @daily"
    if norm.startswith("@"):
        if norm.lower() not in KEYWORDS:
            raise UsageError(f"--cron {expr!r}: unknown or unsupported keyword",
                             f"use five fields or one of {', '.join(KEYWORDS)}")
        norm = norm.lower()
    else:
        fields = norm.split(" ") if norm else []
        if len(fields) != 5:
            raise UsageError(f"--cron {expr!r}: expected 5 fields (minute hour day month weekday), "
                             f"got {len(fields)}", example)
        for f, rx, what in zip(fields, _FIELD_RES, _FIELD_NAMES, strict=True):  # 5 fields: checked above
            if not rx.match(f):
                raise UsageError(f"--cron {expr!r}: {what} field {f!r} is not valid for cron", example)
        for f, most, what in zip(fields, _FIELD_MAX, _FIELD_NAMES, strict=True):
            big = next((n for n in re.findall(r"[0-9]+", f) if len(n) > 2 or int(n) > most), None)
            if big is not None:  # croniter takes */99999999999999999999; cron would refuse or misread it
                raise UsageError(f"--cron {show(expr)}: {what} field: {show(big)} is out of range (0..{most}, "
                                 "steps included)", example)
    if not croniter.is_valid(norm):
        raise UsageError(f"--cron {expr!r}: not a valid cron expression", example)
    try:
        next_runs(norm, 1, now)
    except ValueError:  # croniter's CroniterBadDateError
        raise UsageError(f"--cron {expr!r}: never fires (no such date)", example) from None
    return norm


def next_runs(expr: str, n: int = 3, now: datetime | None = None) -> list[datetime]:
    """The next ``n`` times cron starts ``expr``, in local time (cron's clock), after ``now``."""
    from croniter import croniter

    it = croniter(expr, now or datetime.now().astimezone())
    return [it.get_next(datetime) for _ in range(n)]


def cron_command(command: str) -> tuple[str, str]:
    """Split an entry's command the way cron does: (shell command, standard input).

    ``\\%`` is a literal ``%``; the first bare ``%`` ends the command, and the rest, with
    further ``%`` turned into newlines, is the job's standard input.
    """
    out: list[str] = []
    escaped = False
    for i, ch in enumerate(command):
        if escaped:
            if ch == "%":
                out[-1] = "%"
            else:
                out.append(ch)
            escaped = False
            continue
        if ch == "\\":
            escaped = True
            out.append(ch)
            continue
        if ch == "%":
            return "".join(out), command[i + 1:].replace("%", "\n")
        out.append(ch)
    return "".join(out), ""
