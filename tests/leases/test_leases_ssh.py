"""GPU slot leases and the queue for real: 2 sshd hosts (2 slots each: no GPUs, `gpus: 2`), real torchrun."""

from __future__ import annotations

import json
import os
import re
import signal
from pathlib import Path

import pytest

from helpers import cddp, cddp_closed, cddp_popen, eventually, job_pids, job_script, run_id_of, wait_for_line

pytestmark = pytest.mark.integration

# Every rank reports what it was given, then holds its slots until the file named by HOLD_UNTIL exists.
# Plain python under the real torchrun (no torch import, no process group): what a lease gives a run is
# torchrun's env and its agent's master port, and each rank that imported torch would cost seconds of CI.
JOB = r'''
import json, os, sys, time
# one write per line: the ranks share stdout, and under python -u print() writes the newline apart
seen = {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "MASTER_PORT", "RANK", "LOCAL_WORLD_SIZE",
                                       "CLUSTERDDP_HOST")}
os.write(1, ("SEEN " + json.dumps(seen) + "\n").encode())
until = os.environ.get("HOLD_UNTIL")
while until and not os.path.exists(until):
    time.sleep(0.1)
'''


@pytest.fixture
def bed(make_bed):
    """A private bed per test (not the session's): a holder a failing test leaves running would
    otherwise keep the session bed's slots and master port from every later test."""
    return make_bed(2)


@pytest.fixture
def job(tmp_path):
    return job_script(tmp_path, "job.py", JOB)


def seen(bed, run_id: str, want: int) -> list[dict]:
    """The SEEN lines every rank of a detached run wrote to its node's log, once ``want`` are there."""
    def read() -> list[dict]:
        out = []
        for node in bed.nodes:
            log = Path(node.workdir) / "runs" / run_id / ".clusterddp" / node.name / "node.log"
            if log.exists():
                out += [json.loads(line[5:]) for line in log.read_text().splitlines() if line.startswith("SEEN ")]
        return out
    assert eventually(lambda: len(read()) >= want, 120), f"{run_id}: ranks seen: {read()}"
    return read()


def start(inv: Path, job: Path, runs: Path, *args: str, hold: Path) -> str:
    r = cddp("up", str(inv), str(job), "--runs-dir", str(runs), "--detach", "-e", f"HOLD_UNTIL={hold}", *args,
             check_rc=0)
    return run_id_of(r.stdout)


def id_in(line: str) -> str:
    """The run id of `up`'s first line about its run: `run ID` once recorded, or its queue line."""
    m = re.match(r"(?:\[clusterddp\] )?run (\S+)", line)
    assert m, line
    return m.group(1)


def user() -> str:
    from clusterddp.leases import launching_user
    return launching_user()


def test_a_run_that_does_not_fit_is_refused_naming_the_holder_and_with_wait_starts_once_the_holder_is_sigkilled(
        bed, tmp_path, job):
    """The first run holds every slot and never ends by itself: only its SIGKILL can free them."""
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    runs, hold = tmp_path / "runs", tmp_path / "never"
    # 2 processes per node: every slot of both nodes. Started as `up --detach 2>&1 | head -1` would: its
    # stdout closed before the lease and upload lines, which once left a recorded run never started
    r = cddp_closed("up", str(inv), str(job), "--runs-dir", str(runs), "--detach", "--name", "bert-base",
                    "-e", f"HOLD_UNTIL={hold}", cwd=tmp_path, both=True, timeout=240)
    assert r.returncode == 0
    [first] = [d.name for d in runs.iterdir() if d.is_dir()]
    seen(bed, first, 4)

    r = cddp("up", str(inv), str(job), "--runs-dir", str(runs), check_rc=75)
    assert f"held by run {first} (bert-base) of {user()}" in r.stderr and "slots 0,1" in r.stderr, r.stderr
    assert "node1" in r.stderr and "Traceback" not in r.stderr
    assert not re.search(r"^run ", r.stdout, re.M), r.stdout  # a refused run has no id: nothing to look up
    assert [d.name for d in runs.iterdir() if d.is_dir()] == [first], "a refused run starts nothing, not a record"
    assert all([d.name for d in (Path(n.workdir) / "runs").iterdir()] == [first] for n in bed.nodes), \
        "nor upload anything"

    listed = cddp("leases", str(inv), "--json", check_rc=0)
    hosts = {h["host"]: h for h in json.loads(listed.stdout)["hosts"]}
    for node in bed.nodes:
        (lease,) = hosts[node.name]["leases"]
        assert (lease["run"], lease["name"], lease["user"], lease["slots"], lease["state"]) == (
            first, "bert-base", user(), [0, 1], "running")
        assert hosts[node.name]["free"] == []
    # `top --inventory` shows the same leases beside the running run
    snap = json.loads(cddp("top", "--once", "--json", "--inventory", str(inv), "--runs-dir", str(runs),
                           check_rc=0, timeout=120).stdout.splitlines()[-1])
    assert [r["run_id"] for r in snap["runs"]] == [first]
    assert sorted((x["host"], x["run"], x["slots"], x["state"]) for x in snap["leases"]) == [
        (n.name, first, [0, 1], "running") for n in bed.nodes]

    p = cddp_popen("up", str(inv), str(job), "--runs-dir", str(runs), "--wait")
    try:
        lines = wait_for_line(p, "waiting in the queue: position 1")
        assert f"{first} (bert-base) of" in lines[-1], lines[-1]
        second = id_in(lines[-1])  # not recorded until it starts, so no `run ID` line yet: the queue line names it
        third = cddp_popen("up", str(inv), str(job), "--runs-dir", str(runs), "--wait")
        try:
            assert "position 2" in wait_for_line(third, "waiting in the queue")[-1]
            queued = json.loads(cddp("leases", str(inv), "--json", check_rc=0).stdout)["hosts"]
            assert len([w for h in queued for w in h["queue"]]) == 4
            third.send_signal(signal.SIGINT)  # Ctrl-C leaves the queue
            assert third.wait(timeout=60) == 130
        finally:
            third.kill()
        crashed = cddp_popen("up", str(inv), str(job), "--runs-dir", str(runs), "--wait")
        try:
            assert "position 2" in wait_for_line(crashed, "waiting in the queue")[-1]
        finally:
            crashed.kill()  # a waiter whose launcher dies: its SSH channels close, and its entries go with them
            crashed.wait()

        def queued() -> list[str]:
            hosts = json.loads(cddp("leases", str(inv), "--json", check_rc=0).stdout)["hosts"]
            return [w["run"] for h in hosts for w in h["queue"]]
        assert eventually(lambda: queued() == [second, second], 30), queued()
        text = cddp("leases", str(inv), check_rc=0).stdout
        assert text.count(first) == 2 and "running" in text and f"1. run {second} of {user()}" in text, text
        assert not job_pids(second), "the waiting run started while the first still held its slots"
        for pid in job_pids(first):  # a SIGKILLed job frees its slots by itself: the waiting run takes them
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        rest = p.communicate(timeout=180)[0]
        assert p.returncode == 0, "".join(lines) + rest
    finally:
        p.kill()
    assert rest.count("SEEN ") == 4 and "leased: node1 GPUs 0,1, node2 GPUs 0,1" in rest, rest
    after = json.loads(cddp("leases", str(inv), "--json", check_rc=0).stdout)["hosts"]
    assert all(h["leases"] == [] and h["queue"] == [] and h["free"] == [0, 1] for h in after), after


def test_two_runs_side_by_side_get_disjoint_slots_and_master_ports(bed, tmp_path, job):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    runs, hold = tmp_path / "runs", tmp_path / "release"
    try:
        a = start(inv, job, runs, "--gpus", "1", hold=hold)
        b = start(inv, job, runs, "--gpus", "1", hold=hold)
        sa, sb = seen(bed, a, 2), seen(bed, b, 2)
        for s in sa + sb:
            assert s["LOCAL_WORLD_SIZE"] == "1"
        assert {s["CUDA_VISIBLE_DEVICES"] for s in sa} == {"0"} and {s["CUDA_VISIBLE_DEVICES"] for s in sb} == {"1"}
        pa, pb = {s["MASTER_PORT"] for s in sa}, {s["MASTER_PORT"] for s in sb}
        assert len(pa) == len(pb) == 1 and pa != pb, (pa, pb)
        # a fixed choice that another run holds is refused, naming it
        r = cddp("up", str(inv), str(job), "--runs-dir", str(runs), "--hosts", "node1:0", check_rc=75)
        assert f"held by run {a} of {user()}" in r.stderr and "needs slots 0 on node1" in r.stderr, r.stderr
    finally:
        hold.touch()
    for run in (a, b):
        assert eventually(lambda run=run: not job_pids(run), 60)


def test_two_launchers_at_once_take_all_or_nothing_and_the_later_one_waits_its_turn(bed, tmp_path, job):
    """Both want every slot of both nodes at the same moment: no deadlock, no half-taken run; one runs
    while the other waits, then the other runs."""
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    runs, hold = tmp_path / "runs", tmp_path / "release"
    ps = [cddp_popen("up", str(inv), str(job), "--runs-dir", str(runs), "--wait", "-e", f"HOLD_UNTIL={hold}")
          for _ in range(2)]
    try:
        firsts = [wait_for_line(p, "run ")[-1] for p in ps]
        ids = [id_in(line) for line in firsts]
        assert eventually(lambda: sum(bool(job_pids(r)) for r in ids) == 1, 120), "exactly one run should start"
        running = next(r for r in ids if job_pids(r))
        waiting = ps[1 - ids.index(running)]
        said = firsts[1 - ids.index(running)]  # its first line is already its queue line, or comes next
        if "waiting in the queue" not in said:
            said = wait_for_line(waiting, "waiting in the queue")[-1]
        assert running in said, said
        seen(bed, running, 4)
        listed = json.loads(cddp("leases", str(inv), "--json", check_rc=0).stdout)["hosts"]
        assert [[x["run"] for x in h["leases"]] for h in listed] == [[running], [running]], listed
        hold.touch()
        outs = [p.communicate(timeout=240)[0] for p in ps]
        assert [p.returncode for p in ps] == [0, 0], outs
    finally:
        hold.touch()
        for p in ps:
            p.kill()
    for out in outs:
        assert out.count("SEEN ") == 4, out
