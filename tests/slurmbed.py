"""A real Slurm cluster on the test bed's network-namespace nodes, for integration tests.

On top of a started :class:`testbed.TestBed`: one ``munged`` on the host (its own socket and key,
so parallel sessions never share one), ``slurmctld`` listening on the bed's bridge address, and one
``slurmd -N node-<i>`` per namespace under ``unshare --uts`` (hostname ``node-<i>``). Everything
lives in the bed's folder (config, state, spool, logs) and every port comes from the bed's slot, so
several test sessions run their own clusters side by side. Clients (``sbatch``, ``squeue``, ...)
find this cluster through ``SLURM_CONF`` (:meth:`SlurmBed.env`).

Facts this rests on (Slurm 22.05, Debian 12): slurmd needs a ``cgroup.conf`` with
``IgnoreSystemd=yes`` even with proctrack/linuxproc and task/none ("Unable to initialize cgroup
plugin" otherwise); node hostnames do not resolve on the nodes, so nodes are reached by
``NodeAddr`` and torchrun must be given addresses.

Needs root and ``slurmctld slurmd slurm-client munge`` (scripts/install-system-deps.sh).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from testbed import SLOT_DIR, TestBed, _tail

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
PORT_BASE = 17000  # slot k uses ports PORT_BASE + 10k .. +1 (slurmctld, slurmd); srun picks from SrunPortRange
SRUN_PORT_BASE = 40000  # slot k: 40000 + 200k .. +199
NODE_CPUS = 4  # declared per node (config_overrides): room for a couple of jobs at once
START_TIMEOUT = 60.0


def missing_slurm() -> str | None:
    """Why a SlurmBed cannot run here, or None if it can."""
    missing = [p for p in (MUNGED, SLURMCTLD, SLURMD) if not os.access(p, os.X_OK)]
    missing += [t for t in ("sbatch", "squeue", "scancel", "sinfo", "scontrol", "srun") if shutil.which(t) is None]
    if missing:
        return f"missing {', '.join(missing)}; run scripts/install-system-deps.sh"
    return None


def _start_time(pid: int) -> str:
    """A process's start time (``/proc/PID/stat`` field 22), "" once it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return ""
    return "" if fields[0] in ("Z", "X") else fields[19]


class SlurmBed:
    """Slurm on every node of ``bed``; use as a context manager or call start()/stop()."""

    __test__ = False

    def __init__(self, bed: TestBed, slot: int, partition: str = "main") -> None:
        self.bed = bed
        self.slot = slot
        self.partition = partition
        self.root = bed.root / "slurm"
        self.conf = self.root / "slurm.conf"
        self.socket = self.root / "munge.socket"
        self.ctld_port = PORT_BASE + 10 * slot
        self.slurmd_port = self.ctld_port + 1
        self.cluster = f"cddp{slot}"
        self.node_names = [f"node-{i}" for i in range(1, len(bed.nodes) + 1)]
        self._procs: list[subprocess.Popen] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> SlurmBed:
        reason = missing_slurm()
        if reason:
            raise RuntimeError(f"cannot start SlurmBed: {reason}")
        self._end_leftovers()
        try:
            self._write_config()
            self._start_munged()
            self._start_slurmctld()
            for node, name in zip(self.bed.nodes, self.node_names, strict=True):
                self._start_slurmd(node, name)
            self.wait_idle()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """End the daemons this bed started (jobs' processes live in the nodes' namespaces:
        the TestBed's stop kills them)."""
        for p in reversed(self._procs):
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for p in reversed(self._procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                p.wait(timeout=5)
        self._procs.clear()
        self._leftovers.unlink(missing_ok=True)

    def __enter__(self) -> SlurmBed:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ queries

    def env(self) -> dict[str, str]:
        """What a Slurm client command needs in its environment to reach this cluster."""
        return {"SLURM_CONF": str(self.conf)}

    def client(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run a Slurm client command (sinfo, squeue, scontrol, ...) against this cluster."""
        r = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout,
                           env={**os.environ, **self.env()})
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed (exit {r.returncode}): {r.stderr.strip()}")
        return r

    def node_states(self) -> dict[str, str]:
        out = self.client("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
        return dict(line.split()[:2] for line in out.splitlines() if len(line.split()) >= 2)

    def wait_idle(self, timeout: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while True:
            states = self.node_states()
            if all(states.get(n) == "idle" for n in self.node_names):
                return
            for p in self._procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{' '.join(map(str, p.args))} exited {p.returncode}\n{self._logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm nodes not idle after {timeout}s: {states}\n{self._logs()}")
            time.sleep(0.2)

    def jobs(self) -> list[str]:
        """Ids of the jobs Slurm still lists (any state)."""
        return self.client("squeue", "-h", "-o", "%i", check=False).stdout.split()

    def drain(self) -> None:
        """Make the partition accept jobs but start none (they pend with reason PartitionDown)."""
        self.client("scontrol", "update", f"PartitionName={self.partition}", "State=DOWN")

    def undrain(self) -> None:
        self.client("scontrol", "update", f"PartitionName={self.partition}", "State=UP")

    # ------------------------------------------------------------------ internals

    def _write_config(self) -> None:
        if self.root.exists():
            shutil.rmtree(self.root)
        (self.root / "state").mkdir(parents=True)
        for name in self.node_names:
            (self.root / "spool" / name).mkdir(parents=True)
        ctld_host = f"{socket.gethostname()}({self.bed.gateway})"
        nodes = "\n".join(f"NodeName={name} NodeAddr={node.address} CPUs={NODE_CPUS} State=UNKNOWN"
                          for node, name in zip(self.bed.nodes, self.node_names, strict=True))
        srun_lo = SRUN_PORT_BASE + 200 * self.slot
        self.conf.write_text(f"""\
ClusterName={self.cluster}
SlurmctldHost={ctld_host}
SlurmctldPort={self.ctld_port}
SlurmdPort={self.slurmd_port}
SrunPortRange={srun_lo}-{srun_lo + 199}
AuthType=auth/munge
CredType=cred/munge
# cred_expire: a requeued job may start again only cred_expire+1 s later (Slurm's rule; default
# 120 s): keep the --max-restarts test short.
AuthInfo=socket={self.socket},cred_expire=10
SlurmUser=root
SlurmdUser=root
StateSaveLocation={self.root / "state"}
SlurmdSpoolDir={self.root / "spool"}/%n
SlurmctldPidFile={self.root / "slurmctld.pid"}
SlurmdPidFile={self.root / "slurmd-%n.pid"}
SlurmctldLogFile={self.root / "slurmctld.log"}
SlurmdLogFile={self.root / "slurmd-%n.log"}
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
MpiDefault=none
SchedulerType=sched/backfill
# A requeued job waits for its BeginTime (see cred_expire), then for the next scheduling pass, every 60 s
# by default (backfill's every 30 s): pass every second, so it starts once its BeginTime has come.
SchedulerParameters=sched_interval=1,bf_interval=1
KillWait=5
MinJobAge=300
InactiveLimit=0
{nodes}
PartitionName={self.partition} Nodes={",".join(self.node_names)} Default=YES MaxTime=INFINITE State=UP
""")
        (self.root / "cgroup.conf").write_text(
            "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\nIgnoreSystemd=yes\n")

    def _popen(self, args: list[str], log: Path) -> subprocess.Popen:
        with open(log, "ab") as f:
            p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=f, stderr=f, start_new_session=True,
                                 env={**os.environ, **self.env()})
        self._procs.append(p)
        self._leftovers.write_text("".join(f"{q.pid} {_start_time(q.pid)}\n" for q in self._procs))
        return p

    @property
    def _leftovers(self) -> Path:
        """The daemons this slot's bed started, by pid and start time. A session killed before its
        teardown leaves them running, holding the slot's ports: the next bed in the slot ends them
        first, or its slurmctld would exit with "Address already in use"."""
        return SLOT_DIR / f"clusterddp-slurmbed-{self.slot}.pids"

    def _end_leftovers(self) -> None:
        try:
            lines = self._leftovers.read_text().splitlines()
        except FileNotFoundError:
            return
        left = []
        for line in lines:
            pid, _, started = line.partition(" ")
            if pid.isdigit() and started and _start_time(int(pid)) == started:  # the same process, not a reused pid
                try:
                    os.killpg(int(pid), signal.SIGKILL)
                    left.append(int(pid))
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 30
        while any(_start_time(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.1)
        self._leftovers.unlink(missing_ok=True)

    def _start_munged(self) -> None:
        key = self.root / "munge.key"
        key.write_bytes(os.urandom(128))
        key.chmod(0o600)
        self._popen([MUNGED, "--foreground", "--force", f"--socket={self.socket}", f"--key-file={key}",
                     f"--pid-file={self.root / 'munged.pid'}", f"--log-file={self.root / 'munged.log'}",
                     f"--seed-file={self.root / 'munged.seed'}"], self.root / "munged.out")
        deadline = time.monotonic() + 20
        while not self.socket.exists():
            if self._procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start:\n{_tail(self.root / 'munged.out')}\n"
                                   f"{_tail(self.root / 'munged.log')}")
            time.sleep(0.05)

    def _start_slurmctld(self) -> None:
        self._popen([SLURMCTLD, "-D", "-c", "-i", "-f", str(self.conf)], self.root / "slurmctld.out")
        deadline = time.monotonic() + 30
        while True:
            try:
                with socket.create_connection((self.bed.gateway, self.ctld_port), timeout=1):
                    return
            except OSError:
                pass
            if self._procs[-1].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"slurmctld did not start:\n{_tail(self.root / 'slurmctld.out')}\n"
                                   f"{_tail(self.root / 'slurmctld.log')}")
            time.sleep(0.1)

    def _start_slurmd(self, node, name: str) -> None:
        cmd = f"hostname {name} && exec {SLURMD} -D -N {name} -f {self.conf}"
        self._popen(["ip", "netns", "exec", node.ns, "unshare", "--uts", "sh", "-c", cmd],
                    self.root / f"slurmd-{name}.out")

    def _logs(self) -> str:
        out = []
        for f in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")):
            out.append(f"--- {f}:\n{_tail(f, 10)}")
        return "\n".join(out)
