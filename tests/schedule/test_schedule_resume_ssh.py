"""`schedule add ... --resume previous` for real (issue 39, section 2): root's crontab line run by
`schedule run`, on the session's SSH bed, with a plain torch script whose rank 0 saves its snapshot at a
relative path. The first firing has no earlier run and starts from scratch, saying so; the second starts
every rank, on both nodes, from the epoch where the first stopped."""

from __future__ import annotations

import re

import pytest

from clusterddp.store import RunStore
from helpers import cddp, job_script
from test_schedule_cron import crontab  # noqa: F401 - the fixture: root's crontab, put back afterwards

pytestmark = pytest.mark.integration

SCRIPT = r'''
import os, sys
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
path = os.path.join("checkpoints", "snapshot.pt")
start = torch.load(path)["epoch"] + 1 if os.path.exists(path) else 0
print(f"rank {rank} resumes from epoch {start}", flush=True)
for epoch in range(start, start + 2):
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        os.makedirs("checkpoints", exist_ok=True)
        torch.save({"epoch": epoch}, path)
dist.barrier()
dist.destroy_process_group()
'''


@pytest.mark.timeout(600)
def test_each_firing_resumes_from_the_previous_runs_snapshot(crontab, bed, tmp_path):  # noqa: F811
    inv = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"gpus": 1})
    script = job_script(tmp_path, "train.py", SCRIPT)
    runs = tmp_path / "runs"
    cddp("schedule", "add", "nightly", "--cron", "0 2 * * *", str(inv), str(script), "--runs-dir", str(runs),
         "--resume", "previous", cwd=tmp_path, check_rc=0)
    store = RunStore(runs)
    said = []
    for _ in range(2):
        r = cddp("schedule", "run", "nightly", timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        said.append(r.stdout + r.stderr)
    first, second = (dict(re.findall(r"\[(node\d)\] rank \d resumes from epoch (\d+)$", s, re.M)) for s in said)
    assert first == {"node1": "0", "node2": "0"}, said[0]
    assert "--resume previous: schedule nightly has no earlier run; this run starts from scratch" in said[0]
    assert second == {"node1": "2", "node2": "2"}, said[1]
    runs_ = [row["run_id"] for row in store.list()]  # newest first
    assert len(runs_) == 2 and store.load(runs_[0]).resumed_from is not None
    assert store.load(runs_[0]).resumed_from.run == runs_[1]  # type: ignore[union-attr]
