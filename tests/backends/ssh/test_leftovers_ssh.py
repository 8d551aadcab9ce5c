"""What a lost host kept running, for real (issue 39 sections 1 and 6): a private 3-node bed, real
torchrun (gloo, CPU), a plain script in the tutorial's style (rank 0 saves snapshot.pt in its run
folder every epoch with torch.save; every rank loads it at start), a node's link cut mid-run (its
veth down). A rank cut off from its peers waits in its collective for ever, as one in NCCL's does:
the lost host's part of the job runs on, holding its GPU slots. One test, four runs, to keep the time
small:

1. node2 cut, the run goes on with node1 alone (--nodes 1:2); node2 answers again before the run
   ends: the end of the run ends what node2 kept running of it;
2. node3 cut and still out of reach when the run ends (said, bounded); it answers again, its part
   of the job still running: a new run on node1 + node3 right after starts without a `stop`, ending
   that leftover (said) and taking its slots;
3. node2 down when a run starts, with node3 listed as a spare: the spare runs in its place (said).
"""

from __future__ import annotations

import re
import subprocess
import time

import pytest

from helpers import cddp, cddp_popen, eventually, host_pids, job_script, record, run_id_of, wait_for_line

pytestmark = pytest.mark.integration

SNAPSHOT = r'''
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
epoch = torch.load("snapshot.pt")["epoch"] if os.path.exists("snapshot.pt") else 0
print(f"rank {rank} resumes at epoch {epoch} world={world}", flush=True)
while epoch < 40:
    t = torch.ones(1)
    try:
        dist.all_reduce(t)
    except Exception:
        while True:  # cut off from its peers: stuck, as a rank in an NCCL collective is
            time.sleep(1)
    epoch += 1
    if rank == 0:
        torch.save({"epoch": epoch}, "snapshot.pt")
        print(f"epoch {epoch}", flush=True)
    time.sleep(0.25)
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} done world={world}", flush=True)
'''


def cut(node) -> None:
    subprocess.run(["ip", "link", "set", node.veth, "down"], check=True)


def mend(node) -> None:
    subprocess.run(["ip", "link", "set", node.veth, "up"], check=True)


def lost_run(inventory, script, runs, node, *, mend_when: str | None) -> tuple[str, str, int]:
    """A run on node1 + ``node`` with --nodes 1:2, ``node`` cut once rank 0 has saved a few epochs;
    mended once ``mend_when`` is printed (None: once the run has ended). (run id, output, exit code)."""
    p = cddp_popen("up", str(inventory), str(script), "--runs-dir", str(runs), "--gpus", "1", "--nodes", "1:2")
    try:
        lines = wait_for_line(p, "[node1] epoch 3", timeout=240)
        run_id = run_id_of(lines[0])
        cut(node)
        if mend_when is not None:
            lines += wait_for_line(p, mend_when, timeout=240)
            mend(node)
        rest, _ = p.communicate(timeout=400)
    finally:
        p.kill()
        mend(node)
    return run_id, "".join(lines) + rest, p.returncode


def test_a_lost_hosts_leftover_is_ended_at_the_runs_end_or_by_the_next_run(make_bed, tmp_path):
    bed = make_bed(3)
    node1, node2, node3 = bed.nodes
    runs = tmp_path / "runs"
    script = job_script(tmp_path, "snapshot_train.py", SNAPSHOT)
    fast = {"connect_timeout": 3, "gpus": 1}  # one slot a node: a leftover holding it keeps a run out

    # 1. node2 cut, back before the run ends: the run's end ends what it kept running.
    pair = bed.write_inventory(tmp_path / "pair.yaml", [node1, node2], defaults_extra=fast)
    run1, out, rc = lost_run(pair, script, runs, node2, mend_when="node2 out, going on with 1 node")
    assert rc == 0, out
    assert re.search(r"\[node1\] rank 0 resumes at epoch [1-9]\d* world=1", out), out
    assert re.search(r"\[clusterddp\] node2: lost in an earlier attempt: ended by SIG(TERM|KILL)", out), out
    assert not host_pids(run1, "node2")
    assert "lost_nodes" not in record(runs, run1)

    # 2. node3 cut, still out of reach at the end: said, and the end comes all the same (bounded).
    other = bed.write_inventory(tmp_path / "other.yaml", [node1, node3], defaults_extra=fast)
    t0 = time.monotonic()
    run2, out, rc = lost_run(other, script, runs, node3, mend_when=None)
    assert rc == 0, out
    assert re.search(r"\[clusterddp\] node3: lost in an earlier attempt: not stopped: .*; it is ended by the next "
                     rf"run that finds its slots held, or by `clusterddp stop {run2}`", out), out
    assert time.monotonic() - t0 < 400
    # node3 answers again; its part of run 2 runs on there, holding its slot
    assert eventually(lambda: host_pids(run2, "node3"), 10), "node3's part of the run ended by itself"
    assert record(runs, run2)["status"] == "succeeded"
    # a new run on the same hosts right after starts, without a `stop`
    r = cddp("up", str(other), str(script), "--runs-dir", str(runs), "--gpus", "1", check_rc=0, timeout=300)
    said = r.stdout + r.stderr
    assert (f"[clusterddp] node3: slots 0 were held by run {run2}, which has ended (succeeded): what was left of it "
            "there is ended; taking them") in r.stderr, said
    assert run_id_of(r.stdout) != run2
    assert "rank 1 done world=2" in said and "does not fit" not in said, said
    assert not host_pids(run2, "node3")

    # 3. node2 down at the start, node3 a spare: node3 runs in its place.
    spare = {"name": node3.name, "address": node3.address, "workdir": node3.workdir}
    with_spare = bed.write_inventory(tmp_path / "spare.yaml", [node1, node2], defaults_extra=fast,
                                     extra={"spares": [spare]})
    cut(node2)
    try:
        r = cddp("up", str(with_spare), str(script), "--runs-dir", str(runs), "--gpus", "1", check_rc=0, timeout=300)
    finally:
        mend(node2)
    said = r.stdout + r.stderr
    assert re.search(r"\[clusterddp\] node2 does not answer \(.*\): spare node3 runs in its place", said), said
    run4 = run_id_of(r.stdout)
    assert [n["host"] for n in record(runs, run4)["nodes"]] == ["node1", "node3"]
    assert "[node3] rank 1 done world=2" in said, said
