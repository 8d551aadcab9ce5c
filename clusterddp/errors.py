"""The one error hierarchy of clusterddp: every exception class the CLI maps lives here.

Library code raises these; only the CLI turns them into a message and an exit code
(0 ok, 1 job failed, 2 bad input, 130 interrupted). Two stay beside their code on purpose:
``node.probe.ProbeError`` and ``node.collect.StreamError`` are raised by parsers that share a
module with a program run alone on a node, which may import nothing from clusterddp; they never
reach the CLI (check and artifacts turn them into per-host results).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ClusterDDPError(Exception):
    """Base error: a message, and what the user should do about it."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class UsageError(ClusterDDPError):
    """Bad input on the command line or in a file: exit code 2."""

    exit_code = 2


class InventoryError(UsageError):
    """An inventory problem located by file, field path (``hosts[1].gpus``) and, where known, line."""

    def __init__(self, path: str, message: str, field: str | None = None, line: int | None = None,
                 hint: str | None = None) -> None:
        where = path if line is None else f"{path}:{line}"
        head = f"{where}: {field}: {message}" if field else f"{where}: {message}"
        super().__init__(head, hint)
        self.path, self.field, self.line = path, field, line


class LockFileError(UsageError):
    """A `packages:` lock file that is not one, located by file and, where known, line (exit 2)."""

    def __init__(self, path: str, message: str, line: int | None = None, hint: str | None = None) -> None:
        super().__init__(f"{path}:{line}: {message}" if line else f"{path}: {message}", hint)
        self.path, self.line = path, line


class RunNotFound(UsageError):
    """A run id (or prefix) that names no run, or more than one."""


class HostErrorKind(Enum):
    """What went wrong with a host, decided where the SSH library's exception is translated.

    Callers (check's table, for one) branch on this, never on the message's wording.
    """

    HOST_KEY_UNKNOWN = "host_key_unknown"
    HOST_KEY_CHANGED = "host_key_changed"
    AUTH_REFUSED = "auth_refused"
    TIMEOUT = "timeout"
    UNREACHABLE = "unreachable"
    CONNECTION_LOST = "connection_lost"
    CONFIG = "config"  # the host's ssh_config entry cannot be used
    KEY_FILE = "key_file"  # the inventory's identity_file names no readable key file
    OTHER = "other"


class HostError(ClusterDDPError):
    """Something went wrong talking to one host (connect, auth, host key, command)."""

    def __init__(self, host: str, message: str, hint: str | None = None,
                 kind: HostErrorKind = HostErrorKind.OTHER) -> None:
        super().__init__(f"{host}: {message}", hint)
        self.host = host
        self.detail = message  # the message without the host's name in front
        self.kind = kind


@dataclass(frozen=True)
class NodeOutcome:
    """How one node's part of a run ended."""

    host: str
    node_rank: int
    exit_code: int | None  # None: never started, lost, or killed before it could record one
    error: str | None = None


def blame(first_failed: str | None, root: str | None) -> str:
    """Whom a failed run's headline names: the root cause's host (the diagnosis, ``root``) where there
    is one, so the headline and the root cause below it never name two hosts without saying why (a
    stall found on one node, ended first on another)."""
    if root and first_failed and root != first_failed:
        return f"root cause on {root} ({first_failed} ended first)"
    return f"{root or first_failed} failed first"


class RunFailed(ClusterDDPError):
    """A run ended badly; carries every node's outcome and names the first failure."""

    def __init__(self, run_id: str, outcomes: list[NodeOutcome], first_failed: str | None,
                 status: str = "failed", said: dict[str, str] | None = None,
                 cause: tuple[str, ...] | list[str] = (), root: str | None = None) -> None:
        lines = [f"run {run_id} {status}" + (f": {blame(first_failed, root)}" if first_failed or root else "")]
        lines += [f"  {line}" for line in cause]  # the root cause (clusterddp.failure), then every other node
        for o in outcomes if not cause else ():
            # ``said``: each node in the words `status` prints (NodeRecord.describe), when the record is known
            what = (said or {}).get(o.host) or (f"exit {o.exit_code}" if o.exit_code is not None else "no exit code")
            lines.append(f"  {o.host} (node {o.node_rank}): {what}" + (f" - {o.error}" if o.error else ""))
        super().__init__("\n".join(lines),
                         f"see the logs under the run folder, or `clusterddp logs {run_id}`")
        self.run_id, self.outcomes, self.first_failed, self.status = run_id, outcomes, first_failed, status
        self.cause = tuple(cause)


class SlurmError(ClusterDDPError):
    """A Slurm command (sbatch, scontrol, scancel, ...) failed or is missing: exit 1, naming the
    command and what it said."""


class SlurmAnswerError(SlurmError):
    """A Slurm command answered what Slurm never says (a count that is no count, a host name that
    climbs out of a folder): refused, naming the command and the words (escaped). A run whose job
    gives such an answer is not followed further: its job is cancelled and the run marked failed."""


class RecordError(UsageError):
    """A run.json that cannot be read, located by file and field (``nodes[1].exit_code``)."""

    def __init__(self, path: str, field: str | None, message: str, hint: str | None = None) -> None:
        super().__init__(f"{path}: {field}: {message}" if field else f"{path}: {message}",
                         hint or "the run record is damaged: repair that field in the file, or move the run "
                                 "folder out of the runs folder")
        self.path, self.field = path, field


class SpecError(UsageError):
    """A schedule spec file that is damaged, or that someone else could have written: nothing is started."""

    def __init__(self, path: str, field: str | None, problem: str, hint: str | None = None) -> None:
        super().__init__(f"schedule spec {path}: {field + ': ' if field else ''}{problem}",
                         hint or "`clusterddp schedule add` writes this file: add the schedule again "
                                 "(with --replace) to rewrite it")
        self.path, self.field = path, field


class UnknownSchedule(UsageError):
    """No schedule of that name in the user's crontab."""

    def __init__(self, name: str, user: str) -> None:
        super().__init__(f"no schedule {name!r} in the crontab of {user}",
                         "list schedules with `clusterddp schedule list`")


class FileRefused(UsageError):
    """A file :func:`clusterddp.files.read_bounded` would not read: missing, not a regular file (a
    FIFO, a device, a folder), unreadable or too large. ``reason`` says which, ``problem`` how, for
    the caller that names the file its own way (an inventory, ``-e @FILE``, a spec)."""

    def __init__(self, path: str, reason: str, problem: str, hint: str | None = None) -> None:
        super().__init__(f"{path}: {problem}", hint)
        self.path, self.reason, self.problem = path, reason, problem


class MirrorError(ClusterDDPError):
    """The checkpoints the mirror holds here cannot be used: a damaged ``mirror.json``, or a local copy
    that no longer has the sha256 it was brought back with (clusterddp.mirror)."""


class LockTimeout(ClusterDDPError):
    """A lock still held by someone else when its deadline passed."""


class PreflightFailed(ClusterDDPError):
    """`up` refused to start a job that would fail or hang: exit code 1, each problem named.

    ``report`` is the check's Report (``clusterddp.check``), kept for callers that want details.
    """

    def __init__(self, failed_hosts: list[str], summary: str, inventory_path: str, report: object = None) -> None:
        super().__init__(f"preflight check failed on {', '.join(failed_hosts)}; the job was not started:\n"
                         + summary,
                         f"`clusterddp check {inventory_path}` checks more (GPUs, disk, clocks); "
                         "`up --skip-check` starts without checking")
        self.report = report


class StoreError(UsageError):
    """The runs folder or runs.db cannot be used as it is; the message names the path and the fix."""


class LeaseBusy(ClusterDDPError):
    """A run that does not fit in the free GPU slots now (``up`` without ``--wait``): nothing was
    started. Exit code 75 (EX_TEMPFAIL): try again later, or wait (a schedule's firing: `skipped: slots busy`).
    ``holders`` are the leases (``leases.Holding``) on the node that did not fit, ``host`` its name."""

    exit_code = 75

    def __init__(self, message: str, hint: str | None = None, *, holders: tuple = (), run_id: str = "",
                 host: str | None = None) -> None:
        super().__init__(message, hint)
        self.holders, self.run_id, self.host = holders, run_id, host


class QuarantineError(UsageError):
    """The launching machine's quarantine file cannot be read or written (exit code 2: the file is
    named, with the fix; clusterddp.quarantine)."""


class Quarantined(LeaseBusy):
    """A run asked for a host that is quarantined: nothing was started. Exit code 75 (EX_TEMPFAIL),
    as for GPU slots taken: it can run later, or without that host."""


class StdoutClosed(BaseException):  # noqa: N818 - like KeyboardInterrupt: a way out, not an error
    """Raised by a command that prints for as long as someone reads, once nobody does; the CLI's
    single exit (``cli.common.handle_errors``) ends the command quietly, status 0. A BaseException, as
    KeyboardInterrupt is, so that no ``except Exception`` on the way counts it as a host's failure."""
