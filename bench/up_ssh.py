"""`clusterddp up` of a 1-step job on 2 test-bed nodes x 2 processes, against typing it by hand.

Starts a two-node network-namespace test bed (tests/testbed.py; root needed) whose nodes' login
shell reads a stock ~/.bashrc (as bench/exec_fanout.py), and times, interleaved round by round:

  hand-typed     two `ssh root@NODE 'cd JOB && GLOO_SOCKET_IFNAME=eth0 python -m torch.distributed.run
                 --nnodes 2 --node-rank R --master-addr A --master-port P --nproc-per-node 2 t.py'`
                 started together, waited for together: what a user types in two terminals
                 (the script already on the nodes: the bed's nodes share this machine's disk)
  up             clusterddp up inv.yaml job/t.py (preflight, lease, upload, start, follow, collect)
  up --skip-check  the same without the preflight

t.py initialises a gloo group, does one all_reduce (the step) and ends. Each worker writes when its
script started and ended, so every run is also split into before the job (command start to the
first worker's start), the job (first start to last end) and after it (last end to the command's
exit): what the launcher adds before and after, and what the nodes' side adds to the job itself.
Goal (issue 24): up <= 1.05x hand-typed, up --skip-check <= 1.0x. Each command's CPU is also read
for the whole machine (/proc/stat: every process, `up`'s detached job and what launch.sh adds to it
included), with how much later one node's first worker started than the other's.

``--trace`` also runs one `up` in-process with every SSH command it sends timed (host, start,
end, what), to see where the launcher's time goes. ``--cpu S`` runs a job of S seconds under `up`
and reports the launcher's own CPU time (user + system) per node-minute (goal < 1), from its
rusage, against a 1-step run's, and the node-side helpers' CPU (followers, heartbeats) from the
nodes' sshd sessions.

``--split-cores`` puts the nodes (their sshd, so every session and job) on one core and this
machine's side (the launcher, or the two ssh clients) on the other, as separate machines are: the
launcher's CPU then takes nothing from the job's, and what is left is latency.

``--floor`` reports the CPU of the launcher's own start (a python start, and the imports `up`
needs before its first connection), which no change to what `up` sends can win back.

``--trace`` also prints, for each traced run, the breakdown of `up`'s start before the job's first line
(a worker's script starting): the launcher's own start (python and its imports), its work before the
first connection, the connections, preflight, lease, upload and start, and the node's start of the job;
with ``--trace-runs N``, their medians too.

``--nodes N`` (default 2) and ``--nproc P`` (default 2) size the bed and the job: `--nodes 16 --nproc 1
--no-skip-check` for the start of `up` on 16 nodes against 16 hand-typed ssh commands. Each command's
side on this machine is also watched every 50 ms: its threads and TCP sockets at their most (the launcher
against one ssh client a node), and its CPU a node: how the launcher's cost grows with the nodes.
The trace's breakdown ends with the time from the launcher's exec to its first command on a node: the
connections open beside its own work (issue 45), so that is what the job's start still waits for.

What a skeptic would check, and why the figures here can differ from a quick check by hand: a
hand-typed 2-node start loses 0.3-0.75 s at torchrun's store connect about every other time (the
master's store not listening yet; torchrun retries after a random back-off), which `up` avoids; a
3-round check whose hand-typed runs all missed that race sees `up` about even with them. So the
report gives, next to the medians, the ratio against the hand-typed runs that started on time.
Other things that move the figures: a clusterddp that is not byte-compiled (an editable checkout
under PYTHONDONTWRITEBYTECODE=1 compiles every module at each start, +0.1-0.3 s; the bench compiles
first), nodes whose login shell runs `pyenv init` (0.1 CPU-s and up to 0.35 s for every SSH command,
and `up` sends several per node to hand-typed's one: `--node-bashrc machine`), and the load.

    python bench/up_ssh.py [--rounds 7] [--nodes 2] [--nproc 2] [--trace] [--trace-runs N] [--cpu 120]
                           [--floor] [--split-cores] [--before CHECKOUT]

``--before`` times a second clusterddp (another checkout's, e.g. main's: ``git archive main
clusterddp | tar -x -C /tmp/before``) in the same rounds, for a before/after under the same load;
``--code`` runs another checkout than this one as the one under test.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests"))
from _common import STOCK_BASHRC  # noqa: E402
from testbed import TestBed, session_slot  # noqa: E402

SCRIPT = """import os, sys, time
t0 = time.time()
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
dist.all_reduce(torch.ones(1))
dist.destroy_process_group()
if len(sys.argv) > 1:
    with open(os.path.join(sys.argv[1], os.environ["RANK"]), "w") as f:
        f.write("%r %r" % (t0, time.time()))
"""

# A job of argv[2] seconds: one all_reduce a second, as a long training run would step.
LONG = """import sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
end = time.time() + float(sys.argv[2])
while time.time() < end:
    dist.all_reduce(torch.ones(1))
    time.sleep(1.0)
dist.destroy_process_group()
"""

NPROC = 2
LATE_START = 0.25  # s: a job's start this much later than the command's quickest: torchrun's connect retried


class Bench:
    def __init__(self, bed: TestBed, root: Path, nproc: int = NPROC) -> None:
        self.bed, self.root, self.nproc = bed, root, nproc
        self.job = root / "job"
        self.job.mkdir()
        (self.job / "t.py").write_text(SCRIPT)
        (self.job / "long.py").write_text(LONG)
        self.inv = bed.write_inventory(root / "inv.yaml", defaults_extra={"gpus": nproc})
        self.runs = root / "runs"
        self.marks = root / "marks"
        # A state folder of its own: a run cut short (a bench stopped with Ctrl-C) must not quarantine
        # the bed's addresses in this machine's list, nor that list refuse the bed's nodes.
        self.env = {**os.environ, "OMP_NUM_THREADS": "1", "XDG_STATE_HOME": str(root / "state")}
        self.ssh = ["ssh", "-i", str(bed.identity_file), "-o", f"UserKnownHostsFile={bed.known_hosts}",
                    "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
        self.port = 29600
        self.launcher_cpus: set[int] | None = None  # --split-cores: where this machine's side runs
        self.phases: dict[str, list[tuple[float, float, float]]] = {}
        self.cpu: dict[str, list[tuple[float, float]]] = {}  # (this machine's side, the nodes' sshd sessions)
        self.machine: dict[str, list[float]] = {}  # every process's CPU while the command ran (/proc/stat)
        self.stagger: dict[str, list[float]] = {}  # how much later one node's first worker started than the other's
        self.peaks: dict[str, list[tuple[int, int]]] = {}  # this machine's side: most threads, most TCP sockets

    def cli(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "clusterddp", *args]

    def up(self, *extra: str, runs: Path | None = None) -> list[str]:
        return self.cli("up", str(self.inv), str(self.job / "t.py"), "--runs-dir", str(runs or self.runs), *extra,
                        "--", str(self.marks))

    def hand(self) -> list[list[str]]:
        self.port += 1  # a fresh port each round: no wait on the last round's TIME_WAIT
        nodes = self.bed.nodes
        master = nodes[0].address
        return [self.ssh + [f"root@{n.address}",
                            f"cd {self.job} && GLOO_SOCKET_IFNAME=eth0 {sys.executable} -m torch.distributed.run "
                            f"--nnodes {len(nodes)} --node-rank {r} --master-addr {master} --master-port {self.port} "
                            f"--nproc-per-node {self.nproc} t.py {self.marks}"]
                for r, n in enumerate(nodes)]

    def _settled_sshd_cpu(self) -> float:
        """The nodes' sshd children's CPU once the sessions just closed are reaped (a moment later)."""
        last, deadline = sshd_children_cpu(self.bed), time.monotonic() + 5
        while time.monotonic() < deadline:
            time.sleep(0.3)
            now = sshd_children_cpu(self.bed)
            if now == last:
                return now
            last = now
        return last

    def timed(self, name: str, cmds: list[list[str]], code: Path | None = None) -> float:
        """Run ``cmds`` together (clusterddp from the checkout ``code``, if given); their wall time; the
        split into before/job/after kept under ``name``."""
        shutil.rmtree(self.marks, ignore_errors=True)
        self.marks.mkdir()
        env = {**self.env, "PYTHONPATH": str(code)} if code else self.env
        r0, n0 = resource.getrusage(resource.RUSAGE_CHILDREN), sshd_children_cpu(self.bed)
        m0 = machine_busy()
        t0 = time.time()
        cpus = self.launcher_cpus
        pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
        # cwd: not the checkout, where `python -m clusterddp` would import its clusterddp ahead of PYTHONPATH
        # (and so time this checkout's code as --before's)
        procs = [subprocess.Popen(c, env=env, cwd=self.root, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  preexec_fn=pin) for c in cmds]
        peaks = Peaks([p.pid for p in procs])
        errs = [p.communicate()[1] for p in procs]
        t1 = time.time()
        self.peaks.setdefault(name, []).append(peaks.stop())
        self.machine.setdefault(name, []).append(machine_busy() - m0)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu.setdefault(name, []).append((r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                                              self._settled_sshd_cpu() - n0))
        for c, p, e in zip(cmds, procs, errs, strict=True):
            if p.returncode != 0:
                raise SystemExit(f"benchmark command failed (exit {p.returncode}): {c}\n{e.decode(errors='replace')}")
        marks = {int(f.name): tuple(map(float, f.read_text().split())) for f in self.marks.iterdir()}
        ts = list(marks.values())
        if len(ts) != self.nproc * len(self.bed.nodes):
            raise SystemExit(f"{name}: {len(ts)} workers reported, expected {self.nproc * len(self.bed.nodes)}")
        first, last = min(a for a, _ in ts), max(b for _, b in ts)
        starts = [min(marks[r][0] for r in marks if r // self.nproc == n) for n in range(len(self.bed.nodes))]
        self.stagger.setdefault(name, []).append(max(starts) - min(starts))
        self.phases.setdefault(name, []).append((first - t0, last - first, t1 - last))
        return t1 - t0


class Peaks:
    """The most threads and the most open TCP sockets that ``pids`` (this machine's side of a command: the
    launcher, or the ssh clients) held together at any look, every 50 ms while they run."""

    def __init__(self, pids: list[int]) -> None:
        import threading
        self.pids, self.threads, self.sockets = pids, 0, 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(0.05):
            threads = sockets = 0
            for pid in self.pids:
                try:
                    status = Path(f"/proc/{pid}/status").read_text()
                    threads += int(status.split("Threads:", 1)[1].split()[0])
                    sockets += sum(os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
                                   for fd in os.listdir(f"/proc/{pid}/fd"))
                except (OSError, IndexError, ValueError):
                    continue
            self.threads, self.sockets = max(self.threads, threads), max(self.sockets, sockets)

    def stop(self) -> tuple[int, int]:
        self._done.set()
        self._thread.join()
        return self.threads, self.sockets


def interleaved(b: Bench, rounds: int, code: Path | None, before: Path | None,
                skip_check: bool = True) -> dict[str, float]:
    tools = {"hand-typed": lambda: b.timed("hand-typed", b.hand()),
             "up": lambda: b.timed("up", [b.up()], code),
             "up --skip-check": lambda: b.timed("up --skip-check", [b.up("--skip-check")], code)}
    if not skip_check:
        del tools["up --skip-check"]
    if before is not None:  # another clusterddp (e.g. main's), in the same rounds
        old = b.root / "runs-before"
        tools["up (before)"] = lambda: b.timed("up (before)", [b.up(runs=old)], before)
        if skip_check:
            tools["up --skip-check (before)"] = lambda: b.timed("up --skip-check (before)",
                                                                [b.up("--skip-check", runs=old)], before)
    for f in tools.values():  # warm up: page cache, sshd's first fork, bytecode
        f()
    b.phases.clear()
    b.cpu.clear()
    b.machine.clear()
    b.stagger.clear()
    b.peaks.clear()
    times: dict[str, list[float]] = {k: [] for k in tools}
    loads = [os.getloadavg()[0]]
    for i in range(rounds):
        order = list(tools) if i % 2 == 0 else list(tools)[::-1]  # alternate who goes first
        for k in order:
            times[k].append(tools[k]())
        loads.append(os.getloadavg()[0])
        print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f}s" for k, v in times.items())
              + f"; load {loads[-1]:.1f}", flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    base = med["hand-typed"]
    print(f"\n{rounds} interleaved rounds; load average (1 min) during them: min {min(loads):.1f}, "
          f"median {statistics.median(loads):.1f}, max {max(loads):.1f}; {os.cpu_count()} cores")
    print("| command | median | ratio to hand-typed | before the job | the job | after it | runs |")
    print("|---|---|---|---|---|---|---|")
    for k, v in times.items():
        ph = b.phases[k]
        before, job, after = (statistics.median(p[i] for p in ph) for i in range(3))
        print(f"| {k} | {med[k]:.2f} s | **{med[k] / base:.3f}x** | {before:.2f} s | {job:.2f} s | {after:.2f} s | "
              f"{', '.join(f'{x:.1f}' for x in v)} |")
    # CPU, which a loaded machine shares out and wall times only show through its noise. The hand-typed
    # runs' node side is their job (torchrun and its workers, children of the SSH sessions) plus two
    # sessions; `up`'s job is detached from its sessions, so its node side is clusterddp's own work
    # (lease, start, follower, status, collect; launch.sh's own lines run in the job and are not in it).
    job = statistics.median(c[1] for c in b.cpu["hand-typed"])
    hand = statistics.median(c[0] for c in b.cpu["hand-typed"])
    print(f"\nCPU seconds (medians): the job itself, hand-typed (its node side, its SSH sessions included): "
          f"{job:.2f}; the ssh clients: {hand:.2f}")
    print("| command | this machine (launcher) | nodes (clusterddp's sessions) | CPU ratio to hand-typed |")
    print("|---|---|---|---|")
    for k in list(times)[1:]:
        here = statistics.median(c[0] for c in b.cpu[k])
        there = statistics.median(c[1] for c in b.cpu[k])
        print(f"| {k} | {here:.2f} | {there:.2f} | **{(job + here + there) / (job + hand):.3f}x** |")
    # The whole machine's CPU (every process: launcher, sshd, the job and what launch.sh adds to it,
    # the nodes' helpers), which the table above leaves out for `up`'s detached job.
    whole = {k: statistics.median(v) for k, v in b.machine.items()}
    print("\nthe whole machine's CPU while each ran (/proc/stat, every process), and how much later one node's "
          "first worker started than the other's (medians):")
    for k in times:
        print(f"  {k}: {whole[k]:.2f} CPU-s (**{whole[k] / whole['hand-typed']:.3f}x**); "
              f"start stagger {statistics.median(b.stagger[k]) * 1000:.0f} ms")
    # How this machine's side grows with the nodes: its threads and TCP sockets at their most (the launcher's
    # own, against one ssh client a node for hand-typed), and its CPU a node.
    n = len(b.bed.nodes)
    print(f"\nthis machine's side, at its most (medians) and its CPU a node ({n} nodes):")
    for k in times:
        here = statistics.median(c[0] for c in b.cpu[k])
        print(f"  {k}: {statistics.median(p[0] for p in b.peaks[k]):.0f} threads, "
              f"{statistics.median(p[1] for p in b.peaks[k]):.0f} TCP sockets, {here / n * 1000:.0f} ms of CPU a node "
              f"({here:.2f} CPU-s)")
    # A non-master torchrun whose first connect to the master's store is refused (the master's torchrun
    # still importing torch) tries again 0.3-0.75 s later: the job then starts that much later.
    late = {k: sum(p[0] > min(q[0] for q in b.phases[k]) + LATE_START for p in b.phases[k]) for k in times}
    print(f"runs whose job started more than {LATE_START} s later than that command's quickest start (a torchrun's "
          "store connect refused, tried again later): " + ", ".join(f"{k} {n}/{rounds}" for k, n in late.items()))
    # A skeptic's figure: against the hand-typed runs that did not lose torchrun's store race (what
    # three rounds of hand-typed runs may well all be), `up`'s own costs are not hidden by its race fix.
    quick = [t for t, p in zip(times["hand-typed"], b.phases["hand-typed"], strict=True)
             if p[0] <= min(q[0] for q in b.phases["hand-typed"]) + LATE_START]
    if len(quick) < 3:  # under heavy load every start is "late": nothing to tell apart
        print(f"hand-typed runs whose job started on time: {len(quick)} of {rounds}, too few to compare with")
    else:
        qm = statistics.median(quick)
        print(f"against the {len(quick)} hand-typed runs whose job started on time (median {qm:.2f} s): "
              + ", ".join(f"{k} **{med[k] / qm:.3f}x**" for k in list(times)[1:]))
    for k in list(times)[1:]:
        ratios = sorted(times[k][i] / times["hand-typed"][i] for i in range(rounds))
        print(f"per-round ratio to hand-typed, {k}: median {statistics.median(ratios):.3f} "
              f"({', '.join(f'{r:.2f}' for r in ratios)})")
    return med


# ---- --trace: one `up` in-process, every SSH command timed ----

TRACER = r"""
import sys, threading, time
T0 = time.monotonic()
SPAWN = T0 - (time.time() - float(__import__("os").environ["CDDP_BENCH_SPAWN"]))  # the launcher's exec, monotonic
log = [(SPAWN - T0, 0.0, "-", "python", "")]  # the interpreter's own start, to the tracer's first line
import clusterddp.transport.ssh as S
def wrap(name):
    orig = getattr(S.SSHTransport, name)
    def timed(self, command, *a, **kw):
        t = time.monotonic()
        try:
            return orig(self, command, *a, **kw)
        finally:
            log.append((t - T0, time.monotonic() - T0, self.name, name, command))
    setattr(S.SSHTransport, name, timed)
wrap("run"); wrap("stream")
orig_open = S.SSHTransport.open
def opened(self):
    t = time.monotonic()
    try:
        return orig_open(self)
    finally:
        log.append((t - T0, time.monotonic() - T0, self.name, "connect", ""))
S.SSHTransport.open = opened
import atexit, os
def show():
    for a, b, host, kind, cmd in sorted(log):
        what = " ".join(l for l in cmd.splitlines() if l and not l.startswith("#"))
        what = what.replace(sys.executable, "PY")
        print(f"{a:7.3f} {b:7.3f} {b - a:6.3f}  {host:6} {kind:7} {what[:110]}", file=sys.stderr)
    print(f"total {time.monotonic() - T0:.3f}s", file=sys.stderr, flush=True)
    import json
    with open(os.environ["CDDP_BENCH_TRACE"], "w") as f:
        json.dump({"t0": time.time() - (time.monotonic() - T0), "imported": IMPORTED - T0, "spawn": SPAWN - T0,
                   "end": time.monotonic() - T0,
                   "log": [(a, b, h, k, c[:4000]) for a, b, h, k, c in log]}, f)
atexit.register(show)
_exit = os._exit
def shown_exit(code):  # a finished `up` ends with os._exit (exit_quickly_when_done): no atexit then
    show()
    _exit(code)
os._exit = shown_exit
sys.argv = ["clusterddp"] + sys.argv[1:]
from clusterddp.cli.app import main
IMPORTED = time.monotonic()  # the CLI's own imports done; the transport's were above
main()
"""

# How a traced SSH command is named in the breakdown of `up`'s start: by what it runs.
# (The node programs' source travels whole on their command line: the specific names first.)
PHASES = (("follow", "``follow``"), ("collect", "``collect``"), ("lease", "``lease``"), ("preflight", "cddp_iface"),
          ("upload and start", "mkdir -p"))


def phase_of(kind: str, command: str) -> str:
    if kind in ("connect", "python"):
        return kind
    return next((name for name, key in PHASES if key in command), "other")


def trace(b: Bench, *extra: str, code: Path | None = None) -> dict[str, float] | None:
    """One traced `up` (of the clusterddp of checkout ``code``, if given): every SSH command it sent, then
    the breakdown of its start up to the job's first line (a worker's script starting), phase by phase;
    returns that breakdown."""
    shutil.rmtree(b.marks, ignore_errors=True)
    b.marks.mkdir()
    out = b.root / "trace.json"
    print(f"\n`up {' '.join(extra)}`{f' of {code}' if code else ''} in-process, each SSH command (start, end, "
          "took, host, kind, command), seconds from the tracer's start:")
    env = {**b.env, "CDDP_BENCH_TRACE": str(out), "CDDP_BENCH_SPAWN": repr(time.time()),
           **({"PYTHONPATH": str(code)} if code else {})}
    r = subprocess.run([sys.executable, "-c", TRACER, *b.up(*extra)[3:]], env=env, cwd=b.root, capture_output=True,
                       text=True)
    print(r.stderr)
    if r.returncode != 0:
        print(r.stdout)
        return None
    return breakdown(json.loads(out.read_text()), b.marks)


def breakdown(tr: dict, marks: Path) -> dict[str, float]:
    """Where `up`'s wall time before the job's first line went: the launcher's start (python, then its
    imports to the CLI's entry), its own work up to the first connection (inventory, plan, the script
    folder's tarball), the connections, and each phase's span (first command sent to last answered;
    phases overlap: the lease is taken while the preflight runs), then the node's start of the job
    (launch.sh, torchrun, the worker's python) to the first worker's script."""
    log = tr["log"]
    first = min(float(f.read_text().split()[0]) for f in marks.iterdir()) - tr["t0"]  # a worker's script starts
    spans: dict[str, list[float]] = {}
    for a, z, _host, kind, cmd in log:
        ph = phase_of(kind, cmd)
        lo, hi = spans.get(ph, [a, z])
        spans[ph] = [min(lo, a), max(hi, z)]
    spawn = tr["spawn"]
    rows = [("the launcher's start: python, the imports of the CLI and the SSH transport", spawn, tr["imported"]),
            ("its own work before the first connection (inventory, plan, tarball)", tr["imported"],
             spans["connect"][0])]
    rows += [(ph, *spans[ph]) for ph in ("connect", "preflight", "lease", "upload and start") if ph in spans]
    # the connections open beside the launcher's own work since issue 45: the part of that work left once
    # they are open is what the first command still waits for
    sent = min((a for a, _z, _h, kind, cmd in log if phase_of(kind, cmd) not in ("connect", "python")),
               default=spans["connect"][1])
    rows.append(("exec to the first command sent to a node", spawn, sent))
    start_end = spans.get("upload and start", spans["connect"])[1]
    rows.append(("the node's start of the job (launch.sh, torchrun, the worker's python)", start_end, first))
    out = phases(f"the start of `up`, before the job's first line ({first - spawn:.2f} s after the launcher's exec):",
                 rows, spawn)
    out["before the job's first line"] = first - spawn
    out.update(the_end(tr, marks, spans))
    return out


def the_end(tr: dict, marks: Path, spans: dict[str, list[float]]) -> dict[str, float]:
    """Where `up`'s wall time after the job's last line went: the ranks' and torchrun's exit (to launch.sh's
    ``exit_code``, whose time the nodes' shared disk keeps), the follower seeing it, the collect, the rest."""
    last = max(float(f.read_text().split()[1]) for f in marks.iterdir()) - tr["t0"]  # a worker's script ends
    ctls = {m.group(1) for *_x, cmd in tr["log"] for m in [re.search(r"mkdir -p (\S+/\.clusterddp/[^/\s]+)", cmd)]
            if m}
    exited = max((Path(c) / "exit_code").stat().st_mtime for c in ctls) - tr["t0"]
    rows = [("the ranks' exit and torchrun's, to launch.sh's exit_code", last, exited),
            ("the follower sees it, the exit status read", exited, spans["follow"][1]),
            ("collect", *spans.get("collect", [spans["follow"][1]] * 2)),
            ("the rest, to the launcher's exit", spans.get("collect", spans["follow"])[1], tr["end"])]
    out = phases(f"the end of `up`, after the job's last line ({tr['end'] - last:.2f} s to the launcher's exit):", rows)
    out["after the job's last line"] = tr["end"] - last
    return out


def phases(title: str, rows: list[tuple[str, float, float]], origin: float | None = None) -> dict[str, float]:
    """Print ``rows`` (what, from, to) as a Markdown table under ``title``, with when each began and ended
    from ``origin`` if given; return how long each took."""
    print(title)
    print("| phase | from | to | took |" if origin is not None else "| phase | took |")
    print("|---|---|---|---|" if origin is not None else "|---|---|")
    for what, a, z in rows:
        print(f"| {what} | {a - origin:.3f} s | {z - origin:.3f} s | {z - a:.3f} s |" if origin is not None
              else f"| {what} | {z - a:.3f} s |")
    return {what: z - a for what, a, z in rows}


# ---- --floor: what the launcher's start costs before it can send anything ----

# What `up` of an SSH run imports before its first connection: the CLI, the inventory's schema
# rules, the SSH transport (Fabric, paramiko) and the run's own modules.
UP_IMPORTS = ("clusterddp.cli.app", "clusterddp.inventory._inventory_schema", "clusterddp.transport.ssh",
              "clusterddp.backends.ssh.launch", "clusterddp.leases", "clusterddp.artifacts")


def floor(b: Bench, repeat: int = 7) -> None:
    """CPU seconds (user + system, the least of ``repeat`` runs: load adds to it, never takes away)
    of a bare python start, of each import group, and of all `up` imports together."""
    def least(code: str) -> float:
        best = float("inf")
        for _ in range(repeat):
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            subprocess.run([sys.executable, "-c", code], env=b.env, cwd=b.root, check=True)
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            best = min(best, r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime)
        return best
    print(f"\nthe launcher's start, CPU seconds (least of {repeat} runs; load {os.getloadavg()[0]:.1f}):")
    for what, code in [("python start", "pass"), ("the CLI (typer)", "import clusterddp.cli.app"),
                       ("the inventory schema", "import clusterddp.inventory._inventory_schema"),
                       ("the SSH transport (fabric, paramiko)", "import clusterddp.transport.ssh"),
                       ("all that `up` imports", "import " + ", ".join(UP_IMPORTS))]:
        print(f"  {what}: {least(code):.3f}")


# ---- --cpu: the launcher's own CPU time during a long run ----

def machine_busy() -> float:
    """CPU seconds every process on this machine has used since boot (/proc/stat: all but idle and iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:8]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def sshd_children_cpu(bed: TestBed) -> float:
    """CPU seconds of every SSH session each node's sshd has reaped so far, all nodes together: the
    node-side cost of what the launcher runs there (a job `up` starts is detached: not counted)."""
    total = 0.0
    for node in bed.nodes:
        pid = int((bed.root / node.name / "sshd.pid").read_text())
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")  # cutime, cstime
    return total


def cpu(b: Bench, seconds: float) -> None:
    def one(script: str, *args: str) -> tuple[float, float, float]:
        before, nodes_before = resource.getrusage(resource.RUSAGE_CHILDREN), sshd_children_cpu(b.bed)
        t = time.monotonic()
        subprocess.run(b.cli("up", str(b.inv), str(b.job / script), "--runs-dir", str(b.runs), "--skip-check",
                             "--", *args), env=b.env, cwd=b.root, check=True, stdout=subprocess.DEVNULL)
        wall = time.monotonic() - t
        time.sleep(1.0)  # the nodes' sshd reap their sessions once the launcher has closed them
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        return (after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime,
                sshd_children_cpu(b.bed) - nodes_before, wall)
    short, short_nodes, short_wall = one("t.py", str(b.marks))
    long, long_nodes, long_wall = one("long.py", "-", str(seconds))
    node_minutes = (long_wall - short_wall) / 60 * len(b.bed.nodes)
    print(f"\nlauncher CPU (user + system): 1-step run {short:.2f} s in {short_wall:.1f} s; {seconds:g} s job "
          f"{long:.2f} s in {long_wall:.1f} s: **{(long - short) / node_minutes:.3f} CPU-s per node-minute** "
          f"while the job runs (goal < 1)")
    print(f"nodes' side of it (their sshd sessions: followers, heartbeats): 1-step run {short_nodes:.2f} s, "
          f"long run {long_nodes:.2f} s: {(long_nodes - short_nodes) / node_minutes:.3f} CPU-s per node-minute; "
          f"load {os.getloadavg()[0]:.1f}")


def split_cores(b: Bench) -> None:
    """The nodes (their sshd, so every session and job) on the last core, this machine's side (the
    launcher, or the two ssh clients) on the others: as on a real cluster, where the launcher runs on
    another machine and its CPU takes none from the job's."""
    last = max(os.sched_getaffinity(0))
    for node in b.bed.nodes:
        os.sched_setaffinity(int((b.bed.root / node.name / "sshd.pid").read_text()), {last})
    b.launcher_cpus = os.sched_getaffinity(0) - {last}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--nodes", type=int, default=2, help="test-bed nodes the job runs on (default 2)")
    ap.add_argument("--nproc", type=int, default=NPROC, help=f"processes per node (default {NPROC}); 1 for 8 or "
                    "16 nodes, whose 2 each would be 32 torch imports a run on this machine's cores")
    ap.add_argument("--no-skip-check", action="store_true", help="time `up` and hand-typed only (large beds)")
    ap.add_argument("--trace", action="store_true", help="also time each SSH command of one `up`")
    ap.add_argument("--trace-runs", type=int, default=1, metavar="N", help="--trace: N runs of each (default 1)")
    ap.add_argument("--cpu", type=float, default=0, metavar="S",
                    help="also measure the launcher's CPU during an S-second job (0: not)")
    ap.add_argument("--floor", action="store_true", help="also measure the CPU of the launcher's start (imports)")
    ap.add_argument("--code", type=Path, help="run the clusterddp of this checkout (default: this one's)")
    ap.add_argument("--before", type=Path, help="also time `up` of the clusterddp of this checkout, in the same rounds")
    ap.add_argument("--split-cores", action="store_true",
                    help="the nodes on one core, the launcher (or ssh clients) on the rest: as separate machines")
    ap.add_argument("--node-bashrc", choices=["stock", "machine"], default="stock",
                    help="the nodes' ~/.bashrc: a stock one (default) or this machine's own")
    args = ap.parse_args()
    # What an installed clusterddp runs: byte-compiled (an editable checkout under
    # PYTHONDONTWRITEBYTECODE=1 would compile its modules again at every start).
    for d in (REPO, args.code, args.before):
        if d is not None:
            compileall.compile_dir(str(d / "clusterddp"), quiet=1)
    slot = session_slot()
    root = Path(tempfile.mkdtemp(prefix="cddp-bench-up-"))
    try:
        with TestBed(args.nodes, root / "bed", prefix=f"cd{slot}u", subnet=f"10.{100 + slot}.248",
                     login_rc=STOCK_BASHRC if args.node_bashrc == "stock" else None) as bed:
            b = Bench(bed, root, args.nproc)
            if args.code:
                b.env["PYTHONPATH"] = str(args.code)
            if args.split_cores:
                split_cores(b)
            print(f"{args.nodes} nodes x {args.nproc} processes, 1-step gloo job; "
                  f"nodes' ~/.bashrc: {args.node_bashrc}; "
                  + ("nodes on their own core; " if args.split_cores else "")
                  + f"load average before: {os.getloadavg()[0]:.1f}")
            if args.rounds:
                interleaved(b, args.rounds, args.code, args.before, not args.no_skip_check)
            if args.trace:
                kinds: list[tuple[str, tuple[str, ...], Path | None]] = [("up", (), args.code)]
                if not args.no_skip_check:
                    kinds.append(("up --skip-check", ("--skip-check",), args.code))
                if args.before:  # traced in the same rounds, alternating with this one's
                    kinds += [(f"{k} (before)", extra, args.before) for k, extra, _ in kinds]
                got: dict[str, list[dict[str, float]]] = {k: [] for k, _, _ in kinds}
                for i in range(args.trace_runs):  # the first pays a cold page cache: look at the others too
                    for k, extra, code in kinds if i % 2 == 0 else kinds[::-1]:
                        one = trace(b, *extra, code=code)
                        if one is not None:
                            got[k].append(one)
                for k, v in got.items():
                    if len(v) > 1:
                        print(f"\n{k}, medians of {len(v)} traced runs (load {os.getloadavg()[0]:.1f}):")
                        for what in v[0]:
                            print(f"  {what}: {statistics.median(x[what] for x in v):.3f} s")
            if args.cpu:
                cpu(b, args.cpu)
            if args.floor:
                floor(b)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
