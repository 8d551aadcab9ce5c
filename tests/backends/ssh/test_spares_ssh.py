"""Spare hosts and fewer nodes, for real (issue 26 section 1): a private 3-node bed, real torchrun
(gloo, CPU), a node's link cut mid-run (its veth down). One test, three runs, to keep the time small:

1. a rank raising a Python exception, with a spare and `restarts: 1`: not moved to the spare;
2. examples/ddp_train.py on node1 + node2 with node3 a spare: node2 cut after a checkpoint exists, the
   run carries on on node1 + node3 from that checkpoint and succeeds;
3. a plain torch script (no clusterddp.train) with --nodes 1:2 and no spare: node2 cut, the run
   finishes on node1 alone from where it was.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import REPO, cddp, cddp_popen, eventually, host_pids, record, run_id_of, wait_for_line

pytestmark = pytest.mark.integration

RAISES = r'''
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("bad batch shape in the user's own code")
dist.barrier()
dist.destroy_process_group()
'''

# A plain torch script that resumes by itself: rank 0 keeps the step it reached in a file of its run
# folder (the launcher knows nothing of it).
STEPS = r'''
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
start = int(open("progress.txt").read()) if os.path.exists("progress.txt") else 0
if rank == 0:
    os.write(1, f"start at step {start} world={world}\n".encode())
for step in range(start, 40):
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        with open("progress.tmp", "w") as f:
            f.write(str(step + 1))
        os.replace("progress.tmp", "progress.txt")
    time.sleep(0.25)
dist.barrier()
dist.destroy_process_group()
if rank == 0:
    os.write(1, f"finished at step 40 world={world}\n".encode())
'''


def kill_left(run_id: str, host: str) -> None:
    """A cut-off node's job runs on there (nobody can reach it): end it, so the next run finds its slots free."""
    for pid in host_pids(run_id, host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert eventually(lambda: not host_pids(run_id, host), 20), host_pids(run_id, host)


def cut(node) -> None:
    subprocess.run(["ip", "link", "set", node.veth, "down"], check=True)


def mend(node) -> None:
    subprocess.run(["ip", "link", "set", node.veth, "up"], check=True)


def run_folder(node, run_id: str) -> Path:
    return Path(node.workdir) / "runs" / run_id


def test_a_lost_host_is_replaced_by_a_spare_or_the_run_goes_on_with_fewer_but_an_exception_is_not_moved(
        make_bed, tmp_path):
    bed = make_bed(3)
    node1, node2, node3 = bed.nodes
    runs = tmp_path / "runs"
    spare = {"name": node3.name, "address": node3.address, "workdir": node3.workdir}
    with_spare = bed.write_inventory(tmp_path / "spare.yaml", [node1, node2], defaults_extra={"connect_timeout": 3},
                                     extra={"spares": [spare]})
    job = tmp_path / "job"
    job.mkdir()
    (job / "raises.py").write_text(RAISES)
    (job / "steps.py").write_text(STEPS)

    # 1. The job's own exception would fail on any machine: the run fails as it always did, naming it,
    # and the spare is never touched (`restarts: 1` in the inventory: new attempts, no torchrun restarts).
    restarts = bed.write_inventory(tmp_path / "restarts.yaml", [node1, node2], defaults_extra={"connect_timeout": 3},
                                   extra={"spares": [spare], "restarts": 1})
    r = cddp("up", str(restarts), str(job / "raises.py"), "--runs-dir", str(runs), "--gpus", "1",
             check_rc=1, timeout=240)
    out = r.stdout + r.stderr
    run1 = run_id_of(r.stdout)
    assert "ValueError" in out and "bad batch shape" in out, out
    assert "not moved to another machine" in out and "attempt 2" not in out, out
    rec = record(runs, run1)
    assert rec["status"] == "failed" and [n["host"] for n in rec["nodes"]] == ["node1", "node2"], rec
    assert [(a["attempt"], a["in"]) for a in rec["attempts"]] == [(None, [])], rec["attempts"]
    assert not run_folder(node3, run1).exists(), "the spare was used for the job's own exception"

    # 2. node2 cut off after ddp_train.py wrote a checkpoint: the spare node3 takes its place, the code is
    # sent there, and the run resumes from node1's newest checkpoint (node1 stays rank 0) and succeeds.
    p = cddp_popen("up", str(with_spare), str(REPO / "examples" / "ddp_train.py"), "--runs-dir", str(runs),
                   "--gpus", "1", "--max-restarts", "1", "--", "--epochs", "60")
    run2 = None
    try:
        lines = wait_for_line(p, "[node2] [clusterddp] node", timeout=180)
        run2 = run_id_of(lines[0])
        ckpts = run_folder(node1, run2) / "checkpoints"
        assert eventually(lambda: any(ckpts.glob("step-*.pt")), 180, 0.05), "".join(lines)
        cut(node2)
        t0 = time.monotonic()
        rest, _ = p.communicate(timeout=400)
        took = time.monotonic() - t0
    finally:
        p.kill()
        mend(node2)
    out = "".join(lines) + rest
    print(f"spare run: {took:.1f}s from the cut to the end")
    assert p.returncode == 0, out
    assert re.search(r"\[clusterddp\] attempt 2 of run \S+: node2 out, node3 in \(node2 lost", out), out
    resumed = re.search(r"\[node1\] resumed from step (\d+)", out)
    assert resumed and int(resumed.group(1)) > 0, out
    assert "[node3] [clusterddp] node 1/2 on node3" in out and "done world_size=2 final_step=" in out, out
    rec = record(runs, run2)
    assert rec["status"] == "succeeded", rec
    assert [(n["host"], n["node_rank"], n["state"]) for n in rec["nodes"]] == [
        ("node1", 0, "succeeded"), ("node3", 1, "succeeded")], rec["nodes"]
    (a,) = rec["attempts"]
    assert (a["attempt"], a["out"], a["in"]) == (2, ["node2"], ["node3"]) and "node2 lost" in a["why"], a
    assert (run_folder(node3, run2) / "ddp_train.py").is_file()  # the code went to the spare
    # attempt 1's logs are kept apart; the run's logs are the last attempt's hosts'
    assert "resumed from step" in (runs / run2 / "logs" / "node1.log").read_text()
    assert "[clusterddp] node 1/2 on node2" in (runs / run2 / "logs" / "attempt-1" / "node2.log").read_text()
    assert (run_folder(node1, run2) / ".clusterddp" / "node1@attempt-1" / "node.log").is_file()
    status = cddp("status", run2, "--runs-dir", str(runs), check_rc=0).stdout
    assert "node1" in status and "node3" in status and "attempt 2 (" in status and "node2 out, node3 in" in status
    rows = {r["run_id"]: r for r in json.loads(cddp("runs", "--json", "--runs-dir", str(runs), check_rc=0).stdout)}
    assert rows[run2]["hosts"] == "node1,node3", rows[run2]
    kill_left(run2, "node2")

    # 3. A plain torch script, --nodes 1:2 and no spare: node2 cut off, the run finishes on node1 alone,
    # from the step it had reached.
    no_spare = bed.write_inventory(tmp_path / "two.yaml", [node1, node2], defaults_extra={"connect_timeout": 3})
    p = cddp_popen("up", str(no_spare), str(job / "steps.py"), "--runs-dir", str(runs), "--gpus", "1",
                   "--nodes", "1:2")
    try:
        lines = wait_for_line(p, "start at step 0 world=2", timeout=180)
        run3 = run_id_of(lines[0])
        progress = run_folder(node1, run3) / "progress.txt"
        assert eventually(lambda: progress.is_file() and int(progress.read_text() or 0) >= 3, 120, 0.05)
        cut(node2)
        rest, _ = p.communicate(timeout=400)
    finally:
        p.kill()
        mend(node2)
    out = "".join(lines) + rest
    assert p.returncode == 0, out
    assert "node2 out, going on with 1 node" in out, out
    started = re.search(r"\[node1\] start at step (\d+) world=1", out)
    assert started and int(started.group(1)) >= 3, out
    assert "[node1] finished at step 40 world=1" in out, out
    rec = record(runs, run3)
    assert rec["status"] == "succeeded" and [n["host"] for n in rec["nodes"]] == ["node1"], rec
    assert [(a["attempt"], a["out"], a["in"]) for a in rec["attempts"]] == [(2, ["node2"], [])], rec["attempts"]
    kill_left(run3, "node2")
