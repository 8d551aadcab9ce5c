"""Small helpers shared by the CLI and integration tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

# What std::terminate prints when a thread dies inside a C++ destructor: torch 2.13's gloo threads,
# alive past destroy_process_group when something still holds the group, do so at interpreter exit.
TERMINATE = "terminate called without an active exception"


def cddp(*args: str, cwd: Path | None = None, timeout: float = 240, env: dict | None = None,
         check_rc: int | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess.

    An `up` expected to succeed (``check_rc=0``) that failed only by the gloo abort at interpreter
    exit (:func:`gloo_exit_abort`) is run once more, with a warning that says so (pytest lists it):
    a CI run must not go red for torch's teardown of a job whose ranks all did their work. Any other
    failure, or the same abort twice, fails as usual."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    argv = [sys.executable, "-m", "clusterddp", *args]
    r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check_rc == 0 and r.returncode == 1 and args[:1] == ("up",):
        why = _up_exit_abort(args, r.stdout, cwd, full_env)
        if why:
            warnings.warn(f"retried `clusterddp {' '.join(args[:3])} ...` once: {why}", stacklevel=2)
            r = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if check_rc is not None:
        assert r.returncode == check_rc, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


def cddp_closed(*args: str, cwd: Path, both: bool = False, timeout: float = 120,
                env: dict | None = None) -> subprocess.CompletedProcess:
    """``clusterddp ARGS`` with its stdout (with ``both`` its stderr too: ``2>&1 | head -1``) a pipe whose
    reader has already gone: every write finds it so (the strictest `head`). Crash reports go to
    ``cwd/state``."""
    r, w = os.pipe()
    os.close(r)
    try:
        return subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd, stdout=w,
                              stderr=w if both else subprocess.PIPE, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": "1", "XDG_STATE_HOME": str(cwd / "state"),
                                   **(env or {})})
    finally:
        os.close(w)


def _default_sigint() -> None:
    # A test run started in the background (`cmd &` in a script) inherits SIGINT ignored, and
    # Python keeps it ignored; the Ctrl-C tests need the launcher to see it as a terminal would.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cddp_popen(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "clusterddp", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=_default_sigint,
                            env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def wait_for_line(p: subprocess.Popen, needle: str, timeout: float = 120) -> list[str]:
    """Read ``p``'s output until a line contains ``needle``; return the lines read."""
    assert p.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + timeout

    def on_alarm(*_):
        raise TimeoutError(f"{needle!r} not seen within {timeout}s; got:\n" + "".join(seen))
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.1, deadline - time.monotonic()))
    try:
        for line in p.stdout:
            seen.append(line)
            if needle in line:
                return seen
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    raise AssertionError(f"{needle!r} never printed; got:\n" + "".join(seen))


def run_id_of(stdout: str) -> str:
    first = stdout.splitlines()[0]
    assert first.startswith("run "), first
    return first.split()[1]


def record(runs_dir: Path, run_id: str) -> dict:
    return json.loads((runs_dir / run_id / "run.json").read_text())


def gloo_exit_abort(runs_dir: Path, run_id: str) -> str | None:
    """Why the failed run ``run_id`` is torch 2.13's gloo abort at interpreter exit, or None when it is
    not: its root cause is a rank killed by SIGABRT, its node's log says std::terminate ran
    (:data:`TERMINATE`), and no rank raised (no error file, no Python traceback but torchrun's own):
    every rank got through its script; a gloo thread died with the interpreter (see
    clusterddp.train.cleanup)."""
    try:
        rec = record(runs_dir, run_id)
    except (OSError, ValueError):
        return None
    f = rec.get("failure") or {}
    if rec.get("status") != "failed" or f.get("kind") != "signal" or f.get("signal") != "SIGABRT":
        return None
    logs = {p.stem: p.read_text(errors="replace") for p in (runs_dir / run_id / "logs").glob("*.log")}
    # torchrun's own ChildFailedError comes with a traceback of its own: any other one is a rank's
    raised = any(t.count("Traceback (most recent call last)") > t.count("errors.ChildFailedError:")
                 for t in logs.values()) or any((runs_dir / run_id / "errors").rglob("error.json"))
    if TERMINATE not in logs.get(f.get("host", ""), "") or raised:
        return None
    return (f"run {run_id}: {f['host']} rank {f.get('rank')} was killed by SIGABRT ({TERMINATE!r}) after its "
            "script's last line, and no rank raised: the gloo abort at interpreter exit (torch 2.13)")


def _up_exit_abort(args: tuple[str, ...], stdout: str, cwd: Path | None, env: dict) -> str | None:
    """:func:`gloo_exit_abort` for the run an `up` command made (its runs folder as `up` chose it)."""
    lines = stdout.splitlines()
    if not lines or not lines[0].startswith("run "):
        return None
    runs = Path(args[args.index("--runs-dir") + 1]) if "--runs-dir" in args else \
        Path(env.get("CLUSTERDDP_RUNS_DIR") or "./runs")
    return gloo_exit_abort(runs if runs.is_absolute() else Path(cwd or ".") / runs, lines[0].split()[1])


def job_pids(run_id: str) -> list[int]:
    """Every process on this machine (all test nodes share the process table) of the run."""
    out = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if f"CLUSTERDDP_JOB={run_id}/".encode() in env.read_bytes():
                out.append(int(env.parent.name))
        except OSError:
            pass
    return out


def eventually(fn, timeout: float = 10.0, interval: float = 0.2):
    """Poll ``fn`` until it returns a truthy value (returned) or ``timeout`` passes (last value)."""
    deadline = time.monotonic() + timeout
    while True:
        v = fn()
        if v or time.monotonic() > deadline:
            return v
        time.sleep(interval)


def make_record(run_id: str, hosts: tuple[str, ...] = ("a", "b"), **fields):
    """A RunRecord for tests of the store and of what reads it; ``fields`` override the run's fields."""
    from dataclasses import replace

    from clusterddp.inventory import Host
    from clusterddp.record import NodeRecord, RunRecord, RunStatus
    nodes = tuple(NodeRecord(host=h, address=f"10.0.0.{i + 1}", node_rank=i, nproc=1, run_dir=f"/w/runs/{run_id}",
                             control_dir=f"/w/runs/{run_id}/.clusterddp", marker=f"{run_id}/{h}",
                             settings=Host(name=h, address=f"10.0.0.{i + 1}", user="me", port=None,
                                           identity_file=None, known_hosts="~/.ssh/known_hosts",
                                           host_key_policy="strict", gpus=1, python="python3", workdir="/w",
                                           env=(), setup=(), connect_timeout=10.0))
                  for i, h in enumerate(hosts))
    rec = RunRecord(run_id=run_id, name=None, inventory="/w/inv.yaml", script="t.py", args=(),
                    status=RunStatus.RUNNING, failed_host=None, schedule=None, local=False,
                    started_at="2026-11-29T10:00:00+00:00", ended_at=None, launch_dir="/w", master_addr="10.0.0.1",
                    master_port=29500, collect=(), nodes=nodes)
    return replace(rec, **fields)


def job_script(tmp_path: Path, name: str, text: str) -> Path:
    """``text`` as ``<tmp_path>/job/<name>``: a script in a folder of its own (up uploads the folder)."""
    path = tmp_path / "job" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text)
    return path


# A plain torch job for the stall watchdog's tests (SSH and Slurm beds): rank 0 prints progress for argv[1]
# steps; then rank 3 is stuck in a function of its own while ranks 0-2 wait in all_reduce.
STUCK_JOB = r'''
import os, sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()


def stuck_in_my_function():
    while True:
        time.sleep(0.05)


for step in range(int(sys.argv[1])):
    dist.all_reduce(torch.ones(1))
    if rank == 0:
        print("step %d at %.3f" % (step, time.time()), flush=True)
    time.sleep(0.5)
if rank == 3:
    stuck_in_my_function()
dist.all_reduce(torch.ones(1))  # ranks 0-2 wait here for rank 3
'''


def host_pids(run_id: str, host: str) -> list[int]:
    """The processes of one node's part of a run (their CLUSTERDDP_JOB marker names the host)."""
    want = f"CLUSTERDDP_JOB={run_id}/{host}\0".encode()
    out = []
    for env in Path("/proc").glob("[0-9]*/environ"):
        try:
            if want in env.read_bytes():
                out.append(int(env.parent.name))
        except OSError:
            pass
    return out


def parse_inventory(text: str, path: str):
    """An inventory's text read as the CLI reads it: a backend's section (`slurm:`) by that backend."""
    from clusterddp import backends, inventory
    return inventory.parse(text, path, backends.inventory_section)


def load_inventory(path):
    """An inventory file read as the CLI reads it (:func:`parse_inventory`)."""
    from clusterddp import backends, inventory
    return inventory.load(path, backends.inventory_section)


def resolved(spec, inventory, nodes=None):
    """``spec`` (the flags) resolved once against ``inventory``, as `up` does it before anything plans the run
    (:func:`clusterddp.runspec.resolve`): an Inventory, or the name of one (a path, or ``local``) read as `up`
    reads it."""
    from clusterddp.backends import base
    from clusterddp.runspec import resolve
    if not hasattr(inventory, "hosts"):
        inventory = base.load_inventory(str(inventory), spec.gpus)
    return resolve(spec, inventory, nodes)


class ScriptedNode:
    """A node at the transport seam for unit tests: answers the commands it is sent with ``answers`` in
    order (an exception in the list is raised instead), keeping the commands; once they are used up,
    ``after`` (None: an IndexError, as a test that asks more than it scripted should see)."""

    def __init__(self, answers: list, after: bytes | None = None) -> None:
        self.answers, self.commands, self.after = answers, [], after

    def run(self, command: str, *, timeout=None, stdin=None):
        from clusterddp.transport import CommandResult
        self.commands.append(command)
        a = self.answers.pop(0) if self.answers or self.after is None else self.after
        if isinstance(a, Exception):
            raise a
        return CommandResult(0, a, b"")

    def close(self) -> None:
        pass
