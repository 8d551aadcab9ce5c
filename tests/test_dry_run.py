"""`up --dry-run`: env values are secrets (shown as *** unless --show-secrets), and the run id it planned
with is never recorded, so none is shown. The real command, SSH and Slurm inventories (no host contacted)."""

from __future__ import annotations

import re

import pytest

from clusterddp.cli.up import dry_run_text
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


@pytest.mark.parametrize("inv", [SSH_INV, SLURM_INV], ids=["ssh", "slurm"])
def test_dry_run_masks_env_values_unless_asked_and_shows_no_run_id(tmp_path, inv):
    script = job_script(tmp_path, "t.py", "print(1)\n")
    (tmp_path / "inv.yaml").write_text(inv.replace("{shared}", str(tmp_path / "shared")))
    args = ("up", "inv.yaml", str(script), "--dry-run", "--runs-dir", "runs",
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
