"""Ctrl-C and SIGKILL of `up` at its phases, for real: 2 sshd hosts (2 leased slots each), real torchrun,
a plain job that holds its slots until told. What must be left afterwards:

- Ctrl-C before the run is recorded (the preflight, the lease): exit 130, no record, no job, no slot held.
- Ctrl-C while the start commands are on their way (just after `upload:`; issue 40: the job ran on, or
  sat in the rendezvous holding its slots, while the record said stopped): exit 130, no job on any
  node, now or a few seconds later, no slot held, the record stopped.
- Ctrl-C while the job runs: the same, the logs collected.
- SIGKILL before the run is recorded: the nodes' lease holders see its channels go and free the slots.
- SIGKILL while the start commands are on their way, or while the job runs: the job may run on (it
  runs detached by design: nothing on this machine can end it); the record says running, and `stop`
  ends it and frees its slots.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from helpers import cddp, cddp_popen, eventually, job_pids, job_script, wait_for_line

pytestmark = pytest.mark.integration

JOB = r'''
import os, time
os.write(1, b"SEEN rank %s\n" % os.environ["RANK"].encode())
while not os.path.exists(os.environ["HOLD_UNTIL"]):
    time.sleep(0.1)
'''


@pytest.fixture
def bed(make_bed):
    return make_bed(2)


def _up(bed, tmp_path: Path):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    job = job_script(tmp_path, "job.py", JOB)
    runs, hold = tmp_path / "runs", tmp_path / "never"
    p = cddp_popen("up", str(inv), str(job), "--runs-dir", str(runs), "-e", f"HOLD_UNTIL={hold}")
    return p, inv, runs


def _run_id(lines: list[str]) -> str:
    return next(line.split()[1] for line in lines if line.startswith("run "))


def _slots_free(inv: Path) -> bool:
    hosts = json.loads(cddp("leases", str(inv), "--json", check_rc=0).stdout)["hosts"]
    return all(h["leases"] == [] and h["queue"] == [] and h["free"] == [0, 1] for h in hosts)


def _nothing_left(inv: Path, run_id: str | None) -> None:
    """No process of the run on any node, now and a few seconds later (a start still on its way would
    have started by then), and every slot free."""
    if run_id is not None:
        assert job_pids(run_id) == [], "a job of the interrupted run is running"
        time.sleep(5.0)
        assert job_pids(run_id) == [], "a job of the interrupted run started after it ended"
    assert _slots_free(inv), cddp("leases", str(inv), check_rc=0).stdout


def _interrupt(p, after: str, delay: float, sig=signal.SIGINT) -> tuple[int, list[str]]:
    try:
        lines = wait_for_line(p, after)
        time.sleep(delay)
        p.send_signal(sig)
        rest = p.communicate(timeout=240)[0]
    finally:
        p.kill()
    return p.wait(), lines + rest.splitlines()


def test_ctrl_c_before_the_run_is_recorded_leaves_nothing(bed, tmp_path):
    p, inv, runs = _up(bed, tmp_path)
    try:
        time.sleep(1.0)  # the CLI's start, the connections, the preflight and the lease: before `run ID`
        p.send_signal(signal.SIGINT)
        out = p.communicate(timeout=240)[0]
    finally:
        p.kill()
    # 130 as a shell reports it: the exit code, or (a Ctrl-C while Python is still importing, or
    # at its shutdown) the process ended by SIGINT itself, which the shell reports as 130 too
    assert p.wait() in (130, -signal.SIGINT), out
    recorded = [d.name for d in runs.iterdir() if d.is_dir()] if runs.exists() else []
    _nothing_left(inv, recorded[0] if recorded else None)


@pytest.mark.parametrize("delay", [0.1, 0.6])
def test_ctrl_c_while_the_starts_are_on_their_way_ends_every_job_they_start(bed, tmp_path, delay):
    p, inv, runs = _up(bed, tmp_path)
    rc, lines = _interrupt(p, "upload:", delay)
    text = "\n".join(lines)
    assert rc == 130 and "interrupted" in text, text
    run_id = _run_id(lines)
    _nothing_left(inv, run_id)
    rec = json.loads((runs / run_id / "run.json").read_text())
    assert rec["status"] == "stopped", rec["status"]
    assert all(n["state"] != "running" for n in rec["nodes"]), rec["nodes"]


def test_ctrl_c_while_the_job_runs_ends_it_collects_and_frees_its_slots(bed, tmp_path):
    p, inv, runs = _up(bed, tmp_path)
    rc, lines = _interrupt(p, "SEEN rank", 0.5)
    assert rc == 130, lines
    run_id = _run_id(lines)
    _nothing_left(inv, run_id)
    rec = json.loads((runs / run_id / "run.json").read_text())
    assert rec["status"] == "stopped" and all(n["state"] == "stopped" for n in rec["nodes"]), rec["nodes"]
    assert any("SEEN rank" in f.read_text() for f in (runs / run_id / "logs").glob("*.log"))


def test_sigkill_while_the_starts_are_on_their_way_leaves_a_run_that_stop_ends(bed, tmp_path):
    p, inv, runs = _up(bed, tmp_path)
    rc, lines = _interrupt(p, "upload:", 0.3, sig=signal.SIGKILL)
    assert rc == -signal.SIGKILL
    run_id = _run_id(lines)
    assert json.loads((runs / run_id / "run.json").read_text())["status"] == "running"  # nothing could say more
    cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "2", check_rc=0, timeout=180)
    assert eventually(lambda: job_pids(run_id) == [], 30)
    _nothing_left(inv, run_id)
    assert json.loads((runs / run_id / "run.json").read_text())["status"] == "stopped"


def test_sigkill_before_the_run_is_recorded_leaves_no_slot_held(bed, tmp_path):
    p, inv, runs = _up(bed, tmp_path)
    try:
        time.sleep(1.0)  # connecting, the preflight, the lease
        p.kill()
    finally:
        p.kill()
    p.wait()
    recorded = [d.name for d in runs.iterdir() if d.is_dir()] if runs.exists() else []
    if recorded:  # it got as far as the start (a loaded machine's timing): what started is `stop`'s
        cddp("stop", recorded[0], "--runs-dir", str(runs), "--grace", "2", timeout=180)
    # a lease's holder sees its launcher's channel go and gives the slots back by itself
    assert eventually(lambda: _slots_free(inv), 60), cddp("leases", str(inv), check_rc=0).stdout
    _nothing_left(inv, recorded[0] if recorded else None)


def test_sigkill_while_the_job_runs_leaves_it_running_for_stop(bed, tmp_path):
    p, inv, runs = _up(bed, tmp_path)
    rc, lines = _interrupt(p, "SEEN rank", 0.3, sig=signal.SIGKILL)
    assert rc == -signal.SIGKILL
    run_id = _run_id(lines)
    assert job_pids(run_id), "the job runs detached on its nodes: a dead launcher does not end it"
    assert not _slots_free(inv)  # held by the running job, not by the launcher
    cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "2", check_rc=0, timeout=180)
    assert eventually(lambda: job_pids(run_id) == [], 30)
    _nothing_left(inv, run_id)
