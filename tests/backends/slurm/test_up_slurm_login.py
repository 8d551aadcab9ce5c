"""`slurm.login` as a host entry: Slurm's commands, the staging and the log reads go over SSH to a
login host (one of the Slurm bed's namespace hosts, with its real sshd), on the real Slurm test bed.

The launcher cannot use Slurm itself here: its PATH starts with `sbatch`, `scontrol`, ... that only
leave a mark and fail, and its SLURM_CONF points nowhere. Only the login host's env (in the
inventory) says where the cluster is, so every Slurm command that worked went over SSH.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from helpers import REPO, cddp, cddp_popen, eventually, job_pids, record, run_id_of, wait_for_line
from test_up_slurm import gone, job, ranks_ready, slurm_inv  # noqa: F401  (job: a fixture)

pytestmark = pytest.mark.integration

SLURM_TOOLS = ("sbatch", "scontrol", "scancel", "squeue", "sinfo", "srun")


def login_entry(slurm, **extra) -> dict:
    bed = slurm.bed
    node = bed.nodes[0]
    return {"name": "login1", "address": node.address, "user": "root", "port": 22,
            "identity_file": str(bed.identity_file), "known_hosts": str(bed.known_hosts),
            "host_key_policy": "strict", "env": {"SLURM_CONF": str(slurm.conf)}, **extra}


def no_local_slurm(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment in which this machine's Slurm commands cannot work, and the file that any
    attempt to run one of them writes to."""
    shims = tmp_path / "no-slurm-here"
    shims.mkdir()
    tried = tmp_path / "local-slurm-tried"
    for tool in SLURM_TOOLS:
        p = shims / tool
        p.write_text(f"#!/bin/sh\necho {tool} >> {tried}\necho 'local Slurm used' >&2\nexit 1\n")
        p.chmod(0o755)
    env = {"PATH": f"{shims}:{os.environ['PATH']}", "SLURM_CONF": str(tmp_path / "nowhere.conf")}
    return env, tried


def test_a_remote_login_runs_collects_and_detaches_with_every_slurm_command_over_ssh(slurm, tmp_path, job):  # noqa: F811
    runs = tmp_path / "runs"
    env, tried = no_local_slurm(tmp_path)
    inv = slurm_inv(tmp_path, login=login_entry(slurm))
    shutil.copy(REPO / "examples" / "ddp_train.py", tmp_path / "ddp_train.py")

    # 2 nodes x 2 processes, to success: staged, submitted, followed and collected over SSH
    r = cddp("up", str(inv), str(tmp_path / "ddp_train.py"), "--runs-dir", str(runs), "--", "--epochs", "2",
             env=env, timeout=300, check_rc=0)
    run_id = run_id_of(r.stdout)
    assert "running on node-1,node-2" in r.stdout and "done world_size=4" in r.stdout
    rec = record(runs, run_id)
    assert rec["status"] == "succeeded" and rec["slurm"]["login"]["name"] == "login1", rec
    assert [(n["host"], n["exit_code"]) for n in rec["nodes"]] == [("node-1", 0), ("node-2", 0)]
    assert list((runs / run_id / "artifacts" / "shared" / "checkpoints").glob("step-*.pt")), "no checkpoint back"
    for host in ("node-1", "node-2"):
        log = (runs / run_id / "logs" / f"{host}.log").read_text()
        assert f"on {host} iface=eth0 job {rec['slurm']['job_id']}" in log
    ctl = tmp_path / "shared" / "runs" / run_id / ".clusterddp"
    assert ctl.stat().st_mode & 0o777 == 0o700 and (ctl / "node.sh").stat().st_mode & 0o777 == 0o600
    assert (ctl / "job.sbatch").stat().st_mode & 0o777 == 0o600
    gone(slurm, run_id, rec["slurm"]["job_id"])

    # --detach, then status, logs, logs -f and stop, each reaching Slurm through the login host (one process
    # per node: the job spans both nodes all the same)
    r = cddp("up", str(inv), str(job / "probe.py"), "--detach", "-e", "CDDP_TEST_MODE=hang", "--runs-dir", str(runs),
             "--gpus", "1", env=env, timeout=120, check_rc=0)
    run_id = run_id_of(r.stdout)
    job_id = record(runs, run_id)["slurm"]["job_id"]
    assert job_id in slurm.jobs()

    ranks_ready(tmp_path, run_id, last=1)
    out = cddp("logs", run_id, "--runs-dir", str(runs), env=env, check_rc=0).stdout
    assert "[node-2] rank 1 ready" in out and "[node-1] rank 0 ready" in out, out
    st = cddp("status", run_id, "--runs-dir", str(runs), env=env, check_rc=0).stdout
    assert f"slurm job {job_id}: running, partition main" in st and "node-2: running" in st, st

    def top_sees_both() -> bool:  # top: each node looked at by a job step, through the login host
        out = cddp("top", run_id, "--once", "--json", "--interval", "0.2", "--runs-dir", str(runs), env=env,
                   check_rc=0, timeout=180).stdout
        [run] = json.loads(out)["runs"]
        return [(n["host"], n["state"]) for n in run["nodes"]] == [("node-1", "running"), ("node-2", "running")]
    assert eventually(top_sees_both, 120, interval=1)
    follower = cddp_popen("logs", run_id, "--follow", "--runs-dir", str(runs), env=env)
    try:
        wait_for_line(follower, "[node-2] rank 1 ready", timeout=60)
        s = cddp("stop", run_id, "--runs-dir", str(runs), env=env, check_rc=0).stdout
        follower.communicate(timeout=60)  # `logs -f` ends once Slurm says the job ended
        assert follower.returncode == 0
    finally:
        follower.kill()
    assert f"run {run_id}: stopped" in s and "cancelled by scancel" in s, s
    assert not job_pids(run_id)
    assert "rank 1 ready" in (runs / run_id / "logs" / "node-2.log").read_text()
    gone(slurm, run_id, job_id)
    # prune: both runs' folders in the shared dir removed over SSH on the login host, then their records
    done = cddp("prune", "--keep", "0", "--runs-dir", str(runs), env=env, check_rc=0)
    assert "cannot connect" not in done.stdout + done.stderr, done
    assert not list((tmp_path / "shared" / "runs").iterdir()) and not (runs / run_id).exists()
    assert not tried.exists(), f"a local Slurm command was run: {tried.read_text()}"


def test_ctrl_c_with_a_remote_login_cancels_the_job_over_ssh_and_exits_130(slurm, tmp_path, job):  # noqa: F811
    runs = tmp_path / "runs"
    env, tried = no_local_slurm(tmp_path)
    inv = slurm_inv(tmp_path, login=login_entry(slurm))
    p = cddp_popen("up", str(inv), str(job / "probe.py"), "-e", "CDDP_TEST_MODE=hang", "--runs-dir", str(runs),
                   "--gpus", "1", env=env)  # one process per node: the job still spans both
    try:
        lines = wait_for_line(p, "[node-2] rank 1 ready", timeout=180)
        run_id = run_id_of(lines[0])
        assert job_pids(run_id)
        p.send_signal(signal.SIGINT)
        rest = p.communicate(timeout=120)[0]
        assert p.returncode == 130, "".join(lines) + rest
    finally:
        p.kill()
    rec = record(runs, run_id)
    assert not job_pids(run_id), "up exited before the job had ended on every node"
    assert rec["status"] == "stopped" and rec["exit_code"] == 130, rec
    gone(slurm, run_id, rec["slurm"]["job_id"])
    assert not tried.exists(), f"a local Slurm command was run: {tried.read_text()}"


WAITS = r'''
import os, sys, time
rank = os.environ["RANK"]
os.write(1, f"rank {rank} waiting\n".encode())
deadline = time.time() + 240
while not os.path.exists(sys.argv[1]) and time.time() < deadline:
    time.sleep(0.2)
os.write(1, f"rank {rank} released\n".encode())
'''


def test_a_login_host_out_of_reach_for_a_while_is_asked_again_and_the_job_followed_to_its_end(slurm, tmp_path):
    runs, release = tmp_path / "runs", tmp_path / "release"
    env, _ = no_local_slurm(tmp_path)
    inv = slurm_inv(tmp_path, login=login_entry(slurm))
    (tmp_path / "waits").mkdir()
    (tmp_path / "waits" / "waits.py").write_text(WAITS)
    # every packet to the login host's sshd answered with a reset: the open connection and new ones alike
    rule = ["INPUT", "-p", "tcp", "--dport", "22", "-j", "REJECT", "--reject-with", "tcp-reset"]
    iptables = ["ip", "netns", "exec", slurm.bed.nodes[0].ns, "iptables"]
    p = cddp_popen("up", str(inv), str(tmp_path / "waits" / "waits.py"), "--runs-dir", str(runs), "--", str(release),
                   env=env)
    try:
        seen = wait_for_line(p, "rank 3 waiting", timeout=180)
        subprocess.run([*iptables, "-I", *rule], check=True)
        try:
            seen += wait_for_line(p, "asking again for 60 s (the job goes on meanwhile)", timeout=90)
        finally:
            subprocess.run([*iptables, "-D", *rule], check=True)
        seen += wait_for_line(p, "login1: answering again", timeout=90)
        release.touch()
        rest = p.communicate(timeout=120)[0]
        out = "".join(seen) + rest
        assert p.returncode == 0, out
    finally:
        p.kill()
    assert all(f"rank {r} released" in out for r in range(4)), out
    rec = record(runs, run_id_of(out))
    assert rec["status"] == "succeeded", rec
    assert [n["exit_code"] for n in rec["nodes"]] == [0, 0]
