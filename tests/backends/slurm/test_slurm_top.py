"""`clusterddp top` of a Slurm run goes through the backend seam (Backend.reach): on the real Slurm bed
(tests/slurmbed.py) a detached run's nodes are shown, each looked at by one job step beside the job's
own, though no `status` has yet written the allocation into the record; a run whose nodes cannot be
reached says why in its row, never "cannot connect: 'slurm'"."""

from __future__ import annotations

import json

import pytest

from helpers import cddp, eventually, record, run_id_of
from test_up_slurm import gone, ranks_ready, up

pytestmark = pytest.mark.integration

WAITS = """
import os, time
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
os.write(1, f"rank {rank} ready\\n".encode())
for step in range(100000):
    print(f"step {step}", flush=True)
    time.sleep(0.5)
"""


def test_top_shows_every_node_of_a_detached_slurm_run(slurm, tmp_path):
    runs = tmp_path / "runs"
    job = tmp_path / "job"
    job.mkdir()
    (job / "waits.py").write_text(WAITS)
    r = up(slurm, tmp_path, job / "waits.py", "--detach", check_rc=0)
    run_id = run_id_of(r.stdout)
    job_id = record(runs, run_id)["slurm"]["job_id"]
    try:
        ranks_ready(tmp_path, run_id)
        assert record(runs, run_id)["nodes"] == []  # nothing wrote the allocation: top finds it itself
        seen = []

        def both_running() -> bool:
            out = cddp("top", run_id, "--once", "--json", "--interval", "0.2", "--runs-dir", str(runs),
                       env=slurm.env(), check_rc=0, timeout=180).stdout
            seen.append(out)
            [snap] = [json.loads(line) for line in out.splitlines() if line.strip()]
            [run] = snap["runs"]
            nodes = {n["host"]: n for n in run["nodes"]}
            return (sorted(nodes) == ["node-1", "node-2"] and all(n["state"] == "running" for n in nodes.values())
                    and all(n["step"] is not None for n in nodes.values()) and all(n["procs"] > 0 for n in nodes.values()))
        assert eventually(both_running, 120, interval=1), seen[-1]
        text = cddp("top", run_id, "--once", "--interval", "0.2", "--runs-dir", str(runs), env=slurm.env(),
                    check_rc=0, timeout=180).stdout
        rows = [ln for ln in text.splitlines() if ln.startswith(run_id)]
        assert [ln.split()[1] for ln in rows] == ["node-1", "node-2"], text
        assert "cannot connect" not in text and "slurm'" not in text, text
        assert slurm.jobs() == [job_id]  # top's steps were the job's own: it still runs, alone
    finally:
        cddp("stop", run_id, "--runs-dir", str(runs), env=slurm.env(), timeout=180)
    gone(slurm, run_id, job_id)
    # an ended Slurm run has no node to look at: refused, saying so (exit 2), no internal error
    e = cddp("top", run_id, "--once", "--runs-dir", str(runs), env=slurm.env(), check_rc=2, timeout=120)
    assert f"top: run {run_id} is a slurm run, and its slurm job {job_id} has ended" in e.stderr, e.stderr
    assert "Traceback" not in e.stderr
