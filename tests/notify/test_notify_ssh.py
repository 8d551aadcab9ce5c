"""Detached runs tell their end from node 0, on the test bed: a real HTTP server on this machine's side
of the bed's bridge (the nodes cannot reach its 127.0.0.1), real torchrun. A run stopped by
`clusterddp stop` is told once as stopped; a real gloo job that succeeds is told once, however often
the launcher looks at it afterwards; a receiver that never answers holds neither the job's end nor the
notifier for long; `check` says whether node 0 reaches each receiver."""

from __future__ import annotations

import json
import stat
import time
from pathlib import Path

import pytest

from helpers import cddp, eventually, host_pids, job_pids, job_script, run_id_of
from test_notify import TOKEN, Receiver

pytestmark = pytest.mark.integration

WAITS = r'''
import os, time
print(f"rank {os.environ['RANK']} ready", flush=True)
time.sleep(600)
'''

ALL_REDUCE = r'''
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
assert t.item() == dist.get_world_size()
print(f"rank {dist.get_rank()} sum {t.item():g}", flush=True)
dist.destroy_process_group()
'''


def url_file(tmp_path: Path, r: Receiver, name: str) -> Path:
    f = tmp_path / name
    f.write_text(r.url + "\n")
    f.chmod(0o600)
    return f


def ctl(bed, run_id: str) -> Path:
    node = bed.nodes[0]
    return Path(node.workdir) / "runs" / run_id / ".clusterddp" / node.name


def up_detached(inv: Path, script: Path, runs: Path):
    r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), "--gpus", "1", "--detach", check_rc=0, timeout=120)
    return run_id_of(r.stdout), r


def test_a_detached_run_is_told_once_by_node_0_stopped_or_ended(bed, tmp_path, receiver):
    told, hangs = receiver(host=bed.gateway), receiver(None, host=bed.gateway)
    got = tmp_path / "got.json"
    inv = bed.write_inventory(tmp_path / "inv.yaml", extra={"notify": [
        {"webhook_file": str(url_file(tmp_path, told, "told.url"))},
        {"webhook_file": str(url_file(tmp_path, hangs, "hangs.url")), "timeout": 1, "on": ["succeeded"]},
        {"command": f"cat >> {got}"}]})
    runs = tmp_path / "runs"
    node1 = bed.nodes[0].name

    # A run stopped by `clusterddp stop`: one "stopped" event, from node 0, which `stop` does not end.
    stopped, r = up_detached(inv, job_script(tmp_path, "waits.py", WAITS), runs)
    assert f"notify: node 0 ({node1}) tells this run's end to webhook {bed.gateway} ({inv}: notify[0]), " \
           f"webhook {bed.gateway} ({inv}: notify[1])" in r.stdout
    assert f"notify: command ({inv}: notify[2]) is not told of a detached run's end" in r.stderr
    request = ctl(bed, stopped) / "notify.json"
    assert stat.S_IMODE(request.stat().st_mode) == 0o600 and TOKEN in request.read_text()  # only there
    assert TOKEN not in r.stdout + r.stderr
    bed.wait_until_written(stopped, "ready", timeout=60)
    cddp("stop", stopped, "--runs-dir", str(runs), "--grace", "3", check_rc=0)
    assert eventually(lambda: len(told.posts) == 1, 60), told.posts
    ev = told.posts[0]["body"]
    assert (ev["event"], ev["status"], ev["exit_code"], ev["run_id"]) == ("stopped", "stopped", 130, stopped), ev
    assert ev["text"].startswith(f"clusterddp: run {stopped} was stopped in ") and ev["detached"] is True
    assert eventually(lambda: not request.exists(), 30)  # the URLs leave the node once told
    assert not hangs.posts and not got.exists()  # its `on` leaves stopped out; a command is the launcher's

    # A real gloo job that succeeds: one "succeeded" event, whatever the launcher does afterwards; the
    # receiver that never answers holds neither the job's end nor the notifier past its bound.
    ended, r = up_detached(inv, job_script(tmp_path, "all_reduce.py", ALL_REDUCE), runs)
    assert eventually(lambda: len(told.posts) == 2 and len(hangs.posts) >= 1, 120), (told.posts, hangs.posts)
    hung_at = time.monotonic()  # the receiver that never answers holds node 0's first try from here
    ev = told.posts[1]["body"]
    assert (ev["event"], ev["status"], ev["exit_code"], ev["run_id"]) == ("succeeded", "succeeded", 0, ended), ev
    assert ev["hosts"] == [n.name for n in bed.nodes] and ev["sent_by"] == f"node 0 ({node1})"
    assert ev["text"].startswith(f"clusterddp: run {ended} succeeded in ") and ev["failed_host"] is None
    assert (ctl(bed, ended) / "exit_code").read_text().strip() == "0"
    # Ended, not held: node 0's job is gone while its notifier still tries the receiver that never answers
    # (three tries of 1 s and 4 s of pauses, wall-clock). Node 0 tells as soon as its exit_code is written:
    # its shell may take a moment past that write, and node2's part ends on its own time.
    assert eventually(lambda: not host_pids(ended, node1), 30) and len(hangs.posts) < 3, hangs.posts
    assert eventually(lambda: not job_pids(ended), 30), job_pids(ended)
    st = cddp("status", ended, "--runs-dir", str(runs), check_rc=0).stdout
    assert f"run {ended}: succeeded" in st
    cddp("collect", ended, "--runs-dir", str(runs), check_rc=0)
    cddp("stop", ended, "--runs-dir", str(runs), "--grace", "1")  # after its end: leaves the stop mark
    log = ctl(bed, ended) / "notify.log"
    said = f"notify: webhook {bed.gateway} ({inv}: notify[1]) was not told of succeeded ({ended}): no answer within " \
           "1s after 3 tries; the run's outcome is unchanged"
    assert eventually(lambda: said in log.read_text(), 60), log.read_text()
    assert time.monotonic() - hung_at < 45  # three tries of 1 s and the pauses (4 s), on a loaded machine
    assert len(hangs.posts) == 3
    assert said in (ctl(bed, ended) / "node.log").read_text()  # in the run's log too
    assert eventually(lambda: not any(bed.ns_pids(n) for n in bed.nodes), 30)  # the notifier is gone too
    time.sleep(1)
    assert len(told.posts) == 2 and not got.exists()  # once each, the launcher's looks sent nothing
    assert json.loads((runs / ended / "run.json").read_text())["status"] == "succeeded"
    for path in (log, ctl(bed, ended) / "node.log", ctl(bed, stopped) / "notify.log"):
        assert TOKEN not in path.read_text()


def test_check_says_whether_node_0_reaches_each_receiver(bed, tmp_path, receiver):
    told = receiver(host=bed.gateway)
    inv = bed.write_inventory(tmp_path / "inv.yaml", extra={"notify": [
        {"webhook_file": str(url_file(tmp_path, told, "told.url"))},
        {"webhook": f"http://127.0.0.1:9/services/{TOKEN}"}]})  # node 0's own loopback: nothing listens there
    r = cddp("check", str(inv), check_rc=0, timeout=120)
    node1, port = bed.nodes[0].name, told.server.server_address[1]
    assert f"ok   {node1} notify: reaches {bed.gateway}:{port} " in r.stdout, r.stdout
    assert f"warn {node1} notify: webhook 127.0.0.1 ({inv}: notify[1]): node 0 cannot reach 127.0.0.1:9 (refused), " \
           "so a detached run's end, which node 0 tells, would not arrive" in r.stdout, r.stdout
    assert f"     fix: let {node1} open connections to 127.0.0.1:9" in r.stdout
    assert TOKEN not in r.stdout + r.stderr and not told.posts  # a connect, not a POST
