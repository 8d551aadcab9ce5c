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


ENV_STEP = slurm_planner.EnvStep("0123456789abcdef01234567", "/shared/cddp/envs",
                                 "/shared/cddp/envs/0123456789abcdef01234567/bin/python", "f" * 64,
                                 '{"id": "0123456789abcdef01234567"}')


def test_with_packages_a_first_step_makes_the_environment_ready_and_the_job_runs_its_python():
    """`packages:`: the batch script's first srun step runs node.sh's environment branch on every node (the
    base python builds, or finds ready, the environment); the job's step starts only when it succeeded, and
    its torchrun runs with the environment's python. Golden, and run by bash with srun replaced."""
    inv = parse_inventory(INV, "c.yaml")
    p = slurm_planner.build(inv, resolved(RunSpec("train/t.py", ("--x",)), inv), RUN_ID, "/shared/cddp", env=ENV_STEP)
    head = p.node_script[:p.node_script.index("cddp_master=$1")]  # the rest is the golden slurm.txt's
    golden("slurm_env.txt", f"== {slurm_planner.BATCH} ==\n{p.batch_script}\n"
                            f"== {slurm_planner.NODE_SCRIPT} (its head) ==\n{head}")
    for text in (p.batch_script, p.node_script):
        subprocess.run(["bash", "-n"], input=text, text=True, check=True)
    torchrun = next(x for x in p.node_script.splitlines() if "--rdzv-endpoint" in x)
    assert torchrun.count(ENV_STEP.python) == 1 and "/opt/venv/bin/python" not in torchrun
    build = next(x for x in p.node_script.splitlines() if " build " in x)
    assert build.strip().startswith("/opt/venv/bin/python -S /shared/cddp/runs/") and "say" in build
    assert "python: " + ENV_STEP.python in slurm_planner.summary(p) or ENV_STEP.python in slurm_planner.summary(p)
    # notify: the end waits for the job's step only where it started
    notified = slurm_planner.build(inv, resolved(RunSpec("train/t.py", ()), inv), RUN_ID, "/shared/cddp", notify=True,
                                   env=ENV_STEP)
    subprocess.run(["bash", "-n"], input=notified.batch_script, text=True, check=True)
    assert '[ -n "$cddp_srun" ]' in notified.batch_script


def _batch_with_srun(tmp_path, p, env_rc: int) -> tuple[int, list[str]]:
    """The batch script run by bash, srun and scontrol replaced: each srun call recorded; the environment's
    step exits ``env_rc``."""
    bin_ = tmp_path / "bin"
    bin_.mkdir(exist_ok=True)
    log = tmp_path / "calls"
    (bin_ / "srun").write_text(f'#!/bin/sh\necho "$*" >> {log}\ncase "$*" in *" env") exit {env_rc};; esac\nexit 0\n')
    (bin_ / "scontrol").write_text("#!/bin/sh\necho node-1\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    r = subprocess.run(["bash", "-c", p.batch_script], env={"PATH": f"{bin_}:/usr/bin:/bin", "SLURM_JOB_NUM_NODES": "2",
                                                           "SLURM_JOB_NODELIST": "node-[1-2]"}, capture_output=True)
    return r.returncode, log.read_text().splitlines() if log.exists() else []


def test_the_jobs_step_starts_only_after_the_environment_step_succeeded(tmp_path):
    inv = parse_inventory(INV, "c.yaml")
    p = slurm_planner.build(inv, resolved(RunSpec("train/t.py", ()), inv), RUN_ID, "/shared/cddp", env=ENV_STEP)
    rc, calls = _batch_with_srun(tmp_path, p, 0)
    assert rc == 0 and len(calls) == 2 and calls[0].endswith(" env") and not calls[1].endswith(" env"), calls
    (tmp_path / "calls").unlink()
    rc, calls = _batch_with_srun(tmp_path, p, 3)
    assert rc == 3 and len(calls) == 1 and calls[0].endswith(" env"), calls


def test_dry_run_with_packages_names_the_lock_and_refuses_one_that_is_not_one(tmp_path):
    script = job_script(tmp_path, "t.py", "print(1)\n")
    inv = tmp_path / "c.yaml"
    inv.write_text(INV.replace("/shared/cddp", str(tmp_path / "shared")) + "  packages: lock.txt\n")
    (tmp_path / "lock.txt").write_text("cddptiny==1.0\n")
    env = {"SLURM_CONF": str(tmp_path / "nope.conf")}
    r = cddp("up", str(inv), str(script), "--dry-run", "--runs-dir", str(tmp_path / "runs"), env=env, check_rc=0)
    assert f"packages: {tmp_path / 'lock.txt'}: a first step of the job makes its environment ready" in r.stdout
    (tmp_path / "lock.txt").write_text("cddptiny\n")
    r = cddp("up", str(inv), str(script), "--dry-run", "--runs-dir", str(tmp_path / "runs"), env=env, check_rc=2)
    assert f"{tmp_path / 'lock.txt'}:1: " in r.stderr and "Traceback" not in r.stderr, r.stderr
    r = cddp("env", "build", str(inv), env=env, check_rc=2)
    assert "`env` works on an inventory that lists its hosts, not a `slurm:` one" in r.stderr, r.stderr

