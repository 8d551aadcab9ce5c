"""status, logs, stop and collect of a run handed to Slurm, from its run record.

Slurm says where the job stands (``scontrol``) and ends it (``scancel``); each node's log and exit
code are read from the run's folder in the shared dir (:mod:`.plan`). Both happen on
the login host the run record names (this machine, or one reached over SSH: :mod:`.login`).
"""

from __future__ import annotations

import math
import posixpath
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import datetime, timezone
from typing import TYPE_CHECKING, BinaryIO

from ... import nodescript as node_script
from ...artifacts import CollectResult
from ...errors import HostError, SlurmAnswerError, UsageError
from ...fleet import fan_out
from ...inventory import RunNode
from ...node import notify as node_notify
from ...plan import NodeLaunch
from ...record import NodeRecord, NodeState, RunRecord, RunStatus, ended_at
from ...store import RunStore
from ...transport.base import CommandResult, Stdin, Transport
from ..base import RunOutcome, Stopped
from . import commands as slurm_commands
from . import job as slurm
from . import plan as slurm_plan
from .jobpart import job_of
from .login import Login, open_login

if TYPE_CHECKING:
    from ...artifacts import Progress
    from ...check import Report
    from ...inventory import Inventory
    from ...stacks import Taken


@contextmanager
def _login(rec: RunRecord) -> Iterator[Login]:
    """Where the run's Slurm commands run and its shared folder is: as recorded."""
    login = open_login(job_of(rec).login)
    try:
        yield login
    finally:
        login.close()


def _job(rec: RunRecord) -> tuple[str, str]:
    """(job id, control folder) of a Slurm run; a run whose submission never finished is bad input."""
    job = job_of(rec)
    if job.job_id is None:
        raise UsageError(f"run {rec.run_id} was never accepted by Slurm (no job id recorded)",
                         "start it again with `clusterddp up`")
    return job.job_id, posixpath.join(job.run_dir, node_script.CONTROL)


NodeStates = dict[str, tuple[NodeState, int | None, str | None]]


def _read(rec: RunRecord, login: Login, info: slurm.JobInfo | None, stopped: bool = False) -> NodeStates | RunOutcome:
    """What the shared folder says of each node after a look at the job: while it runs, the exit
    codes written so far; once Slurm says it ended, the outcome. Read before the record is locked
    (:func:`_seen` applies it), so no other launcher waits on this host's answers."""
    _, ctl = _job(rec)
    hosts = tuple(slurm.allocated(rec, info).hosts)
    if not (info is None or info.ended) and not stopped:
        codes = slurm.exit_codes(login, ctl, hosts)
        return {h: (NodeState.of_exit_code(c) if c is not None else NodeState.RUNNING, c, None)
                for h, (c, _) in codes.items()}
    return slurm.outcome(login, ctl, info, hosts, stopped)


def _seen(rec: RunRecord, info: slurm.JobInfo | None, found: NodeStates | RunOutcome,
          ends: Iterable[float] = (), now: datetime | None = None) -> RunRecord:
    """The record after a look at the job (:func:`_read`): its hosts once allocated, each node's
    state, and the run's status once Slurm says the job has ended. Its end: when the last node's exit
    code was written (``ends``, the files' times: a run looked at long after it ended records its own
    end, :func:`~clusterddp.record.ended_at`), else ``now`` (a stop, or no node wrote one)."""
    rec = slurm.allocated(rec, info)
    if not isinstance(found, RunOutcome):
        return rec.seen(found)
    hosts = set(rec.hosts)
    rec = rec.seen({h: v for h, v in slurm.node_states(found).items() if h in hosts})
    if rec.status is RunStatus.RUNNING:
        rec = replace(rec, status=found.status, failed_host=found.first_failed)
    known = [int(t) for t in ends if math.isfinite(t)]
    return replace(rec, ended_at=rec.ended_at or ended_at(rec.started_at, known, now or datetime.now(timezone.utc)))


def _status(store: RunStore, run_id: str, login: Login) -> RunRecord:
    rec = store.load(run_id)
    job_id, ctl = _job(rec)
    info = _info(store, rec, login, job_id)
    found = _read(rec, login, info)
    ends: list[float] = []
    if isinstance(found, RunOutcome) and rec.status is RunStatus.RUNNING:  # seen ending now: when did it?
        ends = [t for _, t in slurm.exit_codes(login, ctl, tuple(slurm.allocated(rec, info).hosts)).values()]
    return store.update(run_id, lambda r: _seen(r, info, found, ends))


def _info(store: RunStore, rec: RunRecord, login: Login, job_id: str) -> slurm.JobInfo | None:
    """:func:`job.job_info`; an answer refused cancels the job and fails a running run (:func:`job.refused`)."""
    try:
        return slurm.job_info(login, job_id)
    except SlurmAnswerError as e:
        if rec.status is not RunStatus.RUNNING:  # an ended run keeps its outcome; its job is not ours to end
            raise
        raise slurm.refused(login, store, rec.run_id, job_id, e) from None


def status(store: RunStore, run_id: str, on_node: Callable[[NodeRecord], None] | None = None) -> RunRecord:
    """Where the job stands (one look at Slurm and the shared folder); ``on_node`` gets each node once
    that look is recorded, before a failed run's diagnosis."""
    with _login(store.load(run_id)) as login:
        rec = _status(store, run_id, login)
        if on_node is not None:
            for n in rec.nodes:
                on_node(n)
        if rec.status is RunStatus.FAILED and rec.failure is None:  # e.g. a detached run: say why, once
            failure = slurm.diagnose(login, store, rec)
            rec = store.update(run_id, lambda r: r if r.failure else replace(r, failure=failure))
        return rec


def job_state(rec: RunRecord) -> str | None:
    """Slurm's word for the job now, with its reason while it pends (None when Slurm forgot it)."""
    job_id, _ = _job(rec)
    with _login(rec) as login:
        info = slurm.job_info(login, job_id)
    if info is None:
        return None
    return info.state.lower() + (f" ({info.reason})" if info.reason not in ("None", "") else "")


def stop(store: RunStore, run_id: str, grace: float = 0.0) -> Stopped:
    """scancel the job, wait until Slurm says it ended, mark the run stopped, collect its logs. First the
    stop mark is left in the run's control folder, so that a batch script that tells the run's end
    (a detached run with webhooks) tells it as stopped. ``grace`` is Slurm's own (its KillWait)."""
    rec = store.load(run_id)
    job_id, ctl = _job(rec)
    with _login(rec) as login:
        _mark_stop(login, rec, ctl)
        info = slurm.cancel(login, job_id)
        found = _read(rec, login, info, stopped=rec.status is RunStatus.RUNNING)
        rec = store.update(run_id, lambda r: _seen(r, info, found))
        logs = slurm.collect(login, store, run_id, job_of(rec).run_dir, ctl, tuple(rec.hosts), ())
    return Stopped(rec, {n.host: "cancelled by scancel" for n in rec.nodes}, (), [logs])


def _mark_stop(login: Login, rec: RunRecord, ctl: str) -> None:
    """Leave the stop mark (:func:`.commands.stop_mark_command`) where the shared folder is. Best effort:
    the job is cancelled all the same (its end is then told as failed, not stopped)."""
    try:
        t, _ = login.collect_host(job_of(rec).run_dir)
        t.run(slurm_commands.stop_mark_command(ctl, node_notify.STOP_MARK), timeout=30)
    except Exception:  # noqa: BLE001 - a stop goes on without its mark
        pass


def collect(store: RunStore, run_id: str, globs: tuple[str, ...] | None = None,
            progress: Progress | None = None) -> list[CollectResult]:
    """The logs and the run's collect globs (or ``globs`` instead) from the shared run folder (one
    copy, where the folder is: no ``progress`` by host to tell)."""
    rec = store.load(run_id)
    _, ctl = _job(rec)
    with _login(rec) as login:
        return [slurm.collect(login, store, run_id, job_of(rec).run_dir, ctl, tuple(rec.hosts),
                              rec.collect if globs is None else globs)]


def node_logs(store: RunStore, run_id: str, hosts: list[str] | None,
              show: Callable[[str, str, BinaryIO | None], None]) -> None:
    """:func:`clusterddp.backends.ssh.control.node_logs` for a Slurm run: each node's log from the shared folder
    (copied to the local copy in chunks, never held whole), else the local copy."""
    with _login(store.load(run_id)) as login:
        rec = _status(store, run_id, login)  # the hosts may have been allocated since the last look
        _, ctl = _job(rec)
        for h in rec.hosts:
            if hosts and h not in hosts:
                continue
            if store.read_only:  # the shared folder's copy as it is; the local one is kept
                try:
                    with login.open_file(slurm_plan.node_log(ctl, h)) as src:
                        show(h, "node", src)
                    continue
                except FileNotFoundError:
                    pass
            source = "node" if slurm.copy_log(login, store, run_id, h, slurm_plan.node_log(ctl, h)) else "local copy"
            try:
                with open(store.log_path(run_id, h), "rb") as f:
                    show(h, source, f)
            except FileNotFoundError:
                show(h, "missing", None)


def follow(store: RunStore, run_id: str, on_output: Callable[[str, bytes], None], hosts: list[str] | None,
           from_lines: dict[str, int]) -> dict[str, int | None]:
    """Stream each node's log from ``from_lines[host]`` until Slurm says the job ended; the exit codes."""
    rec = store.load(run_id)
    job_id, ctl = _job(rec)
    with _login(rec) as login:
        tail = slurm.LogTail(login, ctl, on_output, skip={h: n - 1 for h, n in from_lines.items()})
        while True:
            info = _info(store, rec, login, job_id)
            names = [h for h in (info.hosts if info and info.hosts else tuple(rec.hosts)) if not hosts or h in hosts]
            tail.poll(names)
            if info is None or info.ended:
                tail.poll(names)  # what the nodes wrote between the last read and the end
                codes = slurm.exit_codes(login, ctl, names)
                return {h: c for h, (c, _) in codes.items()}
            time.sleep(slurm.POLL)


# A job step's start (slurmctld, then the node's slurmd and slurmstepd) on a loaded cluster, on top of
# the node program's own bound: what a connect is to an SSH node.
STEP_START_S = 30.0


def stacks(store: RunStore, rec: RunRecord, wait: float) -> Taken:
    """`clusterddp stacks` of a Slurm run: the job looked at first (its hosts may have been allocated
    since the last look; an ended job is said so, exit 2), then on every node at once one job step
    (:func:`.commands.node_step_command`, beside the job's own) that runs the node program ``stacks``
    with the node's own control folder and marker, as node.sh set them. Each step is bounded; a node
    whose step did not answer, or answered something that is not the program's reply, is named."""
    from ... import stacks as stack_dumps
    from ...node import stacks as node_stacks
    from ...node.reply import ReplyError
    run_id = rec.run_id
    with _login(store.load(run_id)) as login:
        rec = _status(store, run_id, login)
        if rec.status is not RunStatus.RUNNING:
            raise stack_dumps.ended_error(rec)
        job_id, ctl = _job(rec)
        if not rec.nodes:
            raise UsageError(f"run {run_id}: slurm job {job_id} has not started yet: no rank runs",
                             f"`clusterddp status {run_id}` says when it starts")
        limit = STEP_START_S + stack_dumps.ANSWER_S + wait
        at = time.time()

        def one(n: NodeRecord) -> dict:
            command = stack_dumps.node_command(n.settings, slurm_plan.node_control(ctl, n.host), n.marker, wait)
            r = login.run(slurm_commands.node_step_command(job_id, n.host, command, limit, node_stacks.MOST_REPLY + 1),
                          timeout=limit + 2 * slurm_commands.STEP_KILL_AFTER)
            try:
                return node_stacks.parse_reply(r.stdout)
            except ReplyError as e:
                raise HostError(n.host, _step_failed(r.exit_code, r.stderr, limit, e)) from None
        answers = fan_out(rec.nodes, one, key=lambda n: n.host)
    return stack_dumps.taken_from(run_id, at, rec.hosts, answers)


def _step_failed(code: int, stderr: bytes, limit: float, e: Exception) -> str:
    """Why a node's step gave no reply: its bound, srun's own words (the last line), or the reply's fault."""
    if code == 124:
        return f"its job step did not answer within {limit:g}s"
    said = [ln for ln in stderr.decode("utf-8", "replace").strip().splitlines() if ln.strip()]
    if code != 0 and said:
        return f"its job step failed (exit {code}): {said[-1][:300]}"
    return f"no stacks reply from its job step (exit {code}): {e}"


# What one node's command may answer through its job step (`top`'s reply: a few KiB per job).
STEP_MOST_REPLY = 1 << 20


class StepTransport:
    """A :class:`~clusterddp.transport.Transport` to one node of a running Slurm job: each command runs
    as a job step there (:func:`.commands.node_step_command`, beside the job's own), through the login
    host; bounded by the command's timeout plus :data:`STEP_START_S`, its answer cut at
    :data:`STEP_MOST_REPLY` bytes. A step that failed without a word, or timed out, is a HostError."""

    def __init__(self, login: Login, job_id: str, host: str) -> None:
        self._login, self._job_id, self.name = login, job_id, host

    def run(self, command: str, *, timeout: float | None = None, stdin: Stdin = None) -> CommandResult:
        if stdin is not None:  # a step's standard input is none: nothing secret travels this way
            raise HostError(self.name, "a Slurm node's job step takes no standard input")
        limit = STEP_START_S + (timeout if timeout is not None else COMMAND_S)
        r = self._login.run(slurm_commands.node_step_command(self._job_id, self.name, command, limit, STEP_MOST_REPLY),
                            timeout=limit + 2 * slurm_commands.STEP_KILL_AFTER)
        if r.exit_code == 124 or (r.exit_code != 0 and not r.stdout):
            raise HostError(self.name, _step_failed(r.exit_code, r.stderr, limit, ValueError("no answer")))
        return r

    def stream(self, command: str, on_data: Callable[[bytes], None], *, timeout: float | None = None,
               stderr_to: bytearray | None = None, stdin: bytes | None = None) -> int:
        raise HostError(self.name, "a Slurm node's job step is not streamed")

    def ping(self) -> None:
        pass

    def close(self) -> None:
        pass


COMMAND_S = 60.0  # a node command's own bound when its verb gives none


class SlurmReach:
    """The :class:`~clusterddp.backends.base.Reach` of a running Slurm job: its allocated nodes, each with
    its own control folder in the shared one (as node.sh set it) and reached by a job step."""

    def __init__(self, login: Login, rec: RunRecord, job_id: str, nodes: tuple[NodeLaunch, ...]) -> None:
        self._login, self._job_id, self.nodes = login, job_id, nodes
        self.key = f"slurm {rec.run_id}"

    def connect(self, host: RunNode) -> Transport:
        return StepTransport(self._login, self._job_id, host.name)

    def close(self) -> None:
        self._login.close()


class FolderReach:
    """The :class:`~clusterddp.backends.base.Reach` of `prune` for a Slurm run: its one folder, in the
    shared dir, reached where that is (the login host), as ``<shared dir>/runs/<run id>``."""

    def __init__(self, login: Login, rec: RunRecord, run_dir: str) -> None:
        self._login = login
        self.key = f"slurm {rec.run_id}"
        self._t, where = login.collect_host(run_dir)
        host = replace(where, workdir=posixpath.dirname(posixpath.dirname(run_dir)))
        marker = rec.nodes[0].marker if rec.nodes else f"{rec.run_id}/"
        self.nodes = (
            NodeLaunch(host, 0, 1, run_dir, posixpath.join(run_dir, node_script.CONTROL), marker, (), (), ""),
        )

    def connect(self, host: RunNode) -> Transport:
        return self._t

    def close(self) -> None:
        self._login.close()


def _folder(rec: RunRecord) -> FolderReach:
    """A Slurm run's folder for `prune`; refused while Slurm still runs its job (whatever the record says)."""
    from ..base import cannot
    job = job_of(rec)
    login = open_login(job.login)
    try:
        if job.job_id is not None:
            info = slurm.job_info(login, job.job_id)
            if info is not None and not info.ended:
                raise cannot("slurm", "prune", rec, f"and its slurm job {job.job_id} is still "
                             f"{info.state.lower()}: its folder is in use",
                             f"`clusterddp stop {rec.run_id}` ends it; then prune again")
        return FolderReach(login, rec, job.run_dir)
    except BaseException:
        login.close()
        raise


def reach(rec: RunRecord, verb: str) -> SlurmReach | FolderReach:
    """The running job's nodes as Slurm allocated them (one look at the job; the record is not written).
    A run that was never submitted, has not started or has ended has no node to reach: refused,
    saying so (``verb`` names the command)."""
    from ..base import cannot
    if verb == "prune":  # its nodes keep nothing of it: its folder is one, in the shared dir
        return _folder(rec)
    job_id, ctl = _job(rec)
    login = open_login(job_of(rec).login)
    try:
        info = slurm.job_info(login, job_id)
        if rec.status is not RunStatus.RUNNING or info is None or info.ended:
            said = f"{info.state.lower()}" if info is not None else "no longer known to Slurm"
            raise cannot("slurm", verb, rec, f"and its slurm job {job_id} has ended ({said}): no node runs it",
                         f"`clusterddp status {rec.run_id}` and `clusterddp logs {rec.run_id}` read what it left")
        if not info.hosts:
            reason = f", {info.reason}" if info.reason not in ("None", "") else ""
            raise cannot("slurm", verb, rec, f"and its slurm job {job_id} has not started yet "
                         f"({info.state.lower()}{reason}): no node runs it",
                         f"`clusterddp status {rec.run_id}` says when it starts")
        now = slurm.allocated(rec, info)
        nodes = tuple(NodeLaunch(n.settings, n.node_rank, n.nproc, n.run_dir, slurm_plan.node_control(ctl, n.host),
                                   n.marker, (), (), "") for n in now.nodes)
    except BaseException:
        login.close()
        raise
    return SlurmReach(login, rec, job_id, nodes)


def check(inventory: Inventory, master_port: int | None = None) -> Report:
    """`clusterddp check` of a `slurm:` inventory (:func:`.check.run_slurm_checks`; Slurm chooses the port)."""
    from .check import run_slurm_checks
    return run_slurm_checks(inventory)


def describe(rec: RunRecord) -> str:
    """The line `status` adds of a Slurm run: its job, as Slurm sees it now."""
    job = job_of(rec)
    return f"slurm job {job.job_id}: {job_state(rec) or 'ended'}, partition {job.partition or '-'}"
