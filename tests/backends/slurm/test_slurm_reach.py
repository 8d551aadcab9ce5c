"""The verbs that reach a run's nodes go through the backend seam (Backend.reach), on the real Slurm
bed (tests/slurmbed.py): `top` of a detached Slurm run shows its nodes, each looked at by one job step
beside the job's own, though no `status` has yet written the allocation into the record; `prune` and
the inventory's `keep_runs` remove a Slurm run's folder in the shared dir, then its record. A run
whose nodes cannot be reached is refused saying why (exit 2), never "cannot connect: 'slurm'"."""

from __future__ import annotations

import json

import pytest
import yaml

from helpers import cddp, eventually, record, run_id_of
from test_up_slurm import gone, ranks_ready, slurm_inv, up

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
            return (sorted(nodes) == ["node-1", "node-2"]
                    and all(n["state"] == "running" and n["step"] is not None and n["procs"] > 0
                            for n in nodes.values()))
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


QUICK = """
import torch.distributed as dist

dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} done", flush=True)
"""


def test_keep_runs_and_prune_remove_a_slurm_runs_shared_folder_then_its_record(slurm, tmp_path):
    runs = tmp_path / "runs"
    inv = slurm_inv(tmp_path)
    doc = yaml.safe_load(inv.read_text())
    doc["keep_runs"] = 1
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "job").mkdir()
    script = tmp_path / "job" / "quick.py"
    script.write_text(QUICK)
    shared = tmp_path / "shared" / "runs"

    def run_once() -> str:
        r = cddp("up", str(inv), str(script), "--runs-dir", str(runs), env=slurm.env(), check_rc=0, timeout=300)
        return run_id_of(r.stdout)
    first = run_once()
    assert (shared / first / ".clusterddp").is_dir() and (runs / first).is_dir()
    second = run_once()  # keep_runs 1: the first run goes, its folder in the shared dir first
    assert not (shared / first).exists() and not (runs / first).exists()
    assert (shared / second / ".clusterddp").is_dir() and (runs / second).is_dir()
    dry = cddp("prune", "--keep", "0", "--dry-run", "--runs-dir", str(runs), env=slurm.env(), check_rc=0)
    assert second in dry.stdout and "cannot connect" not in dry.stdout + dry.stderr, dry
    assert (shared / second).is_dir()
    done = cddp("prune", "--keep", "0", "--runs-dir", str(runs), env=slurm.env(), check_rc=0)
    assert "cannot connect" not in done.stdout + done.stderr, done
    assert not (shared / second).exists() and not (runs / second).exists()
