"""The Slurm batch and node scripts are pure renderings, compared to golden files (see test_plan.py)."""

from __future__ import annotations

import subprocess

from clusterddp.backends.slurm import plan as slurm_planner
from clusterddp.runspec import RunSpec
from helpers import cddp, job_script, parse_inventory, resolved
from test_plan import HOSTILE, RUN_ID, golden

INV = """
name: cluster
collect: ["checkpoints/**"]
slurm:
  partition: gpu
  nodes: "2:4"
  gpus_per_node: 4
  time: "1-00:00:00"
  account: proj
  qos: high
  constraint: a100
  sbatch: ["--mem=64G"]
  shared_dir: /shared/cddp
  python: /opt/venv/bin/python
  setup: ["module load cuda", "source ~/venv/bin/activate"]
  env: {NCCL_DEBUG: WARN, QUOTED: "it's $HOME; `x`", H: keep-me}
"""


def slurm_plan(**spec) -> slurm_planner.SlurmPlan:
    inv = parse_inventory(INV, "c.yaml")
    return slurm_planner.build(
        inv,
        resolved(RunSpec("train/t.py", HOSTILE, collect=("logs/*.txt",), env=(("E", "a b"),), **spec), inv),
        RUN_ID,
        "/shared/cddp",
    )


def test_batch_and_node_scripts_match_golden_and_parse_as_bash():
    p = slurm_plan()
    golden("slurm.txt", slurm_planner.render(p))
    golden("slurm_restarts.txt", slurm_planner.render(slurm_plan(max_restarts=3, master_port=29999, gpus=1)))
    for text in (p.batch_script, p.node_script):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    assert p.collect == ("checkpoints/**", "logs/*.txt")


def test_node_script_hands_torchrun_every_argument_verbatim(tmp_path):
    """The node script's torchrun line, run by bash with torchrun replaced by a printer, yields the
    exact argument vector: hostile arguments stay literal; only clusterddp's own words expand."""
    p = slurm_plan()
    line = next(x for x in p.node_script.splitlines() if "--rdzv-endpoint" in x)
    shim = tmp_path / "python"
    shim.write_text("#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done\n")
    shim.chmod(0o755)
    env = {"PATH": "/usr/bin:/bin", "MASTER_ADDR": "10.0.0.1", "SLURM_JOB_ID": "42", "cddp_is_host": "1",
           "LOCAL_ADDR": "10.0.0.2"}
    out = subprocess.run(["bash", "-c", line.replace("/opt/venv/bin/python", str(shim), 1)], env=env,
                         capture_output=True, check=True).stdout.decode()
    argv = out.split("\0")[:-1]
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:20042"
    assert argv[argv.index("--rdzv-id") + 1] == "42" and argv[argv.index("--local-addr") + 1] == "10.0.0.2"
    assert argv[argv.index("--nnodes") + 1] == "2:4" and argv[argv.index("--nproc-per-node") + 1] == "4"
    assert argv[argv.index("t.py") + 1:] == list(HOSTILE)


def test_dry_run_prints_the_batch_script_and_contacts_nothing(tmp_path):
    script = job_script(tmp_path, "t.py", "print(1)\n")
    inv = tmp_path / "c.yaml"
    inv.write_text(INV.replace("/shared/cddp", str(tmp_path / "shared")))
    # No Slurm reachable: a SLURM_CONF naming no file makes any Slurm command fail.
    r = cddp("up", str(inv), str(script), "--dry-run", "--full", "--runs-dir", str(tmp_path / "runs"),
             "--", "--lr", "0.1", env={"SLURM_CONF": str(tmp_path / "nope.conf")}, check_rc=0)
    assert "#SBATCH --nodes=2-4" in r.stdout and "#SBATCH --partition=gpu" in r.stdout
    assert "t.py --lr 0.1" in r.stdout and "upload: 1 files" in r.stdout
    assert not (tmp_path / "shared").exists() and not (tmp_path / "runs").exists()
