"""A closed standard output (`clusterddp runs | head -3`, `up ... --detach | head -1`): never an internal
error, never a half-started run. The real command in a real process, its stdout a pipe whose reader is
already gone (every write finds it so: the strictest `head`), a real `up local` run behind it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import cddp, cddp_closed, eventually, record

ENV = {"OMP_NUM_THREADS": "1"}


def quiet(r: subprocess.CompletedProcess, cwd: Path) -> None:
    """Exit 0, not a word on stderr, no crash report."""
    assert (r.returncode, r.stderr or "") == (0, ""), (r.returncode, r.stderr)
    assert not list((cwd / "state").rglob("crash-*"))


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    """A folder with a finished `up local` run."""
    d = tmp_path_factory.mktemp("pipes")
    (d / "t.py").write_text("print('hi from the job', flush=True)\n")
    (d / "long.py").write_text(
        "import os, sys, time\ni = 0\n"
        "while not os.path.exists(sys.argv[1]):\n    print(f'step {i}', flush=True)\n    i += 1\n    time.sleep(0.3)\n")
    cddp("up", "local", "t.py", "--gpus", "1", "--skip-check", "--runs-dir", "runs", cwd=d, check_rc=0)
    return d


def test_an_attached_run_into_a_closed_pipe_runs_to_its_end_and_is_recorded(work):
    """Stdout closed from the first line: the run is followed to its end and recorded as without the pipe."""
    before = set((work / "runs").glob("2*"))
    r = cddp_closed("up", "local", "t.py", "--gpus", "1", "--skip-check", "--runs-dir", "runs", cwd=work,
                      timeout=240)
    quiet(r, work)
    [run] = set((work / "runs").glob("2*")) - before
    rec = record(work / "runs", run.name)
    assert rec["status"] == "succeeded" and rec["ended_at"]
    assert "hi from the job" in (run / "logs" / "local.log").read_text()


def run_id(work: Path) -> str:
    return sorted(p.name for p in (work / "runs").glob("2*"))[0]


@pytest.mark.parametrize("args", [
    ("runs",), ("runs", "--json"), ("status", "{run}"), ("logs", "{run}"), ("logs", "{run}", "--tail", "1", "-q"),
    ("collect", "{run}"), ("top", "--once", "--interval", "0.2"), ("top", "{run}", "--once", "--json"),
    ("prune", "--keep", "5", "--dry-run"), ("schema",), ("check", "local"), ("exec", "local", "--", "echo", "hi"),
    ("leases", "local"), ("schedule", "list"), ("up", "local", "t.py", "--gpus", "1", "--dry-run"), ("--help",),
    ("up", "--help"),
], ids=lambda a: " ".join(a))
def test_every_printing_command_into_a_closed_pipe_is_quiet_and_does_its_work(work, args):
    args = tuple(a.format(run=run_id(work)) for a in args)
    runs = () if args[0] in ("schema", "check", "exec", "leases", "schedule", "--help") or "--help" in args else (
        "--runs-dir", "runs")
    quiet(cddp_closed(*args, *runs, cwd=work), work)
    if args[0] == "collect":  # it did what it does: the log is brought back again, whole
        assert "hi from the job" in (work / "runs" / run_id(work) / "logs" / "local.log").read_text()


def test_a_detached_run_into_a_closed_pipe_starts_and_the_view_commands_end_at_their_next_line(work):
    """`up --detach 2>&1 | head -1` crashed after recording the run and before starting it: a phantom
    run that `status` later called lost. Here it starts and runs on; `logs --follow` and `top`, which
    print for as long as someone reads, end; `stop` stops it; Ctrl-C on `top` prints no traceback."""
    flag = work / "flag"
    before = set((work / "runs").glob("2*"))
    r = cddp_closed("up", "local", "long.py", "--gpus", "1", "--skip-check", "--detach", "--runs-dir", "runs",
                      "--", str(flag), cwd=work, both=True, timeout=240)
    assert r.returncode == 0
    [run] = set((work / "runs").glob("2*")) - before
    log = run / "node" / "node.log"
    assert eventually(lambda: log.exists() and "step 2" in log.read_text(), timeout=120), "the job never started"
    try:
        assert record(work / "runs", run.name)["status"] == "running"
        # neither waits for the run's end (it has none yet): each ends at its next line, well within 45 s
        # (the CLI's start on a loaded machine, then a line every 0.3 s), asserted, not left to a timeout
        quiet(_ends_soon(work, "logs", run.name, "--follow", "--runs-dir", "runs"), work)
        quiet(_ends_soon(work, "top", "--interval", "0.2", "--runs-dir", "runs"), work)
        _ctrl_c_on_top(work)
        quiet(cddp_closed("stop", run.name, "--runs-dir", "runs", cwd=work, timeout=180), work)
        assert record(work / "runs", run.name)["status"] == "stopped"
    finally:
        flag.write_text("")
    st = cddp("status", run.name, "--runs-dir", "runs", cwd=work, check_rc=0)
    assert "lost" not in st.stdout, st.stdout


def _ends_soon(work: Path, *args: str, within: float = 45.0) -> subprocess.CompletedProcess:
    """``cddp_closed(*args)``, which must end within ``within`` seconds (an assertion, not a timeout)."""
    started = time.monotonic()
    try:
        r = cddp_closed(*args, cwd=work, timeout=within)
    except subprocess.TimeoutExpired:
        r = None
    assert r is not None, f"`clusterddp {' '.join(args)}` into a closed pipe still ran after {within:.0f}s"
    assert time.monotonic() - started < within
    return r


def _ctrl_c_on_top(work: Path) -> None:
    """Ctrl-C ends `top`'s view quietly, even a second one while its connections close (that one
    printed a traceback of threading's shutdown). A slow node (each look's shell starts half a second
    late) keeps a look in flight whenever the first Ctrl-C comes, as on a real lab's SSH links."""
    slow = work / "slow-node"
    slow.mkdir(exist_ok=True)
    (slow / "bash").write_text('#!/bin/sh\nsleep 0.5\nexec /bin/bash "$@"\n')
    (slow / "bash").chmod(0o755)
    p = subprocess.Popen([sys.executable, "-m", "clusterddp", "top", "--interval", "0.2", "--runs-dir", "runs"],
                         cwd=work, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env={**os.environ, **ENV, "XDG_STATE_HOME": str(work / "state"),
                              "PATH": f"{slow}{os.pathsep}{os.environ['PATH']}"})
    try:
        assert p.stdout is not None
        p.stdout.readline()  # the view is up, its looks running
        p.send_signal(signal.SIGINT)
        while p.poll() is None:  # Ctrl-C, again and again, until it is gone: one lands in its teardown
            time.sleep(0.01)
            p.send_signal(signal.SIGINT)
        out, errs = p.communicate(timeout=60)
    finally:
        p.kill()
        p.wait()
    assert (p.returncode, errs) == (0, ""), errs

