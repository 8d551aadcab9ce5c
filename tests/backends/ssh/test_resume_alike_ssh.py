"""Every node of a new attempt resumes from the same checkpoint (issue 39 section 1), for real: a plain
torch script written like the PyTorch DDP tutorial (no clusterddp import: rank 0 saves ``snapshot.pt`` at
a relative path with plain ``torch.save`` every few epochs, overwriting it in place; every rank loads it at
start when it is there and prints the epoch it resumes from), two nodes and a spare, a node's link cut
mid-run. Losing a host that is not rank 0's, then rank 0's own: the run carries on on the spare and every
rank of the new attempt prints the same resume point, past 0."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import cddp_popen, eventually, host_pids, record, run_id_of, wait_for_line

pytestmark = pytest.mark.integration

TUTORIAL = r'''
import os, sys, time
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.Linear(64, 64)
epochs_run = 0
if os.path.exists("snapshot.pt"):
    snapshot = torch.load("snapshot.pt")
    model.load_state_dict(snapshot["MODEL_STATE"])
    epochs_run = snapshot["EPOCHS_RUN"]
print(f"rank {rank} resuming training from snapshot at epoch {epochs_run}", flush=True)
ddp = DDP(model)
opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
for epoch in range(epochs_run, 150):
    opt.zero_grad()
    ddp(torch.ones(8, 64)).sum().backward()
    opt.step()
    time.sleep(0.3)
    if rank == 0 and epoch % 10 == 0:
        torch.save({"MODEL_STATE": ddp.module.state_dict(), "EPOCHS_RUN": epoch}, "snapshot.pt")
dist.barrier()
dist.destroy_process_group()
print(f"rank {rank} finished", flush=True)
'''


def cut(node) -> None:
    subprocess.run(["ip", "link", "set", node.veth, "down"], check=True)


def mend(node) -> None:
    subprocess.run(["ip", "link", "set", node.veth, "up"], check=True)


def kill_left(run_id: str, host: str) -> None:
    for pid in host_pids(run_id, host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert eventually(lambda: not host_pids(run_id, host), 20), host_pids(run_id, host)


@pytest.mark.parametrize("lost", ["node2", "node1"], ids=["not-rank-0", "rank-0"])
def test_every_rank_of_the_next_attempt_resumes_from_the_same_snapshot(make_bed, tmp_path, lost):
    bed = make_bed(3)
    nodes = {n.name: n for n in bed.nodes}
    node1, node2, node3 = bed.nodes
    runs = tmp_path / "runs"
    spare = {"name": node3.name, "address": node3.address, "workdir": node3.workdir}
    inventory = bed.write_inventory(tmp_path / "spare.yaml", [node1, node2], defaults_extra={"connect_timeout": 3},
                                    extra={"spares": [spare]})
    job = tmp_path / "job"
    job.mkdir()
    (job / "multinode.py").write_text(TUTORIAL)
    p = cddp_popen("up", str(inventory), str(job / "multinode.py"), "--runs-dir", str(runs), "--gpus", "1",
                   "--max-restarts", "1", env={"CLUSTERDDP_MIRROR_INTERVAL": "1"})
    run_id = None
    try:
        lines = wait_for_line(p, "[node2] [clusterddp] node", timeout=180)
        run_id = run_id_of(lines[0])
        index = runs / run_id / "mirror.json"

        def mirrored() -> bool:  # the launcher holds a snapshot.pt of an epoch past 0
            try:
                doc = json.loads(index.read_text())
            except (OSError, ValueError):
                return False
            held = [f for c in doc["checkpoints"] for f in c["files"] if f["path"] == "snapshot.pt"]
            return bool(held) and _epoch(runs / run_id / "artifacts" / "node1" / "snapshot.pt") > 0
        assert eventually(mirrored, 240, 0.2), f"no snapshot.pt past epoch 0 mirrored from node1: {index}"
        cut(nodes[lost])
        rest, _ = p.communicate(timeout=400)
    finally:
        p.kill()
        mend(nodes[lost])
    out = "".join(lines) + rest
    assert p.returncode == 0, out
    assert re.search(rf"\[clusterddp\] attempt 2 of run \S+: {lost} out, node3 in", out), out
    second = out.split("attempt 2 of run", 1)[1]
    resumed = re.findall(r"\[(node\d)\] rank (\d) resuming training from snapshot at epoch (\d+)", second)
    assert sorted(h for h, _, _ in resumed) == sorted(h for h in ("node1", "node2", "node3") if h != lost), out
    epochs = {int(e) for _, _, e in resumed}
    assert len(epochs) == 1 and epochs.pop() > 0, out  # every rank from the same snapshot, past the start
    for host in ("node1", "node2", "node3"):
        if host != lost:
            assert re.search(rf"\[clusterddp\] {host} seeded with the mirrored checkpoint snapshot.pt", out), out
    assert len(re.findall(r"\] rank \d finished", second)) == 2, out
    rec = record(runs, run_id)
    assert rec["status"] == "succeeded", rec
    kill_left(run_id, lost)


def _epoch(path: Path) -> int:
    import torch
    try:
        return int(torch.load(path)["EPOCHS_RUN"])
    except Exception:  # noqa: BLE001 - being replaced: not yet
        return -1


# Node 0's ranks resume at epoch 30, node 1's at 0 (as when only rank 0's host kept its snapshot): node 0's
# finish first and its torchrun waits in its exit barrier, while node 1's lose their peers and restart.
SPLIT = r'''
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
start = 30 if os.environ["GROUP_RANK"] == "0" else 0
print(f"rank {rank} resuming training from snapshot at epoch {start}", flush=True)
for epoch in range(start, 40):
    t = torch.ones(1)
    dist.all_reduce(t)
    time.sleep(0.1)
dist.destroy_process_group()
'''


def test_ranks_that_resumed_from_different_points_fail_in_seconds_naming_it(make_bed, tmp_path):
    """Not a silent wait of 5 minutes in torchrun's exit barrier, nor `Connection closed by peer`."""
    import time
    bed = make_bed(2)
    inventory = bed.write_inventory(tmp_path / "two.yaml", list(bed.nodes), defaults_extra={"connect_timeout": 3})
    job = tmp_path / "job"
    job.mkdir()
    (job / "split.py").write_text(SPLIT)
    t0 = time.monotonic()
    p = cddp_popen("up", str(inventory), str(job / "split.py"), "--runs-dir", str(tmp_path / "runs"), "--gpus", "1",
                   "--max-restarts", "1")
    out, _ = p.communicate(timeout=400)
    took = time.monotonic() - t0
    assert p.returncode == 1, out
    assert re.search(r"root cause: node1: ranks resumed from different points: node1's ranks finished their work "
                     r"while node2's were restarting them", out), out
    assert "resumed from different checkpoints, or one node's script finished early" in out, out
    assert "root cause: node2" not in out and "Connection closed by peer" not in out.split("root cause:")[1], out
    assert took < 240, f"{took:.0f}s: the exit barrier's 300 s were waited out"
    rec = record(tmp_path / "runs", run_id_of(out))
    assert rec["failure"]["kind"] == "diverged" and rec["status"] == "failed", rec["failure"]
