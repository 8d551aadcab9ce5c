"""Run history and control on the test bed: detach, runs, status, logs, stop, collect, launcher death."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from clusterddp.store import RunStore
from helpers import cddp, cddp_popen, eventually, job_pids, job_script, record, run_id_of, wait_for_line

pytestmark = pytest.mark.integration

TICKER = r'''
import os, sys, time
rank = int(os.environ["RANK"])
n = int(os.environ.get("CDDP_TEST_TICKS", "600"))
if rank == 0:
    os.makedirs("checkpoints", exist_ok=True)
    with open("checkpoints/weights.bin", "wb") as f:
        f.write(os.urandom(3 << 20))
os.write(1, f"rank {rank} ready\n".encode())
for i in range(n):
    os.write(1, f"rank {rank} tick {i}\n".encode())
    time.sleep(0.25)
os.write(1, f"rank {rank} finished\n".encode())
'''


@pytest.fixture
def ticker(tmp_path) -> Path:
    return job_script(tmp_path, "ticker.py", TICKER)


def last_tick(node, run_id: str) -> int:
    """The newest tick in the node's own log (the nodes share this filesystem), -1 before the first."""
    log = Path(node.workdir) / "runs" / run_id / ".clusterddp" / node.name / "node.log"
    ticks = re.findall(r"rank \d+ tick (\d+)", log.read_text()) if log.is_file() else []
    return max(map(int, ticks), default=-1)


def up_detached(inv, script, runs, *extra) -> str:
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), "--gpus", "1", "--detach", *extra, check_rc=0,
             timeout=60)
    assert "clusterddp stop" in r.stdout
    return run_id_of(r.stdout)


def test_detach_then_runs_status_logs_stop(bed, tmp_path, ticker):
    runs = tmp_path / "runs"
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    t0 = time.monotonic()
    run_id = up_detached(inv, ticker, runs, "--name", "nightly")
    assert time.monotonic() - t0 < 30  # returns once started, long before the job's 150 s
    rows = json.loads(cddp("runs", "--json", "--runs-dir", str(runs), check_rc=0).stdout)
    assert rows[0]["run_id"] == run_id and rows[0]["status"] == "running" and rows[0]["name"] == "nightly"
    st = cddp("status", run_id, "--runs-dir", str(runs), check_rc=0).stdout
    assert f"run {run_id}: running" in st and "node1: running" in st and "node2: running" in st
    bed.wait_until_written(run_id, "tick 2", timeout=60)  # then `logs` says so at its first ask
    assert eventually(lambda: "tick 2" in cddp("logs", run_id, "--runs-dir", str(runs)).stdout, 60)
    out = cddp("logs", run_id, "--runs-dir", str(runs), "--host", "node2", "--tail", "1", check_rc=0).stdout
    assert out.count("\n") == 1 and out.startswith("[node2] ")
    stop = cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "3", check_rc=0).stdout
    assert f"run {run_id}: stopped" in stop
    assert "node1: stopped (exit code" in stop and "node2: stopped (exit code" in stop, stop
    assert eventually(lambda: not job_pids(run_id), 10), job_pids(run_id)
    st = cddp("status", run_id, "--runs-dir", str(runs), check_rc=0).stdout  # the same words as stop's
    assert f"run {run_id}: stopped" in st
    assert "node1: stopped (exit code" in st and "node2: stopped (exit code" in st, st
    assert record(runs, run_id)["status"] == "stopped"
    assert "tick" in (runs / run_id / "logs" / "node1.log").read_text()  # stop collected the logs
    table = cddp("runs", "--runs-dir", str(runs), check_rc=0).stdout
    assert run_id in table and "stopped" in table and "nightly" in table


def test_job_survives_launcher_sigkill_and_can_be_stopped_later(bed, tmp_path, ticker):
    runs = tmp_path / "runs"
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    p = cddp_popen("up", str(inv), str(ticker), "--runs-dir", str(runs), "--gpus", "1")
    lines = wait_for_line(p, "rank 1 ready")
    run_id = run_id_of(lines[0])
    p.send_signal(signal.SIGKILL)  # the laptop closes
    p.wait(timeout=10)
    # The job carries on without its launcher: every node's log keeps growing (2 s of ticks).
    at_kill = {n.name: last_tick(n, run_id) for n in bed.nodes}
    assert eventually(lambda: all(last_tick(n, run_id) >= at_kill[n.name] + 8 for n in bed.nodes), 60), \
        (at_kill, {n.name: last_tick(n, run_id) for n in bed.nodes})
    pids = job_pids(run_id)
    assert pids, "the job died with its launcher"
    for node in bed.nodes:
        assert (Path(node.workdir) / "runs" / run_id / ".clusterddp" / node.name / "pid").is_file()
    st = cddp("status", run_id[:17], "--runs-dir", str(runs), check_rc=0).stdout  # a prefix is enough
    assert f"run {run_id}: running" in st
    assert cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "3", check_rc=0)
    assert eventually(lambda: not job_pids(run_id), 10)
    for node in bed.nodes:
        assert eventually(lambda node=node: not bed.ns_pids(node), 10), bed.ns_pids(node)


def test_logs_follow_streams_until_the_run_ends_and_status_records_success(bed, tmp_path, ticker):
    runs = tmp_path / "runs"
    inv = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"env": {"CDDP_TEST_TICKS": "12"}})
    run_id = up_detached(inv, ticker, runs)
    r = cddp("logs", run_id, "--follow", "--runs-dir", str(runs), check_rc=0, timeout=120)
    assert "[node1] rank 0 finished" in r.stdout and "[node2] rank 1 finished" in r.stdout
    assert r.stdout.count("[node2] rank 1 tick 11") == 1  # no line twice across the catch-up and the follow
    # `runs` asks no node: the run that ended is "running" as of the last look, and it says so
    table = cddp("runs", "--runs-dir", str(runs), check_rc=0)
    assert "running (as of " in table.stdout and f"clusterddp status {run_id}` looks now" in table.stderr, table
    # As the issue met it: started 10 min ago, and each node's own clock says when its job ended
    start = int(time.time()) - 600
    RunStore(runs).update(run_id, lambda r: replace(r, started_at=datetime.fromtimestamp(start, timezone.utc)
                                                    .isoformat()))
    for node, after in zip(bed.nodes, (60, 65), strict=True):
        os.utime(Path(node.workdir) / "runs" / run_id / ".clusterddp" / node.name / "exit_code",
                 (start + after, start + after))
    st = cddp("status", run_id[-4:], "--runs-dir", str(runs), check_rc=0).stdout  # the id's random end names it
    assert st.splitlines()[-1] == "run " + run_id + ": succeeded", st
    rec = record(runs, run_id)
    assert rec["status"] == "succeeded" and [n["exit_code"] for n in rec["nodes"]] == [0, 0]
    assert rec["ended_at"] == datetime.fromtimestamp(start + 65, timezone.utc).isoformat(timespec="seconds"), rec


def test_collect_repairs_a_truncated_copy_and_skips_whole_files(bed, tmp_path, ticker):
    runs = tmp_path / "runs"
    inv = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"env": {"CDDP_TEST_TICKS": "1"}},
                              extra={"collect": ["checkpoints/**"]})
    r = cddp("up", str(inv), str(ticker), "--runs-dir", str(runs), "--gpus", "1", "--collect", "nothing/*.pt",
             check_rc=0)
    run_id = run_id_of(r.stdout)
    # said at the end of the run: a glob that matched nothing on every node (not one that matched on node1 only)
    assert r.stderr.count("matched no file") == 1 and "collect: warning: collect glob 'nothing/*.pt' matched no " \
        "file on any node" in r.stderr, r.stderr
    local = runs / run_id / "artifacts" / "node1" / "checkpoints" / "weights.bin"
    remote = Path(bed.nodes[0].workdir) / "runs" / run_id / "checkpoints" / "weights.bin"
    assert local.read_bytes() == remote.read_bytes()
    with open(local, "r+b") as f:
        f.truncate(1000)
    out = cddp("collect", run_id, "--runs-dir", str(runs), check_rc=0).stdout
    assert "node1: 1 fetched" in out
    assert local.read_bytes() == remote.read_bytes()
    with open(local, "r+b") as f:  # same size, one byte flipped: only a hash can tell
        f.seek(100)
        b = f.read(1)
        f.seek(100)
        f.write(bytes([b[0] ^ 0xFF]))
    assert "node1: 1 fetched" in cddp("collect", run_id, "--runs-dir", str(runs), check_rc=0).stdout
    assert local.read_bytes() == remote.read_bytes()
    t0 = time.monotonic()
    out = cddp("collect", run_id, "--runs-dir", str(runs), check_rc=0).stdout
    assert "node1: 0 fetched (0.0 MB), 1 already whole" in out and time.monotonic() - t0 < 10
    # after the fact: files the run was not started to collect, from every node (its globs are left out)
    r = cddp("collect", run_id, "--runs-dir", str(runs), "--glob", "*.py", "--glob", "no/such/*", check_rc=0)
    assert "node1: 1 fetched" in r.stdout and "node2: 1 fetched" in r.stdout, r.stdout
    for node in ("node1", "node2"):
        assert (runs / run_id / "artifacts" / node / "ticker.py").read_text() == ticker.read_text()
    assert "collect glob 'no/such/*' matched no file on any node" in r.stderr and "'*.py'" not in r.stderr, r.stderr


LIVE_WRITER = r'''
import os, time
os.makedirs("checkpoints", exist_ok=True)
with open("checkpoints/done.bin", "wb") as f:
    f.write(os.urandom(1 << 20))
with open("checkpoints/live.bin", "wb") as f:
    f.write(os.urandom(16 << 20))
    f.flush()
    print("writing", flush=True)
    for _ in range(100000):
        f.write(b"x" * 4096)
        f.flush()
        time.sleep(0.001)
'''


def test_collect_of_a_running_job_skips_the_file_it_is_writing(bed, tmp_path):
    live = job_script(tmp_path, "live.py", LIVE_WRITER)
    runs = tmp_path / "runs"
    inv = bed.write_inventory(tmp_path / "inv.yaml", extra={"collect": ["checkpoints/**"]})
    run_id = up_detached(inv, live, runs)
    try:
        bed.wait_until_written(run_id, "writing", nodes=bed.nodes[:1], timeout=60)
        assert eventually(lambda: "writing" in cddp("logs", run_id, "--runs-dir", str(runs)).stdout, 60)
        out = cddp("collect", run_id, "--runs-dir", str(runs), check_rc=0).stdout
        assert "node1: 1 fetched" in out and "1 skipped (still being written)" in out, out
        got = runs / run_id / "artifacts" / "node1" / "checkpoints"
        assert sorted(p.name for p in got.iterdir()) == ["done.bin"]  # no live.bin, no .part
    finally:
        cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "2", check_rc=0, timeout=60)


def test_unknown_and_ambiguous_run_ids_exit_2(tmp_path):
    runs = tmp_path / "runs"
    for rid in ("20261129-100000-aaaa", "20261129-100000-aaab"):
        (runs / rid).mkdir(parents=True)
        (runs / rid / "run.json").write_text(json.dumps({"run_id": rid, "nodes": [], "status": "running"}))
    r = cddp("status", "20261129-1000", "--runs-dir", str(runs))
    assert r.returncode == 2 and "matches 2 runs" in r.stderr
    r = cddp("logs", "nope", "--runs-dir", str(runs))
    assert r.returncode == 2 and "no run matches 'nope'" in r.stderr and "Traceback" not in r.stderr


def test_an_unreachable_node_is_reported_in_bounded_time(make_bed, tmp_path, ticker):
    bed = make_bed(2)
    runs = tmp_path / "runs"
    inv = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"connect_timeout": 3})
    doc = yaml.safe_load(inv.read_text())
    doc["hosts"][1]["connect_timeout"] = 8  # node2 is waited for longer than node1 takes to answer
    inv.write_text(yaml.safe_dump(doc))
    run_id = up_detached(inv, ticker, runs)
    subprocess.run(["ip", "link", "set", bed.nodes[1].veth, "down"], check=True)
    try:
        t0 = time.monotonic()
        p = cddp_popen("status", run_id, "--runs-dir", str(runs))
        killer = threading.Timer(60, p.kill)
        killer.start()
        assert p.stdout is not None
        came = [(time.monotonic() - t0, line) for line in p.stdout]  # each line as it is printed
        killer.cancel()
        took = time.monotonic() - t0
        assert p.wait() == 0, came
        at = {line.split(":")[0].strip(): t for t, line in came if line.startswith("  ")}
        out = "".join(line for _, line in came)
        assert "node1: running" in out and "node2: unreachable" in out, out
        assert took < 20, f"status took {took:.1f}s with a node down"
        # node1's line is printed as it answers, not once node2's 8 s connect timeout is over
        assert at["node1"] <= at["node2"] - 1, came
    finally:
        subprocess.run(["ip", "link", "set", bed.nodes[1].veth, "up"], check=True)
    cddp("stop", run_id, "--runs-dir", str(runs), "--grace", "2", check_rc=0, timeout=60)
    assert eventually(lambda: not job_pids(run_id), 10)
