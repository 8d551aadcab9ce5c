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
- Ctrl-C during the end-of-run collect of a job that exited 0 everywhere (a plain job leaving a 256 MiB
  file; issue 40: recorded stopped, or running until `status`): exit 130, the record succeeded, each
  node succeeded with exit code 0, `clusterddp collect RUN` named and bringing the rest back whole, no
  half-received file left, no job, no slot held.
- SIGKILL there: the same record (the job's outcome is written before its files come back), no job,
  no slot held; the killed launcher's half-received file stays (`collect` cannot tell it from another
  collect's under way).
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


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return f"{pid} (gone)"


def _nothing_left(inv: Path, run_id: str | None) -> None:
    """No process of the run on any node, now and a few seconds later (a start still on its way would
    have started by then), and every slot free."""
    if run_id is not None:
        left = job_pids(run_id)
        assert left == [], ("a job of the interrupted run is running: "
                            + "; ".join(_cmdline(pid) for pid in left))
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


# A plain job that succeeds everywhere and leaves a file big enough that bringing it back takes a while:
# rank 0 writes 256 MiB (one random MiB again and again: nothing on the way compresses it), then exits 0.
BIG = r'''
import os
if os.environ["RANK"] == "0":
    block = os.urandom(1 << 20)
    with open("big.bin", "wb") as f:
        for _ in range(256):
            f.write(block)
print("WROTE rank", os.environ["RANK"], flush=True)
'''


def _up_big(bed, tmp_path: Path):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    job = job_script(tmp_path, "job.py", BIG)
    runs = tmp_path / "runs"
    p = cddp_popen("up", str(inv), str(job), "--runs-dir", str(runs), "--collect", "big.bin")
    return p, inv, runs


def _during_the_collect(p, runs: Path, sig) -> tuple[int, str, str]:
    """Signal ``p`` once big.bin is on its way here (its ``.part`` in the run's artifacts folder): the
    job has ended everywhere, the end-of-run collect is under way. (exit code, run id, output)."""
    try:
        lines = wait_for_line(p, "run ")
        run_id = _run_id(lines)
        arriving = runs / run_id / "artifacts"
        assert eventually(lambda: any(arriving.glob("*/big.bin.*.part")), 180, interval=0.01), \
            "big.bin never started to come back"
        p.send_signal(sig)
        rest = p.communicate(timeout=240)[0]
    finally:
        p.kill()
    return p.wait(), run_id, "".join(lines) + rest


def _collected_whole(runs: Path, run_id: str, parts_left: bool = False) -> None:
    """`collect RUN` brings big.bin back whole; no half-received file is left (``parts_left``: but for
    the ones a killed launcher left, which nothing here can tell from another collect's under way)."""
    before = set((runs / run_id / "artifacts").rglob("*.part"))
    cddp("collect", run_id, "--runs-dir", str(runs), check_rc=0, timeout=180)
    got = list((runs / run_id / "artifacts").glob("*/big.bin"))
    assert [f.stat().st_size for f in got] == [256 << 20], got
    left = set((runs / run_id / "artifacts").rglob("*.part"))
    assert left <= (before if parts_left else set()), f"a half-received file was left behind: {left}"


def test_ctrl_c_during_the_collect_of_a_run_that_succeeded_records_it_succeeded(bed, tmp_path):
    # Issue 40: the run was recorded stopped (or left running until `status`), though its job succeeded
    # everywhere: only the collect was cut short.
    p, inv, runs = _up_big(bed, tmp_path)
    rc, run_id, out = _during_the_collect(p, runs, signal.SIGINT)
    assert rc == 130, out
    assert (f"collect interrupted: the run is recorded succeeded; `clusterddp collect {run_id}` fetches its "
            "logs and files") in out, out
    rec = json.loads((runs / run_id / "run.json").read_text())
    assert rec["status"] == "succeeded" and rec["ended_at"], rec
    assert [(n["state"], n["exit_code"]) for n in rec["nodes"]] == [("succeeded", 0)] * 2, rec["nodes"]
    _nothing_left(inv, run_id)
    _collected_whole(runs, run_id)


def test_sigkill_during_the_collect_of_a_run_that_succeeded_leaves_it_recorded_succeeded(bed, tmp_path):
    # The job's outcome is recorded before its files come back: a launcher killed during the collect
    # (a closed laptop) leaves a record that says what the job did, not running until `status` looks
    p, inv, runs = _up_big(bed, tmp_path)
    rc, run_id, out = _during_the_collect(p, runs, signal.SIGKILL)
    assert rc == -signal.SIGKILL, out
    rec = json.loads((runs / run_id / "run.json").read_text())
    assert rec["status"] == "succeeded" and rec["ended_at"], rec
    assert [(n["state"], n["exit_code"]) for n in rec["nodes"]] == [("succeeded", 0)] * 2, rec["nodes"]
    _nothing_left(inv, run_id)
    _collected_whole(runs, run_id, parts_left=True)
