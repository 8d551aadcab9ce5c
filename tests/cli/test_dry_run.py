"""`up --dry-run`: env values are secrets (shown as *** unless --show-secrets), and the run id it planned
with is never recorded, so none is shown. The real command, SSH and Slurm inventories (no host contacted)."""

from __future__ import annotations

import re

import pytest

from clusterddp.backends import inventory_keys
from clusterddp.backends.base import dry_run_text
from clusterddp.upload import other_inventory
from helpers import cddp, job_script

SSH_INV = """
defaults:
  env: {API_KEY: "k3y-from-defaults"}
hosts:
  - {name: gpu-01, address: gpu-01.invalid, env: {HOST_PW: "pw with 'quotes' $x"}}
  - {name: gpu-02, address: gpu-02.invalid}
"""
SLURM_INV = """
slurm:
  nodes: 2
  gpus_per_node: 1
  shared_dir: {shared}
  env: {API_KEY: "k3y-from-slurm"}
"""
SECRETS = ("s3cr3t-on-the-command-line", "from-this-shell", "k3y-from", "pw with")
RUN_ID = re.compile(r"\d{8}-\d{6}-[0-9a-f]{4}")


@pytest.mark.parametrize("full", [(), ("--full",)], ids=["summary", "full"])
@pytest.mark.parametrize("inv", [SSH_INV, SLURM_INV], ids=["ssh", "slurm"])
def test_dry_run_masks_env_values_unless_asked_and_shows_no_run_id(tmp_path, inv, full):
    script = job_script(tmp_path, "t.py", "print(1)\n")
    (tmp_path / "inv.yaml").write_text(inv.replace("{shared}", str(tmp_path / "shared")))
    args = ("up", "inv.yaml", str(script), "--dry-run", *full, "--runs-dir", "runs",
            "-e", "MY_TOKEN=s3cr3t-on-the-command-line", "-e", "FROM_SHELL")
    env = {"FROM_SHELL": "from-this-shell", "SLURM_CONF": str(tmp_path / "nope.conf")}
    r = cddp(*args, cwd=tmp_path, env=env, check_rc=0, timeout=60)
    assert not [s for s in SECRETS if s in r.stdout + r.stderr], r.stdout
    assert "export MY_TOKEN=***" in r.stdout and "export FROM_SHELL=***" in r.stdout
    assert "export API_KEY=***" in r.stdout
    assert r.stdout.rstrip().endswith("(env values are shown as ***; --show-secrets shows them)")
    # the plan's run id was never recorded: none is shown, and nothing was written
    assert not RUN_ID.search(r.stdout), r.stdout
    assert r.stdout.startswith("run RUN_ID (a dry run: nothing is started or recorded;")
    assert not (tmp_path / "runs").exists() and not (tmp_path / "shared").exists()
    shown = cddp(*args, "--show-secrets", cwd=tmp_path, env=env, check_rc=0, timeout=60).stdout
    assert "export MY_TOKEN=s3cr3t-on-the-command-line" in shown and "from-this-shell" in shown
    assert "k3y-from" in shown and "***" not in shown
    if inv is SSH_INV:
        assert "export HOST_PW='pw with '\"'\"'quotes'\"'\"' $x'" in shown and "export HOST_PW=***" in r.stdout


def test_masking_replaces_whole_values_only():
    text = "run r-1\nexport A=1\nexport AB=12\nexport A=12\necho A=1 r-1"
    out = dry_run_text(text, "r-1", (("A", "1"),))
    assert out.splitlines()[1:5] == ["export A=***", "export AB=12", "export A=12", "echo A=1 RUN_ID"]


THREE = """
defaults: {python: /opt/venv/bin/python, env: {WANDB_API_KEY: "w4ndb-s3cret"}, gpus: 2}
hosts:
  - {name: gpu-01, address: 10.0.0.11}
  - {name: gpu-02, address: 10.0.0.12}
  - {name: gpu-03, address: 10.0.0.13}
notify:
  - {webhook_file: hook.url}
"""


def _three_nodes(tmp_path):
    job = tmp_path / "job"
    job.mkdir()
    (job / "train.py").write_text("print(1)\n")
    (job / "hook.url").write_text("https://hooks.invalid/T0K3N\n")
    (job / "hook.url").chmod(0o600)
    (job / "lab.yaml").write_text(THREE)  # the README's walk-through: the inventory beside train.py
    (job / "old-lab.yml").write_text("hosts: [gpu-07]\n")
    (job / "__pycache__").mkdir()
    return job


def test_the_default_dry_run_is_a_summary_a_person_reads(tmp_path):
    """Issue 39, section 5: 474 lines for 3 nodes, the torchrun line at line 157 of each block."""
    job = _three_nodes(tmp_path)
    out = cddp("up", "lab.yaml", "train.py", "--dry-run", "-e", "HF_TOKEN=hf-s3cret", "--", "--epochs", "3",
               cwd=job, check_rc=0, timeout=60).stdout
    lines = out.splitlines()
    assert len(lines) < 50, out
    assert "launch.sh" not in out and "#!/usr/bin/env bash" not in out and "start: cd" not in out
    for rank, host in enumerate(("gpu-01", "gpu-02", "gpu-03")):
        block = lines.index(f"== {host} (node {rank}, 10.0.0.1{rank + 1}) ==")
        assert lines[block + 1] == "run folder: ~/clusterddp/runs/RUN_ID"
        assert lines[block + 2] == "processes: 2"
        assert lines[block + 3] == (f"command: /opt/venv/bin/python -m torch.distributed.run --nnodes 3 --node-rank "
                                    f"{rank} --master-addr 10.0.0.11 --master-port 29500 --nproc-per-node 2 "
                                    '--max-restarts 0 --log-dir "$CTL/errors" train.py --epochs 3')
        assert lines[block + 4:block + 7] == ["env:", "  export WANDB_API_KEY=***", "  export HF_TOKEN=***"]
    assert "w4ndb" not in out and "hf-s3cret" not in out and "T0K3N" not in out
    assert f"upload: 1 files, 9 B (9 bytes) from {job}" in lines
    assert "  sends: train.py (9 B)" in lines
    assert "  not sent, by the ignore rules (defaults, then .clusterddpignore): __pycache__/" in lines
    assert [line for line in lines if line.startswith("upload: left out")] == [
        "upload: left out hook.url: a notify webhook_file (lab.yaml: notify[0]), a secret",
        "upload: left out lab.yaml: the inventory",
        "upload: left out old-lab.yml: an inventory (a YAML file with hosts: or slurm:); a !NAME line in "
        ".clusterddpignore sends it"]
    assert lines[-2:] == ["(--dry-run --full prints every node's whole start command and launch script)",
                          "(env values are shown as ***; --show-secrets shows them)"]
    full = cddp("up", "lab.yaml", "train.py", "--dry-run", "--full", cwd=job, check_rc=0, timeout=60).stdout
    assert full.count("launch.sh:\n#!/usr/bin/env bash") == 3 and full.count("\nstart: cd ") == 3
    assert "upload: left out hook.url" in full and "w4ndb" not in full and "--dry-run --full" not in full
    r = cddp("up", "lab.yaml", "train.py", "--full", cwd=job, timeout=60)
    assert r.returncode == 2 and "--full goes with --dry-run" in r.stderr and "Traceback" not in r.stderr


def test_a_slurm_dry_run_summary_names_its_options_command_and_env(tmp_path):
    script = job_script(tmp_path, "t.py", "print(1)\n")
    (tmp_path / "inv.yaml").write_text(SLURM_INV.replace("{shared}", str(tmp_path / "shared")))
    env = {"SLURM_CONF": str(tmp_path / "nope.conf")}
    (script.parent / "sec.env").write_text("S=1\n")
    (script.parent / "lab.yaml").write_text(SLURM_INV)  # another inventory
    out = cddp("up", "inv.yaml", str(script), "--dry-run", "-e", "A=b", "-e", "@job/sec.env", cwd=tmp_path, env=env,
               check_rc=0, timeout=60).stdout
    lines = out.splitlines()
    assert len(lines) < 25 and "== job.sbatch ==" not in out, out
    assert any(line.startswith("sbatch options: --job-name=clusterddp-RUN_ID --nodes=2 ") for line in lines), out
    cmd = next(line for line in lines if line.startswith("command (every node, through srun): "))
    assert " -m torch.distributed.run --nnodes 2 --nproc-per-node 1 " in cmd and cmd.endswith(" t.py")
    assert "env:" in lines and "  export API_KEY=***" in lines and "  export A=***" in lines
    assert "upload: left out sec.env: an env file (-e @job/sec.env), a secret" in lines, out
    assert f"upload: left out lab.yaml: {other_inventory(inventory_keys())}" in lines, out
    full = cddp("up", "inv.yaml", str(script), "--dry-run", "--full", cwd=tmp_path, env=env, check_rc=0,
                timeout=60).stdout
    assert "== job.sbatch ==" in full and "== node.sh ==" in full
