"""Runs of a `slurm:` inventory: stage, submit, follow, cancel; free of any printing.

Slurm allocates, starts and kills: clusterddp never signals a job's processes itself, it asks
``scancel``. Slurm's client commands run on the login host and the shared folder is read there,
through a :class:`.login.Login` (this machine, or a host reached over SSH): the
code is staged there, and each node's log and exit code (:mod:`.plan`) are read
from there while the job runs. The run record keeps the job id, its partition and the allocated
hosts once Slurm reports them, and the login host.
"""

from __future__ import annotations

import functools
import posixpath
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from ... import hang, postmortem, upload
from ... import nodescript as node_script
from ... import plan as ssh_plan
from ...artifacts import CollectResult
from ...envs.lock import Lock
from ...errors import HostError, NodeOutcome, SlurmAnswerError, SlurmError, UsageError
from ...failure import Failure
from ...inventory import Host, Inventory
from ...node import notify as node_notify
from ...record import NodeRecord, NodeState, RunRecord, RunStatus
from ...runspec import ResolvedSpec
from ...sizes import human_size
from ...store import RunStore, new_run_id, utcnow
from ...transport import Transport
from ...upload import SourceFolder
from .. import base, inventory_keys, lifecycle
from ..base import RunOutcome
from . import answers
from . import envs as slurm_envs
from . import plan as slurm_plan
from .jobpart import NodeSettings, SlurmJob, job_of, with_job
from .login import Login, open_login
from .section import SlurmSettings, settings_of

POLL = 0.5  # seconds between looks at the job; node logs are read as often
# How long the login host (or Slurm's controller) may stay out of reach while `up` follows a job
# before it stops following; the job itself goes on under Slurm either way.
FOLLOW_GRACE = 60.0
READ_CHUNK = 1 << 20  # bytes of a node log read at once (a log is never held whole)
# Slurm job states after which nothing of the job runs any more (COMPLETING: still cleaning up).
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
SHARED = "shared"  # the pseudo-host whose log is the batch step's output and whose artifacts come from the run folder


@dataclass(frozen=True)
class Prepared:
    plan: slurm_plan.SlurmPlan
    store: RunStore
    source_dir: Path
    login: Login
    lock: Lock | None = None    # `packages:` (slurm.packages or --packages), read as the run was planned
    shared_dir: str = ""        # slurm.shared_dir, as the run's folder is under it


@dataclass(frozen=True)
class JobInfo:
    """What ``scontrol show job`` says of a job."""

    job_id: str
    state: str                    # PENDING, RUNNING, COMPLETING, COMPLETED, FAILED, CANCELLED, ...
    reason: str                   # why it pends (Priority, Resources, PartitionDown...), or None
    partition: str | None
    hosts: tuple[str, ...]        # the allocation, once made
    restarts: int = 0

    @property
    def ended(self) -> bool:
        return self.state in ENDED


def checked(login: Login, args: list[str], timeout: float = 60) -> str:
    """A Slurm client command's output; SlurmError (naming the command and what it said) when it failed."""
    r = login.run(args, timeout)
    if r.exit_code != 0:
        said = r.stderr.decode(errors="replace").strip() or r.stdout.decode(errors="replace").strip()
        raise SlurmError(f"{' '.join(args[:2])} failed (exit {r.exit_code}): {said}")
    return r.text


def prepare(inventory: Inventory, spec: ResolvedSpec, runs_dir: str, script: Path, run_id: str | None = None,
            *, contact: bool = False, notify: bool = False) -> Prepared:
    """Plan the run; nothing written. A remote login host is asked for its home (where ``~`` in
    slurm.shared_dir is) only with ``contact``; otherwise (--dry-run, `schedule add`) the path is shown as written.
    ``notify``: the batch script tells the run's end (a detached run with webhooks: :func:`plan.notify_lines`)."""
    s = settings_of(inventory)
    login = open_login(s.login)
    base = login.shared_dir(s) if contact or login.host is None else s.shared_dir
    if re.search(r"[\s\x00-\x1f\x7f]", base):
        raise UsageError(f"{inventory.path}: slurm.shared_dir: {base!r} holds white space or a control character, "
                         "which #SBATCH lines cannot carry", "choose a folder whose path has none")
    store = RunStore(runs_dir)
    lock = slurm_envs.read_lock(s)  # a lock that is not one is refused (file and line) before anything starts
    plan = slurm_plan.build(inventory, spec, run_id or new_run_id(), base, notify=notify)
    return Prepared(plan, store, script.resolve().parent, login, lock, base)


def environment(prep: Prepared, say: Callable[[str], None]) -> Prepared:
    """`packages:`: the job's environment planned from the login host's look (:mod:`.envs`), the wheels
    the shared store lacks sent there, said; the run planned anew with its first step (the environment
    made ready on every node) and the environment's python."""
    if prep.lock is None:
        return prep
    plan, s = prep.plan, prep.plan.settings
    env = slurm_envs.prepare(prep.login, s, prep.shared_dir, prep.lock)
    say(f"[clusterddp] {env.says()}")
    if env.plan.missing:
        sent = slurm_envs.send(prep.login, s, prep.shared_dir, env)
        say(f"[clusterddp] environment {env.step.env_id}: sent {human_size(sent)} of wheels to the shared folder")
    return replace(prep, plan=slurm_plan.build(plan.inventory, plan.spec, plan.run_id, prep.shared_dir,
                                               notify=plan.notify, env=env.step))


def new_record(prep: Prepared, inventory_arg: str, schedule: str | None = None) -> RunRecord:
    plan = prep.plan
    return base.new_record(
        inventory_arg, plan.spec, plan.run_id, schedule=schedule, local=False, master_addr="",
        master_port=plan.spec.master_port or 29500, collect=plan.collect,
        backend=SlurmJob(run_dir=plan.run_dir, partition=plan.settings.partition,
                         nproc=slurm_plan.procs(plan.settings, plan.spec), login=prep.login.host,
                         node=NodeSettings.of(plan.settings, plan.env)).part())


def stage(prep: Prepared, folder: SourceFolder | None, notify_request: bytes | None = None) -> None:
    """Copy the script's folder (what the upload would send) into the run folder in the shared dir;
    write job.sbatch and node.sh (0600, in the 0700 control folder: node.sh holds the env values), and
    for a batch script that tells the run's end, the node program and ``notify_request`` (the webhook
    URLs: a secret, so 0600 too, and never on a command line: it travels inside the staged stream)."""
    plan = prep.plan
    private = {slurm_plan.BATCH: plan.batch_script, slurm_plan.NODE_SCRIPT: plan.node_script}
    if plan.env is not None:  # packages: the job's first step builds the environment with these
        private[slurm_plan.ENV_PROGRAM] = node_script.node_source("envbuild")
        private[slurm_plan.ENV_REQUEST] = plan.env.request
    if plan.notify and notify_request is not None:
        private[slurm_plan.NOTIFY_PROGRAM] = node_script.node_source("notify")
        private[node_notify.REQUEST] = notify_request.decode()
    prep.login.stage(plan.run_dir, plan.control_dir, folder, private)


def submit(prep: Prepared) -> str:
    """``sbatch --parsable``; the job id."""
    out = checked(prep.login, ["sbatch", "--parsable", prep.plan.batch_path]).strip()
    job_id = out.split(";")[0]
    if not re.fullmatch(r"[0-9]+(_[0-9]+)?", job_id):  # ASCII: \d would take Arabic-Indic digits
        raise SlurmError(f"sbatch --parsable answered {out[:200]!r}, not a job id")
    return job_id


def _hostnames(login: Login, nodelist: str) -> tuple[str, ...]:
    if not nodelist or nodelist == "(null)":
        return ()
    return answers.hostnames(checked(login, ["scontrol", "show", "hostnames", nodelist]), nodelist)


def job_info(login: Login, job_id: str) -> JobInfo | None:
    """The job as Slurm sees it, or None when Slurm no longer knows it (ended and purged)."""
    r = login.run(["scontrol", "-o", "show", "job", job_id])
    if r.exit_code != 0:
        said = r.stderr.decode(errors="replace")
        if "Invalid job id" in said:
            return None
        raise SlurmError(f"scontrol show job {job_id} failed (exit {r.exit_code}): {said.strip()}")
    fields = answers.job_fields(r.text, job_id)
    return JobInfo(job_id, fields["JobState"], fields.get("Reason", "None"), fields.get("Partition") or None,
                   _hostnames(login, fields.get("NodeList", "")), int(fields["Restarts"]))


def cancel(login: Login, job_id: str, timeout: float = 120) -> JobInfo | None:
    """``scancel`` the job and wait until Slurm says nothing of it runs any more."""
    checked(login, ["scancel", job_id])
    deadline = time.monotonic() + timeout
    while True:
        info = job_info(login, job_id)
        if info is None or info.ended:
            return info
        if time.monotonic() > deadline:
            raise SlurmError(f"job {job_id} still {info.state} {timeout:g}s after scancel",
                             f"check it with `squeue -j {job_id}`")
        time.sleep(POLL)


class LogTail:
    """Reads each node's log in the shared control folder from where it was left, a chunk at a time;
    ``skip`` lines of a host's log are passed over first (`logs -f` from a line on)."""

    def __init__(self, login: Login, control_dir: str, on_output: Callable[[str, bytes], None],
                 skip: dict[str, int] | None = None) -> None:
        self.login, self.control_dir, self.on_output = login, control_dir, on_output
        self.offsets: dict[str, int] = {}
        self.skip = dict(skip or {})

    def poll(self, hosts: tuple[str, ...] | list[str]) -> None:
        for h in hosts:
            path = slurm_plan.node_log(self.control_dir, h)
            while True:
                at = self.offsets.get(h, 0)
                data = self.login.read(path, at, READ_CHUNK)
                if not data:
                    break
                self.offsets[h] = at + len(data)
                while self.skip.get(h, 0) > 0 and data:
                    nl = data.find(b"\n")
                    if nl < 0:
                        data = b""
                        break
                    data = data[nl + 1:]
                    self.skip[h] -= 1
                if data:
                    self.on_output(h, data)
                if self.offsets[h] - at < READ_CHUNK:
                    break


def exit_codes(login: Login, control_dir: str, hosts: tuple[str, ...] | list[str]
               ) -> dict[str, tuple[int | None, float]]:
    """Each node's recorded exit code and when it was written (None, inf: none recorded)."""
    paths = {h: slurm_plan.exit_code_file(control_dir, h) for h in hosts}
    found = login.small_files(list(paths.values()))
    out: dict[str, tuple[int | None, float]] = {}
    for h, path in paths.items():
        text, mtime = found.get(path, ("", float("inf")))
        text = text.strip()  # what node.sh's `echo "$1"` wrote: ASCII digits (int() also reads "1_0", "٣")
        out[h] = (int(text), mtime) if re.fullmatch(r"-?[0-9]{1,10}", text) else (None, float("inf"))
    return out


def outcome(login: Login, control_dir: str, info: JobInfo | None, hosts: tuple[str, ...],
            stopped: bool) -> RunOutcome:
    """How the run ended: every node's exit code; the node whose failure came first failed, the others
    that ended badly after it were ended by Slurm (--kill-on-bad-exit) and count as stopped."""
    codes = exit_codes(login, control_dir, hosts)
    nodes = tuple(NodeOutcome(h, i, codes[h][0]) for i, h in enumerate(hosts))
    if stopped:
        return RunOutcome(RunStatus.STOPPED, nodes)
    if hosts and all(c == 0 for c, _ in codes.values()) and (info is None or info.state == "COMPLETED"):
        return RunOutcome(RunStatus.SUCCEEDED, nodes)
    bad = sorted((t, h) for h, (c, t) in codes.items() if c != 0)
    first = bad[0][1] if bad else None
    if not hosts and info is not None:
        nodes = (NodeOutcome(SHARED, 0, None, f"Slurm job {info.job_id} {info.state} ({info.reason})"),)
    return RunOutcome(RunStatus.FAILED, nodes, first)


def node_states(out: RunOutcome) -> dict[str, tuple[NodeState, int | None, str | None]]:
    states = {}
    for n in out.nodes:
        if out.status is RunStatus.STOPPED:
            state = NodeState.STOPPED
        elif out.first_failed and n.host != out.first_failed and n.exit_code != 0:
            state = NodeState.STOPPED
        else:
            state = NodeState.of_exit_code(n.exit_code)
        states[n.host] = (state, n.exit_code, n.error)
    return states


def allocated(rec: RunRecord, info: JobInfo | None, settings: SlurmSettings | None = None) -> RunRecord:
    """The record with what a look at the job says of its allocation: its hosts as nodes (once, with
    ``settings``' python and setup lines when the inventory is at hand, else those the record keeps
    for its nodes: a detached run learns its hosts from `status`; neutral ones for a record written
    before it kept them), the job's partition."""
    if info is None:
        return rec
    job = job_of(rec)
    nodes = rec.nodes
    if info.hosts and not nodes:
        run_dir = job.run_dir
        # the record's own (written as the run started: an environment's python and id) over the inventory's
        node = job.node or (NodeSettings.of(settings) if settings else NodeSettings("python3", shared_dir=run_dir))
        nodes = tuple(NodeRecord(host=h, address=h, node_rank=i, nproc=job.nproc, run_dir=run_dir,
                                 control_dir=posixpath.join(run_dir, node_script.CONTROL), marker=f"{rec.run_id}/{h}",
                                 settings=node.node(h), state=NodeState.RUNNING)
                      for i, h in enumerate(info.hosts))
    return with_job(replace(rec, nodes=nodes), replace(job, partition=info.partition or job.partition,
                                                       hosts=info.hosts or job.hosts))


def diagnose(login: Login, store: RunStore, rec: RunRecord) -> Failure:
    """Why a Slurm run failed, as for an SSH run (:mod:`clusterddp.postmortem`): the node program
    ``diagnose`` reads each node's own control folder in the shared folder (its ranks' error files,
    the end of its log) where that folder is, on the login host. The kernel log and nvidia-smi there
    are the login host's, not the node's: they are left out."""
    run_dir = job_of(rec).run_dir
    t, where = login.collect_host(run_dir)
    ctl = posixpath.join(run_dir, node_script.CONTROL)
    nodes = {n.host: ssh_plan.NodeLaunch(where, n.node_rank, n.nproc, run_dir, slurm_plan.node_control(ctl, n.host), "",
                                  (), (), "") for n in rec.nodes}
    # the stall watchdog ended it (a hang, with every rank's stacks its nodes took), or the idle policy
    # did (that, not the signal its ranks got)
    found = hang.failure_of(rec, store, _records(t, nodes))
    if found is not None:
        return found
    reports: dict[str, dict] = {}
    failed: dict[str, BaseException] = {}
    for n in rec.nodes:
        node = nodes[n.host]
        try:
            rep = postmortem.report(t, node)
        except Exception as e:  # noqa: BLE001 - a node that cannot be asked is named in the summary
            failed[n.host] = e
            continue
        reports[n.host] = {**rep, "kernel_lines": [], "nvidia_smi": None,
                           "kernel_error": "not read: a Slurm node's kernel log is not reachable from the login host"}
    return postmortem.explain_reports(rec, store, reports, failed)


def _records(t: Transport, nodes: dict[str, ssh_plan.NodeLaunch]) -> dict[str, hang.NodeRecords]:
    """Each node's hang and idle records (:func:`clusterddp.hang.read_one`: one command a node), read in its
    own control folder in the shared folder; a node whose folder cannot be read is left out."""
    out = {}
    for host, node in nodes.items():
        try:
            out[host] = hang.read_one(t, host, node)
        except Exception:  # noqa: BLE001 - no record read there: told as the others are
            continue
    return out


def explain(login: Login, store: RunStore, run_id: str) -> tuple[str, ...]:
    """:func:`diagnose`, recorded in run.json's ``failure``, as the summary's lines; when it cannot be
    worked out, a line saying why (the exit codes still say what they say)."""
    try:
        failure = diagnose(login, store, store.load(run_id))
        store.update(run_id, lambda rec: replace(rec, failure=failure))
    except Exception as e:  # noqa: BLE001 - a diagnosis that fails must not hide the run's own failure
        return (f"(the root cause could not be worked out: {type(e).__name__}: {e})",)
    return tuple(failure.lines())


def collect(login: Login, store: RunStore, run_id: str, run_dir: str, control_dir: str, hosts: tuple[str, ...],
            globs: tuple[str, ...]) -> CollectResult:
    """Every node's log, and the batch step's output and the collect globs from the shared run folder
    (through the same node program as SSH runs, run where the folder is) into ``artifacts/shared/``."""
    from ...artifacts import collect_node
    t, host = login.collect_host(run_dir)
    for h in hosts:
        copy_log(login, store, run_id, h, slurm_plan.node_log(control_dir, h))
        copy_samples(t, store, run_id, h, slurm_plan.node_control(control_dir, h))
        copy_where(t, store, run_id, h, slurm_plan.node_control(control_dir, h))
    # collect_command reads <control_dir>/node.log: the batch step's output (plan.BATCH_LOG)
    node = ssh_plan.NodeLaunch(host, 0, 1, run_dir, control_dir, "", (), (), "")
    return collect_node(t, node, store, run_id, globs)


def copy_samples(t: Transport, store: RunStore, run_id: str, host: str, node_ctl: str) -> None:
    """The metrics sampler's files of ``host`` (clusterddp.metrics), its last attempt's and the earlier
    attempts' it ran (``<host>@attempt-N/``: :func:`SP.keep_samples_lines`), from the shared folder where
    it is, bounded, as an SSH node's come back; none: nothing."""
    from ...metrics.fetch import ANSWER_MOST
    from ...metrics.samples import fetch_command, save, split_answer
    buf = bytearray()

    def take(b: bytes) -> None:
        if len(buf) < ANSWER_MOST:
            buf.extend(b[:ANSWER_MOST - len(buf)])
    try:
        t.stream(fetch_command(node_ctl), take, timeout=60, stderr_to=bytearray())
    except Exception:  # noqa: BLE001 - the samples are best effort: the logs and the outcome stand without them
        return
    files = split_answer(bytes(buf), host)
    if files and not store.read_only:
        save(store.run_dir(run_id), host, files)


def copy_where(t: Transport, store: RunStore, run_id: str, host: str, node_ctl: str) -> None:
    """The rank sampler's file of ``host`` (clusterddp.stragglers), from the shared folder where it is, bounded,
    as an SSH node's comes back (``<run>/where/<host>/where.jsonl``); none: nothing."""
    from ...nodescript import WHERE_SAMPLES
    from ...stragglers import MOST_FILE, WHERE_DIR, fetch_command
    try:
        data = t.run(fetch_command(node_ctl), timeout=60).stdout[:MOST_FILE]
    except Exception:  # noqa: BLE001 - the samples are best effort: the logs and the outcome stand without them
        return
    if data and not store.read_only:
        store.write_evidence(run_id, WHERE_DIR, host, WHERE_SAMPLES, data)


def copy_log(login: Login, store: RunStore, run_id: str, host: str, path: str) -> bool:
    """Replace the local copy of ``host``'s log with the shared folder's (in chunks); False when there is none."""
    try:
        with login.open_file(path) as src:
            if not store.read_only:  # a read-only store keeps the old copy
                with store.log_writer(run_id, host) as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
        return True
    except FileNotFoundError:
        return False


@contextmanager
def _interrupts_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait until the block ends, then raise KeyboardInterrupt: a job sbatch
    accepted is recorded before `up` can be interrupted, so an interruption always cancels it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def hold(signum: int, frame: object) -> None:
        got.append(signum)
    old = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if got:
        raise KeyboardInterrupt


def refused(login: Login, store: RunStore, run_id: str, job_id: str, e: SlurmAnswerError,
            runs_dir_flag: str = "") -> SlurmError:
    """After Slurm gave an answer that is refused: the job is cancelled (scancel, not waited for: the
    next look could be refused too) and the run recorded failed, never left `running` for a job
    clusterddp can no longer follow. The error to raise: the refusal, and what became of the job."""
    try:
        checked(login, ["scancel", job_id])
        fate = f"Slurm job {job_id} was cancelled"
    except (HostError, SlurmError) as c:
        fate = f"Slurm job {job_id} could not be cancelled ({c.message}): cancel it with `scancel {job_id}`"
    base.failed_run(store, run_id)
    return SlurmAnswerError(e.message, f"{fate} and run {run_id} recorded failed; {e.hint}" if e.hint
                            else f"{fate} and run {run_id} recorded failed")


def _still_running(e: HostError | SlurmError, run_id: str, job_id: str, runs_dir_flag: str, *,
                   cancel_failed: bool) -> HostError | SlurmError:
    """``e``, from the login host or Slurm, after which `up` stops following the job (or could not
    cancel it: ``cancel_failed``), with a hint that says the job may go on and how to reach it."""
    rd = runs_dir_flag
    if not cancel_failed:
        hint = (f"Slurm job {job_id} goes on without this launcher: `clusterddp status {run_id}{rd}` and "
                f"`clusterddp logs -f {run_id}{rd}` follow it once the login host answers, "
                f"`clusterddp stop {run_id}{rd}` ends it")
    else:
        hint = (f"Slurm job {job_id} may still be running: it was not cancelled. `clusterddp stop {run_id}{rd}` "
                f"cancels it once the login host answers (`clusterddp status {run_id}{rd}` shows it)")
    if isinstance(e, HostError):
        return HostError(e.host, e.detail, hint, kind=e.kind)
    return SlurmError(e.message, hint)


def execute(prep: Prepared, on_output: Callable[[str, bytes], None], *, detach: bool = False,
            on_state: Callable[[JobInfo], None] = lambda i: None,
            on_collect: Callable[[CollectResult], None] = lambda r: None,
            folder: SourceFolder | None = None, on_note: Callable[[str], None] = lambda s: None,
            grace: float = FOLLOW_GRACE, runs_dir_flag: str = "",
            notify_request: bytes | None = None) -> RunOutcome | None:
    """Stage, submit and (unless ``detach``) follow the job to its end, collect and record the outcome.

    Raises RunFailed (exit 1) when the job failed, KeyboardInterrupt after a Ctrl-C (the job
    cancelled and gone first). A login host or Slurm out of reach while following is asked again
    (a new connection each time, ``on_note`` told once) for ``grace`` seconds; then the error is
    raised with a hint saying the job goes on and how to follow or stop it (``runs_dir_flag``: the
    ``--runs-dir`` those commands need, if any), the run left running. A Ctrl-C whose scancel cannot
    reach Slurm says likewise that the job was not cancelled."""
    plan, store, login = prep.plan, prep.store, prep.login
    run_id = plan.run_id
    job_id: str | None = None
    interrupted = False
    try:
        stage(prep, folder, notify_request)
        with _interrupts_held():
            job_id = submit(prep)
            store.update(run_id, lambda rec: with_job(rec, replace(job_of(rec), job_id=job_id)))
    except KeyboardInterrupt:
        if job_id is None:  # interrupted before sbatch: nothing to cancel
            store.update(run_id, lambda rec: replace(rec, status=RunStatus.STOPPED, ended_at=utcnow()))
            raise
        interrupted = True  # while sbatch answered: the job is recorded, and cancelled below
    except BaseException:  # nothing was submitted: the run ends here, not `running` forever
        base.failed_run(store, run_id)
        raise
    if detach and not interrupted:
        return None
    assert job_id is not None

    def output(host: str, data: bytes) -> None:
        store.append_log(run_id, host, data)
        on_output(host, data)
    tail = LogTail(login, plan.control_dir, output)
    hosts: tuple[str, ...] = ()
    last: tuple[str, str] | None = None
    info: JobInfo | None = None
    stopped = False
    try:
        try:
            if interrupted:
                raise KeyboardInterrupt
            lost_since: float | None = None
            while True:
                try:
                    info = job_info(login, job_id)
                    if info is not None and info.hosts and not hosts:
                        hosts = info.hosts
                        store.update(run_id, functools.partial(allocated, info=info, settings=plan.settings))
                    tail.poll(hosts)
                except SlurmAnswerError as e:
                    raise refused(login, store, run_id, job_id, e, runs_dir_flag) from None
                except (HostError, SlurmError) as e:
                    login.close()  # the next look opens a new connection
                    if lost_since is None:
                        lost_since = time.monotonic()
                        on_note(f"{e.message}; asking again for {grace:g} s (the job goes on meanwhile)")
                    elif time.monotonic() - lost_since > grace:
                        raise _still_running(e, run_id, job_id, runs_dir_flag, cancel_failed=False) from None
                    time.sleep(POLL)
                    continue
                if lost_since is not None:
                    lost_since = None
                    on_note(f"{login.name}: answering again")
                if info is None:
                    break
                if (info.state, info.reason) != last:
                    last = (info.state, info.reason)
                    on_state(info)
                if info.ended:
                    break
                time.sleep(POLL)
        except KeyboardInterrupt:
            stopped = True
            try:
                info = cancel(login, job_id)
            except (HostError, SlurmError) as e:
                raise _still_running(e, run_id, job_id, runs_dir_flag, cancel_failed=True) from None
            if info is not None and info.hosts and not hosts:
                hosts = info.hosts
        tail.poll(hosts)
        result = outcome(login, plan.control_dir, info, hosts, stopped)
        return lifecycle.end(
            store, run_id, result, stopped=stopped, warn=on_note, states=lambda: node_states(result),
            collect=lambda: on_collect(collect(login, store, run_id, plan.run_dir, plan.control_dir, hosts,
                                               plan.collect)),
            explain=lambda: explain(login, store, run_id))
    finally:
        store.close_logs()


def prepare_request(req: base.LaunchRequest, *, contact: bool = False) -> Prepared:
    """:func:`prepare` from `up`'s request: Slurm picks the hosts, so --hosts and --exclude are refused."""
    if req.hosts is not None:
        raise UsageError("--hosts does not apply to a `slurm:` inventory: Slurm chooses the hosts",
                         "set slurm.nodes (and slurm.constraint, or `sbatch` options) in the inventory")
    if req.exclude:
        raise UsageError("--exclude: a `slurm:` inventory lists no hosts; Slurm picks them",
                         "leave --exclude out (Slurm's own --exclude goes in the inventory's `sbatch:` list)")
    s = settings_of(req.inventory)
    if req.spec.stall_timeout and s.nodes[0] != s.nodes[1]:
        raise UsageError(f"--stall-timeout: slurm.nodes is a range ({s.nodes[0]}-{s.nodes[1]}); the stall watchdog "
                         "needs to know how many nodes watch", "give slurm.nodes one number, or leave the stall "
                         "timeout off for this run (--stall-timeout 0)")
    return prepare(req.inventory, req.spec, req.runs_dir, base.check_script(req.spec.script), contact=contact,
                   notify=req.detach and bool(_webhooks(req)))


def _webhooks(req: base.LaunchRequest) -> list:
    """The targets the batch script of a detached run tells (webhooks; a command is the launcher's)."""
    from ... import notify
    return notify.from_node(req.notify)[0]


def scan(prep: Prepared, req: base.LaunchRequest) -> SourceFolder:
    login = settings_of(req.inventory).login
    secrets = upload.secret_files(req.inventory, req.notify, req.env_files,
                                  hosts=(login,) if isinstance(login, Host) else ())
    folder = upload.scan(prep.source_dir, prep.store.root, secrets, inventory_keys=inventory_keys())
    upload.check_upload_size(folder, req.max_upload)
    return folder


def render(prep: Prepared, req: base.LaunchRequest, full: bool = True) -> str:
    """The dry-run text: the plan (:func:`plan.render`; not ``full``: :func:`plan.summary`), where it
    would be submitted, what it uploads and leaves out."""
    out = [f"run {prep.plan.run_id}", slurm_plan.render(prep.plan) if full else slurm_plan.summary(prep.plan)]
    if prep.lock is not None:
        out.append(f"packages: {prep.lock.path}: a first step of the job makes its environment ready on every node; "
                   "its id and python are known once the login host is asked (`up`, `check`), not by --dry-run")
    if prep.login.host is not None:
        out.append(f"login host: {prep.login.name} over SSH (not contacted by --dry-run; ~ is the home there)")
    return "\n".join([*out, *scan(prep, req).described()])


def job_line(info: JobInfo) -> str:
    """How `up` says what Slurm says of the job (its state, why it pends, where it runs)."""
    where = f" on {','.join(info.hosts)}" if info.hosts else ""
    why = f" ({info.reason})" if info.reason not in ("None", "") else ""
    return f"slurm job {info.job_id} {info.state.lower()}{why}{where}"


def _notify_request(prep: Prepared, req: base.LaunchRequest, events: base.Events) -> bytes | None:
    """A detached run with notification targets: the request its batch script reads (the webhooks;
    node 0's host is filled in there), and a warning for each command target, which only an attached
    launcher tells. None when the batch script tells nothing."""
    if not req.detach or not req.notify:
        return None
    from ... import notify
    webhooks, launcher_only = notify.from_node(req.notify)
    for line in notify.not_told_detached(launcher_only):
        events.warn(line)
    if not webhooks or not prep.plan.notify:
        return None
    return notify.node_request(prep.store.load(prep.plan.run_id), "", webhooks)


class SlurmLaunch(lifecycle.Launch[Prepared]):
    """The whole `up` of a Slurm run, as :class:`.lifecycle.Launch` runs it: the upload scanned, the
    run recorded, then :func:`execute` (stage, submit, follow or detach, then :func:`.lifecycle.end`),
    the job's states said as Slurm reports them; the login host's connection closed last."""

    def __init__(self, prep: Prepared, req: base.LaunchRequest, events: base.Events) -> None:
        super().__init__(prep, req, events)
        self.folder: SourceFolder | None = None  # what the upload sends
        self.request: bytes | None = None        # a detached run's notification request (the batch script's)

    def ready(self) -> None:
        self.folder = scan(self.prep, self.req)
        self.prep = environment(self.prep, self.events.warn)

    def first_record(self) -> RunRecord:
        return new_record(self.prep, self.req.inventory_arg, schedule=self.req.schedule)

    def begin(self) -> None:
        assert self.folder is not None  # ready scanned it
        for line in self.folder.report():
            self.events.say(line)
        self.request = _notify_request(self.prep, self.req, self.events)

    def execute(self) -> RunOutcome | None:
        events, req = self.events, self.req

        def on_state(info: JobInfo) -> None:
            events.say(job_line(info))
            if info.hosts:
                events.hosts(info.hosts)
        result = execute(self.prep, events.output, detach=req.detach, on_state=on_state, folder=self.folder,
                         on_collect=lambda r: events.collected(r, "the run folder"), on_note=events.warn,
                         runs_dir_flag=req.runs_dir_flag, notify_request=self.request)
        if req.detach and self.request is not None:
            from ... import notify
            events.say("notify: the batch script, on the job's first node (node 0), tells this run's end to "
                       + ", ".join(notify.label(t) for t in _webhooks(req)))
        return result

    def detached_job(self) -> str:
        rec = self.prep.store.load(self.run_id)
        return f"slurm job {job_of(rec).job_id or '?'}"

    def release(self) -> None:
        self.prep.login.close()
