"""The idle policy on the real Slurm bed (tests/slurmbed.py): 2 nodes x 1 torchrun process (gloo, CPU), a plain
torch script, a stand-in ``nvidia-smi`` on the nodes' PATH (a setup line) at 0%. The samplers reach the run's
store where torchrun's c10d rendezvous serves it (found on the node, as the stall watchdog's), agree that the
run is idle, stop it, and the run's root cause is the idle policy's. The rank sampler (clusterddp.stragglers) runs
beside the job as on SSH nodes, and its files come back with the logs."""

from __future__ import annotations

import json
import os
import stat
import sys

import pytest
import yaml

from clusterddp.stragglers import read_run
from helpers import cddp, run_id_of
from test_metrics_ssh import JOB, SMI

pytestmark = pytest.mark.integration


def test_every_node_idle_stops_a_slurm_run_as_idle(slurm, tmp_path):
    (tmp_path / "train.py").write_text(JOB)
    fake = tmp_path / "fakebin"
    fake.mkdir()
    util = tmp_path / "util"
    util.write_text("0\n")
    (fake / "nvidia-smi").write_text(SMI.format(util=util))
    os.chmod(fake / "nvidia-smi", stat.S_IRWXU)
    os.chmod(tmp_path, 0o755)
    doc = {"name": "cluster", "metrics_interval": 0.5, "idle_policy": {"below": 10, "minutes": 0.05, "stop": True},
           "slurm": {"partition": "main", "nodes": 2, "gpus_per_node": 1, "request_gpus": False, "time": "00:10:00",
                     "shared_dir": str(tmp_path / "shared"), "python": sys.executable,
                     "setup": [f"export PATH={fake}:$PATH"], "env": {"OMP_NUM_THREADS": "1"}}}
    inv = tmp_path / "cluster.yaml"
    inv.write_text(yaml.safe_dump(doc, sort_keys=False))
    runs = tmp_path / "runs"
    r = cddp("up", str(inv), str(tmp_path / "train.py"), "--runs-dir", str(runs), "--", "600", "0.2",
             env=slurm.env(), timeout=300)
    run = run_id_of(r.stdout)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "idle: GPU utilisation below 10% on every GPU of the run (2 nodes) for 3s; ending the job" in r.stdout
    assert "idle: every GPU below 10% for 0.05 min (idle_policy stop ended the run)" in r.stderr, r.stderr
    listed = json.loads(cddp("runs", "--runs-dir", str(runs), "--json", check_rc=0).stdout)
    (row,) = [x for x in listed if x["run_id"] == run]
    assert row["failure"]["kind"] == "idle", row
    # the rank sampler ran beside the job on each node too, and its file came back with the logs
    hosts = read_run(runs / run)
    assert len(hosts) == 2 and all((runs / run / "where" / h.host / "where.jsonl").read_bytes().startswith(
        b'{"host": "' + h.host.encode()) for h in hosts), [h.host for h in hosts]
