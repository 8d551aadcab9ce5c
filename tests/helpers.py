"""Small helpers shared by the CLI and integration tests."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def cddp(*args: str, cwd: Path | None = None, timeout: float = 240, env: dict | None = None,
         check_rc: int | None = None) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    r = subprocess.run([sys.executable, "-m", "clusterddp", *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env=full_env)
    if check_rc is not None:
        assert r.returncode == check_rc, f"rc={r.returncode}\nstdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r


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
