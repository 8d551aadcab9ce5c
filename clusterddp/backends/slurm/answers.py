"""Slurm's answers, read defensively: ``scontrol show job``, ``scontrol show hostnames`` and ``sinfo``
as the login host sends them (a broken or hostile login host, or a wrapper in its PATH, can send
anything). Each parser returns checked values or raises :class:`~clusterddp.errors.SlurmAnswerError`
naming the command and the words refused, shown escaped and cut short; nothing here touches Slurm.
"""

from __future__ import annotations

import re

from ...errors import SlurmAnswerError

MAX_COUNT_DIGITS = 9       # a node, GPU or restart count: at most 999,999,999
MAX_HOSTS = 100_000        # hosts one job is allocated
MAX_FIELD = 256            # characters kept of a free-text field (Reason, Partition)
_COUNT = re.compile(rf"[0-9]{{1,{MAX_COUNT_DIGITS}}}")  # ASCII digits only: \d takes "١٢" too
# A Slurm node name as it may appear in a path (<control>/nodes/<host>/): no '/', no leading '.'
# (so never '.' or '..'), no white space or control characters.
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
_STATE = re.compile(r"[A-Z][A-Z_]{0,31}")
_FIELD = re.compile(r"\b(\w+)=(\S*)")  # \b: linear in a long word without "=" (quadratic without)


def shown(text: str, limit: int = 80) -> str:
    """Words from Slurm as a message shows them: quoted, escaped, at most ``limit`` characters."""
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def count(text: str, what: str) -> int:
    """A count Slurm printed (``what`` names the command and field, for the message)."""
    if not _COUNT.fullmatch(text):
        raise SlurmAnswerError(f"{what}: {shown(text)} is not a count",
                               "the login host's Slurm answered what Slurm never prints; check its "
                               "slurm-client (and that no wrapper answers in its place)")
    return int(text)


def job_fields(text: str, job_id: str) -> dict[str, str]:
    """``scontrol -o show job`` as key -> value, the fields clusterddp reads checked: JobState one of
    Slurm's words, Restarts a count, Reason and Partition cut to MAX_FIELD characters."""
    fields = dict(_FIELD.findall(text))
    what = f"scontrol show job {job_id}"
    state = fields.get("JobState", "UNKNOWN")
    if not _STATE.fullmatch(state):
        raise SlurmAnswerError(f"{what}: JobState={shown(state)} is not a job state",
                               "check the login host's slurm-client")
    fields["JobState"] = state
    fields["Restarts"] = str(count(fields.get("Restarts", "0") or "0", f"{what}: Restarts"))
    for key in ("Reason", "Partition"):
        if key in fields:
            fields[key] = fields[key][:MAX_FIELD]
    return fields


def hostnames(text: str, nodelist: str) -> tuple[str, ...]:
    """``scontrol show hostnames NODELIST``: each a node name that is safe as a folder name."""
    names = text.split()
    what = f"scontrol show hostnames {shown(nodelist, 40)}"
    if len(names) > MAX_HOSTS:
        raise SlurmAnswerError(f"{what}: {len(names)} hosts, more than {MAX_HOSTS}", "check the login host's Slurm")
    for name in names:
        if not _HOST.fullmatch(name):
            raise SlurmAnswerError(f"{what}: {shown(name)} is not a node name",
                                   "a node name is letters, digits, '.', '_' and '-', and never starts "
                                   "with '.'; check the login host's Slurm")
    return tuple(names)
