"""Runs of a `slurm:` inventory: stage, submit, follow, cancel; free of any printing.

Slurm allocates, starts and kills: clusterddp never signals a job's processes itself, it asks
``scancel``. Slurm's client commands run on this machine (``login: local``), and the shared
folder is read directly: the code is staged there, and each node's log and exit code
(:mod:`clusterddp.slurm_plan`) are read from there while the job runs. The run record keeps the
job id, its partition and the allocated hosts once Slurm reports them.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

from . import plan as P
from . import slurm_plan as SP
from .artifacts import CollectResult
from .errors import NodeOutcome, RunFailed, SlurmError, UsageError
from .inventory import Inventory
from .jobs import SourceFolder
from .record import NodeRecord, NodeState, RunRecord, RunStatus, SlurmJob
from .store import RunStore, new_run_id, utcnow
from .supervisor import RunOutcome

LOGIN = "slurm"  # how errors name the place Slurm's commands run
POLL = 0.5  # seconds between looks at the job; node logs are read as often
# Slurm job states after which nothing of the job runs any more (COMPLETING: still cleaning up).
ENDED = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "OUT_OF_MEMORY",
                   "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT", "REVOKED"})
SHARED = "shared"  # the pseudo-host whose log is the batch step's output and whose artifacts come from the run folder


@dataclass(frozen=True)
class Prepared:
    plan: SP.SlurmPlan
    store: RunStore
    source_dir: Path


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


def run_cmd(args: list[str], timeout: float = 60, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    """A Slurm client command on the login host; raises :class:`SlurmError` when it cannot run."""
    try:
        return subprocess.run(args, input=stdin, capture_output=True, timeout=timeout)
    except FileNotFoundError:
        raise SlurmError(f"{args[0]}: not found on this machine",
                         "run clusterddp on a Slurm login host (slurm-client installed)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(args[:3])} did not answer within {timeout:g}s",
                         "is slurmctld up? try `sinfo`") from None


def checked(args: list[str], timeout: float = 60) -> str:
    r = run_cmd(args, timeout)
    if r.returncode != 0:
        said = r.stderr.decode(errors="replace").strip() or r.stdout.decode(errors="replace").strip()
        raise SlurmError(f"{' '.join(args[:2])} failed (exit {r.returncode}): {said}")
    return r.stdout.decode(errors="replace")


def shared_dir(inventory: Inventory) -> str:
    assert inventory.slurm is not None
    return os.path.abspath(os.path.expanduser(inventory.slurm.shared_dir))


def prepare(inventory: Inventory, spec: P.RunSpec, runs_dir: str, script: Path, run_id: str | None = None) -> Prepared:
    """Plan the run (no network, nothing written)."""
    base = shared_dir(inventory)
    if re.search(r"[\s\x00-\x1f\x7f]", base):
        raise UsageError(f"{inventory.path}: slurm.shared_dir: {base!r} holds white space or a control character, "
                         "which #SBATCH lines cannot carry", "choose a folder whose path has none")
    store = RunStore(runs_dir)
    plan = SP.build(inventory, spec, run_id or new_run_id(), base)
    return Prepared(plan, store, script.resolve().parent)


def new_record(prep: Prepared, inventory_arg: str, schedule: str | None = None) -> RunRecord:
    plan = prep.plan
    return RunRecord(
        run_id=plan.run_id, name=plan.spec.name, inventory=str(Path(inventory_arg).resolve()),
        script=plan.spec.script, args=tuple(plan.spec.script_args), status=RunStatus.RUNNING, failed_host=None,
        schedule=schedule, local=False, started_at=utcnow(), ended_at=None, launch_dir=os.getcwd(),
        master_addr="", master_port=plan.spec.master_port or 29500, collect=plan.collect, nodes=(),
        slurm=SlurmJob(run_dir=plan.run_dir, partition=plan.settings.partition,
                       nproc=plan.spec.gpus or plan.settings.gpus_per_node))


def stage(prep: Prepared, folder: SourceFolder | None) -> None:
    """Copy the script's folder (what the upload would send) into the run folder in the shared dir;
    write job.sbatch and node.sh (0600, in the 0700 control folder: node.sh holds the env values)."""
    plan = prep.plan
    ctl = Path(plan.control_dir)
    try:
        if ctl.exists():
            raise UsageError(f"{plan.run_dir} already holds a run", "use another run id")
        ctl.mkdir(parents=True, mode=0o700)
        ctl.chmod(0o700)
        (ctl / SP.NODES).mkdir(mode=0o700)
        for rel, _ in folder.entries if folder else ():
            assert folder is not None
            src, dst = folder.root / rel.rstrip("/"), Path(plan.run_dir) / rel.rstrip("/")
            if rel.endswith("/"):
                dst.mkdir(exist_ok=True)
            elif src.is_symlink():  # sent as a link, never followed, as the SSH upload does
                dst.symlink_to(os.readlink(src))
            else:
                shutil.copy2(src, dst)
        for path, text in ((plan.batch_path, plan.batch_script), (plan.node_script_path, plan.node_script)):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(text)
    except OSError as e:
        raise UsageError(f"cannot stage the run in {plan.run_dir}: {e}",
                         "slurm.shared_dir must be a folder this machine can write") from None


def submit(prep: Prepared) -> str:
    """``sbatch --parsable``; the job id."""
    out = checked(["sbatch", "--parsable", prep.plan.batch_path]).strip()
    job_id = out.split(";")[0]
    if not re.fullmatch(r"\d+(_\d+)?", job_id):
        raise SlurmError(f"sbatch --parsable answered {out[:200]!r}, not a job id")
    return job_id


def _hostnames(nodelist: str) -> tuple[str, ...]:
    if not nodelist or nodelist == "(null)":
        return ()
    return tuple(checked(["scontrol", "show", "hostnames", nodelist]).split())


def job_info(job_id: str) -> JobInfo | None:
    """The job as Slurm sees it, or None when Slurm no longer knows it (ended and purged)."""
    r = run_cmd(["scontrol", "-o", "show", "job", job_id])
    if r.returncode != 0:
        said = r.stderr.decode(errors="replace")
        if "Invalid job id" in said:
            return None
        raise SlurmError(f"scontrol show job {job_id} failed (exit {r.returncode}): {said.strip()}")
    fields = dict(re.findall(r"(\w+)=(\S*)", r.stdout.decode(errors="replace")))
    return JobInfo(job_id, fields.get("JobState", "UNKNOWN"), fields.get("Reason", "None"),
                   fields.get("Partition") or None, _hostnames(fields.get("NodeList", "")),
                   int(fields.get("Restarts", "0") or 0))


def cancel(job_id: str, timeout: float = 120) -> JobInfo | None:
    """``scancel`` the job and wait until Slurm says nothing of it runs any more."""
    checked(["scancel", job_id])
    deadline = time.monotonic() + timeout
    while True:
        info = job_info(job_id)
        if info is None or info.ended:
            return info
        if time.monotonic() > deadline:
            raise SlurmError(f"job {job_id} still {info.state} {timeout:g}s after scancel",
                             f"check it with `squeue -j {job_id}`")
        time.sleep(POLL)


class LogTail:
    """Reads each node's log in the shared control folder from where it was left."""

    def __init__(self, plan: SP.SlurmPlan, on_output: Callable[[str, bytes], None]) -> None:
        self.plan, self.on_output = plan, on_output
        self.offsets: dict[str, int] = {}

    def poll(self, hosts: tuple[str, ...]) -> None:
        for h in hosts:
            try:
                with open(self.plan.node_log(h), "rb") as f:
                    f.seek(self.offsets.get(h, 0))
                    data = f.read()
            except FileNotFoundError:
                continue
            if data:
                self.offsets[h] = self.offsets.get(h, 0) + len(data)
                self.on_output(h, data)


def exit_codes(control_dir: str, hosts: tuple[str, ...]) -> dict[str, tuple[int | None, float]]:
    """Each node's recorded exit code and when it was written (None, inf: none recorded)."""
    out: dict[str, tuple[int | None, float]] = {}
    for h in hosts:
        path = os.path.join(control_dir, SP.NODES, f"{h}.exit_code")
        try:
            out[h] = (int(Path(path).read_text().strip()), os.stat(path).st_mtime)
        except (OSError, ValueError):
            out[h] = (None, float("inf"))
    return out


def outcome(control_dir: str, info: JobInfo | None, hosts: tuple[str, ...], stopped: bool) -> RunOutcome:
    """How the run ended: every node's exit code; the node whose failure came first failed, the others
    that ended badly after it were ended by Slurm (--kill-on-bad-exit) and count as stopped."""
    codes = exit_codes(control_dir, hosts)
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


def with_hosts(rec: RunRecord, plan: SP.SlurmPlan, info: JobInfo) -> RunRecord:
    """The record once Slurm allocated the job: its hosts as nodes, the job's partition."""
    assert rec.slurm is not None
    nodes = rec.nodes
    if info.hosts and not nodes:
        nproc = plan.spec.gpus or plan.settings.gpus_per_node
        nodes = tuple(NodeRecord(host=h, address=h, node_rank=i, nproc=nproc, run_dir=plan.run_dir,
                                 control_dir=plan.control_dir, marker=f"{plan.run_id}/{h}",
                                 settings=SP.node_host(plan.settings, h), state=NodeState.RUNNING)
                      for i, h in enumerate(info.hosts))
    return replace(rec, nodes=nodes, slurm=replace(rec.slurm, job_id=info.job_id,
                                                   partition=info.partition or rec.slurm.partition,
                                                   hosts=info.hosts or rec.slurm.hosts))


def finish(store: RunStore, run_id: str, out: RunOutcome) -> RunStatus:
    def ended(rec: RunRecord) -> RunRecord:
        rec = rec.seen(node_states(out))
        if rec.status is RunStatus.STOPPED:  # `clusterddp stop` from another terminal
            return replace(rec, ended_at=rec.ended_at or utcnow())
        return replace(rec, status=out.status, failed_host=out.first_failed, ended_at=utcnow())
    return store.update(run_id, ended).status


def collect(store: RunStore, run_id: str, run_dir: str, control_dir: str, hosts: tuple[str, ...],
            globs: tuple[str, ...]) -> CollectResult:
    """Every node's log, and the batch step's output and the collect globs from the shared run folder
    (through the same node program as SSH runs, run here: the folder is local) into ``artifacts/shared/``."""
    from .artifacts import collect_node
    from .inventory import Host
    from .transport.base import Transport
    from .transport.local import LocalTransport
    for h in hosts:
        try:
            store.copy_log(run_id, h, Path(control_dir, SP.NODES, f"{h}.log"))
        except FileNotFoundError:
            pass
    host = Host(name=SHARED, address=SHARED, user=None, port=None, identity_file=None, known_hosts="",
                host_key_policy="strict", gpus=1, python=sys.executable, workdir=run_dir, env=(), setup=(),
                connect_timeout=10.0, transport="local")
    # collect_command reads <control_dir>/node.log: the batch step's output (slurm_plan.BATCH_LOG)
    node = P.NodeLaunch(host, 0, 1, run_dir, control_dir, "", (), (), "")
    t = LocalTransport(SHARED)
    try:
        return collect_node(cast(Transport, t), node, store, run_id, globs)
    finally:
        t.close()


def execute(prep: Prepared, on_output: Callable[[str, bytes], None], *, detach: bool = False,
            on_state: Callable[[JobInfo], None] = lambda i: None,
            on_collect: Callable[[CollectResult], None] = lambda r: None,
            folder: SourceFolder | None = None) -> RunOutcome | None:
    """Stage, submit and (unless ``detach``) follow the job to its end, collect and record the outcome.

    Raises RunFailed (exit 1) when the job failed, KeyboardInterrupt after a Ctrl-C (the job
    cancelled and gone first)."""
    plan, store = prep.plan, prep.store
    run_id = plan.run_id
    try:
        stage(prep, folder)
        job_id = submit(prep)
    except (SlurmError, UsageError):  # nothing was submitted: the run ends here, not `running` forever
        store.update(run_id, lambda rec: replace(rec, status=RunStatus.FAILED, ended_at=utcnow()))
        raise
    store.update(run_id, lambda rec: replace(rec, slurm=replace(rec.slurm, job_id=job_id) if rec.slurm else None))
    if detach:
        return None

    def output(host: str, data: bytes) -> None:
        store.append_log(run_id, host, data)
        on_output(host, data)
    tail = LogTail(plan, output)
    hosts: tuple[str, ...] = ()
    last: tuple[str, str] | None = None
    info: JobInfo | None = None
    stopped = False
    try:
        try:
            while True:
                info = job_info(job_id)
                if info is None:
                    break
                if (info.state, info.reason) != last:
                    last = (info.state, info.reason)
                    on_state(info)
                if info.hosts and not hosts:
                    hosts = info.hosts
                    store.update(run_id, functools.partial(with_hosts, plan=plan, info=info))
                tail.poll(hosts)
                if info.ended:
                    break
                time.sleep(POLL)
        except KeyboardInterrupt:
            stopped = True
            info = cancel(job_id)
            if info is not None and info.hosts and not hosts:
                hosts = info.hosts
        tail.poll(hosts)
        store.close_logs()
        result = outcome(plan.control_dir, info, hosts, stopped)
        on_collect(collect(store, run_id, plan.run_dir, plan.control_dir, hosts, plan.collect))
        status = finish(store, run_id, result)
        if stopped:
            raise KeyboardInterrupt
        if status is not RunStatus.SUCCEEDED:
            raise RunFailed(run_id, list(result.nodes), result.first_failed, status)
        return result
    finally:
        store.close_logs()
