"""`clusterddp up` with a `slurm:` inventory, on the real Slurm test bed (tests/slurmbed.py):
real sbatch, slurmctld, slurmd and srun; real torchrun (gloo, CPU) on node-1 and node-2."""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers import REPO, STUCK_JOB, cddp, cddp_popen, eventually, job_pids, record, run_id_of, wait_for_line
from test_up_ssh import HOSTILE, probes, script_folder

pytestmark = pytest.mark.integration


@pytest.fixture
def job(tmp_path):
    return script_folder(tmp_path)


def slurm_inv(tmp_path: Path, **slurm_extra) -> Path:
    doc = {"name": "cluster", "collect": ["checkpoints/**"],
           "slurm": {"partition": "main", "nodes": 2, "gpus_per_node": 2, "request_gpus": False,
                     "time": "00:10:00", "shared_dir": str(tmp_path / "shared"), "python": sys.executable,
                     "env": {"CDDP_TEST_INV": "inv $HOME 'q'", "OMP_NUM_THREADS": "1"}, **slurm_extra}}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def up(slurm, tmp_path, script, *args, check_rc=None):
    return cddp("up", str(slurm_inv(tmp_path)), str(script), "--runs-dir", str(tmp_path / "runs"), *args,
                env=slurm.env(), check_rc=check_rc, timeout=300)


def popen_up(slurm, tmp_path, script, *args, inv=None):
    return cddp_popen("up", str(inv or slurm_inv(tmp_path)), str(script), "--runs-dir", str(tmp_path / "runs"), *args,
                      env=slurm.env())


def ranks_ready(tmp_path: Path, run_id: str, timeout: float = 180, last: int = 3) -> None:
    """Until the node logs in the shared folder say ranks 0 and ``last`` are ready (waiting there, not by asking
    `clusterddp logs` once a second: each ask is a CLI start and a Slurm query, CPU the other tests want)."""
    nodes = tmp_path / "shared" / "runs" / run_id / ".clusterddp" / "nodes"

    def ready() -> bool:
        text = "".join(p.read_text(errors="replace") for p in nodes.glob("*/node.log"))
        return f"rank {last} ready" in text and "rank 0 ready" in text
    assert eventually(ready, timeout, interval=0.5), "the detached job never got going"


def gone(slurm, run_id, job_id):
    """Slurm lists the job no more (or as ended), and no process of the run is left on any node."""
    assert eventually(lambda: job_id not in slurm.jobs(), 60), f"job {job_id} still queued: {slurm.jobs()}"
    assert eventually(lambda: not job_pids(run_id), 30), f"processes of {run_id} remain: {job_pids(run_id)}"


def test_two_nodes_succeed_with_logs_checkpoint_and_the_job_recorded(slurm, tmp_path):
    runs = tmp_path / "runs"
    shutil.copy(REPO / "examples" / "ddp_train.py", tmp_path / "ddp_train.py")
    r = up(slurm, tmp_path, tmp_path / "ddp_train.py", "--", "--epochs", "2", check_rc=0)
    run_id = run_id_of(r.stdout)
    assert "running on node-1,node-2" in r.stdout
    assert "done world_size=4" in r.stdout  # 2 nodes x 2 processes through one srun step
    rec = record(runs, run_id)
    assert rec["status"] == "succeeded" and rec["exit_code"] == 0 and rec["failed_host"] is None
    job_id = rec["slurm"]["job_id"]
    assert job_id and rec["slurm"]["partition"] == "main" and rec["slurm"]["hosts"] == ["node-1", "node-2"]
    assert [(n["host"], n["exit_code"], n["state"]) for n in rec["nodes"]] == [
        ("node-1", 0, "succeeded"), ("node-2", 0, "succeeded")]
    ckpts = list((runs / run_id / "artifacts" / "shared" / "checkpoints").glob("step-*.pt"))
    assert ckpts, "the checkpoints were not brought back"
    for host in ("node-1", "node-2"):
        log = (runs / run_id / "logs" / f"{host}.log").read_text()
        assert f"on {host} iface=eth0 job {job_id}" in log
        assert f"[{host}] [clusterddp] node" in r.stdout
        # the metrics sampler's file came back with the logs (clusterddp.metrics)
        assert b'"clusterddp-samples"' in (runs / run_id / "metrics" / host / "samples.jsonl").read_bytes()
    gone(slurm, run_id, job_id)


def test_arguments_and_env_arrive_byte_for_byte(slurm, tmp_path, job):
    r = up(slurm, tmp_path, job / "probe.py", "-e", "CDDP_TEST_CLI=cli $(x) `y` \"z\" ü", "--", *HOSTILE,
           check_rc=0)
    run_id = run_id_of(r.stdout)
    seen = probes(r.stdout)
    assert len(seen) == 4 and {h for h, _ in seen} == {"node-1", "node-2"}, r.stdout
    master = slurm.bed.nodes[0].address  # node-1's NodeAddr: host names do not resolve on the nodes
    for _host, p in seen:
        assert p["argv"] == HOSTILE
        e = p["env"]
        assert e["CDDP_TEST_INV"] == "inv $HOME 'q'" and e["CDDP_TEST_CLI"] == "cli $(x) `y` \"z\" ü"
        assert e["CLUSTERDDP_RUN_ID"] == run_id and e["MASTER_ADDR"] == master and e["WORLD_SIZE"] == "4"
        assert e["GLOO_SOCKET_IFNAME"] == e["NCCL_SOCKET_IFNAME"] == "eth0"
    assert not Path("/tmp/cddp-pwned").exists()
    staged = tmp_path / "shared" / "runs" / run_id
    assert (staged / "data.txt").read_text() == "copied with the script's folder\n"
    assert not (staged / ".git").exists()
    ctl = staged / ".clusterddp"
    assert ctl.stat().st_mode & 0o777 == 0o700 and (ctl / "node.sh").stat().st_mode & 0o777 == 0o600
    # the env values are in node.sh only, never on a command line
    assert "cli $(x)" not in (ctl / "job.sbatch").read_text()


def test_one_rank_crashing_fails_the_run_naming_the_host_and_the_job_is_gone(slurm, tmp_path, job):
    runs = tmp_path / "runs"
    t0 = time.monotonic()
    r = up(slurm, tmp_path, job / "probe.py", "-e", "CDDP_TEST_MODE=crash", check_rc=1)
    took = time.monotonic() - t0
    run_id = run_id_of(r.stdout)
    rec = record(runs, run_id)
    # the last rank (3) lives on node-2: its node fails first; Slurm ends node-1's part (--kill-on-bad-exit)
    assert rec["status"] == "failed" and rec["failed_host"] == "node-2", rec
    assert "node-2 failed first" in r.stderr, r.stderr
    # the root cause, as for SSH runs: torchrun's table in node-2's log names rank 3 and its exit code
    assert "root cause: node-2, rank 3 (local rank 1): exited with code 13" in r.stderr, r.stderr
    assert {n["host"]: n["state"] for n in rec["nodes"]} == {"node-1": "stopped", "node-2": "failed"}
    assert took < 120, f"a crash took {took:.0f}s to end the job"
    gone(slurm, run_id, rec["slurm"]["job_id"])


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl_c", "sigterm"])
def test_ctrl_c_or_sigterm_cancels_the_job_then_exits_130(slurm, tmp_path, job, sig):
    runs = tmp_path / "runs"
    # one process per node (--gpus 1): the job still spans both nodes, which is what scancel must end
    p = popen_up(slurm, tmp_path, job / "probe.py", "-e", "CDDP_TEST_MODE=hang", "--gpus", "1")
    try:
        lines = wait_for_line(p, "[node-2] rank 1 ready", timeout=180)
        run_id = run_id_of(lines[0])
        assert job_pids(run_id), "the job should be running now"
        p.send_signal(sig)
        rest = p.communicate(timeout=120)[0]
        assert p.returncode == 130, "".join(lines) + rest
    finally:
        p.kill()
    rec = record(runs, run_id)
    job_id = rec["slurm"]["job_id"]
    # up returned only once Slurm said the job had ended: nothing of it runs on any node
    assert not job_pids(run_id), "up exited before the job had ended on every node"
    state = slurm.client("scontrol", "-o", "show", "job", job_id, check=False).stdout
    assert "JobState=CANCELLED" in state or not state, state
    assert "interrupted" in rest
    assert rec["status"] == "stopped" and rec["exit_code"] == 130, rec
    gone(slurm, run_id, job_id)


def test_a_pending_job_shows_its_reason_and_ctrl_c_cancels_it(slurm, tmp_path, job):
    runs = tmp_path / "runs"
    slurm.drain()
    try:
        p = popen_up(slurm, tmp_path, job / "probe.py")
        try:
            lines = wait_for_line(p, "pending (PartitionDown)", timeout=60)
            run_id = run_id_of(lines[0])
            job_id = record(runs, run_id)["slurm"]["job_id"]
            assert job_id in slurm.jobs()
            p.send_signal(signal.SIGINT)
            rest = p.communicate(timeout=60)[0]
            assert p.returncode == 130, "".join(lines) + rest
        finally:
            p.kill()
    finally:
        slurm.undrain()
    assert job_id not in slurm.jobs()  # cancelled before up returned
    rec = record(runs, run_id)
    assert rec["status"] == "stopped" and rec["nodes"] == [] and rec["slurm"]["hosts"] == []


# Rank 3 stuck in a function of its own while ranks 0-2 wait for it in all_reduce, until the job is stopped.
STUCK = r"""
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
os.write(1, f"rank {rank} ready\n".encode())


def stuck_in_my_function():
    while True:
        time.sleep(0.05)


if rank == 3:
    stuck_in_my_function()
dist.all_reduce(torch.ones(1))  # ranks 0-2 wait here for rank 3
"""


def test_detach_then_status_logs_stacks_and_stop_work_through_slurm(slurm, tmp_path, job):
    runs = tmp_path / "runs"
    (job / "stuck.py").write_text(STUCK)
    r = up(slurm, tmp_path, job / "stuck.py", "--detach", check_rc=0)
    run_id = run_id_of(r.stdout)
    job_id = record(runs, run_id)["slurm"]["job_id"]
    assert f"slurm job {job_id} runs on" in r.stdout and job_id in slurm.jobs()

    ranks_ready(tmp_path, run_id)
    out = cddp("logs", run_id, "--runs-dir", str(runs), env=slurm.env(), check_rc=0).stdout
    assert "rank 3 ready" in out and "rank 0 ready" in out, out
    st = cddp("status", run_id, "--runs-dir", str(runs), env=slurm.env(), check_rc=0).stdout
    assert f"run {run_id}: running" in st and f"slurm job {job_id}: running, partition main" in st
    assert "node-1: running" in st and "node-2: running" in st
    rec = record(runs, run_id)
    assert rec["slurm"]["hosts"] == ["node-1", "node-2"]  # learnt by status: up had returned before allocation
    assert job_pids(run_id)
    # `stacks` reaches the Slurm job's nodes (one job step on each, beside the job's own): rank 3 on
    # node-2 and its function named as the odd one out, where the other three wait shown
    calls, took = [], []

    def odd_one_named() -> bool:  # the first calls may come while ranks 0-2 are still on their way
        t0 = time.monotonic()
        calls.append(cddp("stacks", run_id, "--runs-dir", str(runs), env=slurm.env(), timeout=180))
        took.append(time.monotonic() - t0)
        return "rank 3 (node-2 local 1, pid " in calls[-1].stdout and "all_reduce" in calls[-1].stdout
    assert eventually(odd_one_named, 120, interval=0.5), (calls[-1].stdout, calls[-1].stderr)
    s = calls[-1]
    print(s.stdout, f"stacks took {' '.join(f'{t:.1f}' for t in took)} s")
    assert s.returncode == 0, s.stderr
    lines = s.stdout.splitlines()
    assert lines[0].startswith(f"run {run_id}: 4 rank(s) on 2 node(s)"), s.stdout
    assert lines[1].startswith("rank 3 (node-2 local 1, pid ") and "stuck_in_my_function (stuck.py:" in lines[1]
    assert lines[1].endswith("<- the odd one out"), lines[1]
    assert any(ln.startswith("ranks 0-2 (node-1, node-2): <module> -> ") and "all_reduce" in ln
               and "(stuck.py:18)" in ln for ln in lines), s.stdout
    assert sum("torchrun agent (" in ln for ln in lines) == 2
    saved = runs / run_id / "stacks" / lines[-1].rsplit("/stacks/", 1)[1].rstrip("/")
    assert sorted(p.relative_to(saved).as_posix() for p in saved.glob("*/rank*.txt")) == [
        "node-1/rank0.txt", "node-1/rank1.txt", "node-2/rank2.txt", "node-2/rank3.txt"]
    assert slurm.jobs() == [job_id]  # the steps were the job's own: no other job, and it still runs
    follower = cddp_popen("logs", run_id, "--follow", "--runs-dir", str(runs), env=slurm.env())
    try:
        wait_for_line(follower, "[node-2] rank 3 ready", timeout=60)
        s = cddp("stop", run_id, "--runs-dir", str(runs), env=slurm.env(), check_rc=0).stdout
        follower.communicate(timeout=60)  # `logs -f` ends once Slurm says the job ended
        assert follower.returncode == 0
    finally:
        follower.kill()
    assert f"run {run_id}: stopped" in s and "node-1: stopped (exit code" in s and "; cancelled by scancel" in s, s
    # stop returned once Slurm said the job ended: nothing of it runs on any node
    assert not job_pids(run_id)
    assert record(runs, run_id)["status"] == "stopped"
    assert "rank 3 ready" in (runs / run_id / "logs" / "node-2.log").read_text()  # stop brought the logs back
    gone(slurm, run_id, job_id)
    e = cddp("stacks", run_id, "--runs-dir", str(runs), env=slurm.env(), check_rc=2)
    assert "has ended (stopped" in e.stderr, e.stderr


def test_stall_timeout_ends_a_hung_slurm_job_naming_the_stuck_rank_node_and_function(slurm, tmp_path, job):
    runs = tmp_path / "runs"
    (job / "stalls.py").write_text(STUCK_JOB)
    # 10 s: the clock starts at the first progress line (node/watch.py), so a slow start is never cut short
    t0 = time.monotonic()
    r = up(slurm, tmp_path, job / "stalls.py", "--stall-timeout", "10", "--", "4")
    ended = time.time()
    out = r.stdout + r.stderr
    print(out)
    assert r.returncode == 1, out
    last = max(float(t) for t in re.findall(r"step \d+ at (\d+\.\d+)", r.stdout))
    # the bound: the stall timeout, and 30 s to take the stacks, end the job and say why
    assert ended - last <= 10 + 30, (ended - last, out)
    assert re.search(r"root cause: node-2, rank 3 \(local rank 1\): hang: no rank made progress for \d+s "
                     r"\(stall timeout 10s\); rank 3 \(node-2 local 1\) not where the others are: "
                     r"stuck_in_my_function \(stalls\.py:\d+\)", r.stderr), r.stderr
    assert re.search(r"rank 3 \(node-2 local 1, pid \d+\): stuck_in_my_function \(stalls\.py:\d+\)  <- the odd one out",
                     r.stderr), r.stderr
    assert re.search(r"ranks 0-2 \(node-1, node-2\): <module> -> .*all_reduce.* \(stalls\.py:22\)", r.stderr), r.stderr
    rec = record(runs, run_id_of(r.stdout))
    f = rec["failure"]
    assert (rec["status"], f["kind"], f["host"], f["rank"], f["local_rank"]) == ("failed", "hang", "node-2", 3, 1), rec
    odd = f["hang"]["groups"][0]
    assert odd["odd"] and [(x["host"], x["rank"], x["local_rank"]) for x in odd["ranks"]] == [("node-2", 3, 1)]
    assert "stuck_in_my_function" in odd["where"] and f["hang"]["timeout"] == 10
    saved = runs / rec["run_id"] / "stacks"
    assert sorted(x.relative_to(saved).as_posix().split("/", 1)[1] for x in saved.glob("*/*/rank*.txt")) == [
        "node-1/rank0.txt", "node-1/rank1.txt", "node-2/rank2.txt", "node-2/rank3.txt"]
    assert "[clusterddp] stall: " in (runs / rec["run_id"] / "logs" / "node-2.log").read_text()
    gone(slurm, rec["run_id"], rec["slurm"]["job_id"])  # nothing left running on either node
    print(f"wall time {time.monotonic() - t0:.1f}s; ended {ended - last:.1f}s after the last progress line")


def test_max_restarts_requeues_the_job_which_resumes_from_its_checkpoint(slurm, tmp_path):
    runs = tmp_path / "runs"
    shutil.copy(REPO / "examples" / "ddp_train.py", tmp_path / "ddp_train.py")
    # one process per node (--gpus 1): the crashing rank (1) is node-2's, the checkpoint node-1's rank 0's
    r = up(slurm, tmp_path, tmp_path / "ddp_train.py", "--max-restarts", "1", "--gpus", "1", "--", "--epochs", "2",
           "--crash-at-epoch", "1", "--crash-rank", "1")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    assert "rank 1: simulated crash at epoch 1" in r.stdout
    assert "requeue" in r.stdout  # the batch script put the job back in the queue
    assert "resumed from step" in r.stdout and "done world_size=2" in r.stdout
    rec = record(runs, run_id_of(r.stdout))
    assert rec["status"] == "succeeded" and [n["exit_code"] for n in rec["nodes"]] == [0, 0]
    gone(slurm, rec["run_id"], rec["slurm"]["job_id"])


@pytest.mark.skipif(not shutil.which("crontab"), reason="needs Debian's cron package (scripts/install-system-deps.sh)")
def test_a_schedule_with_a_slurm_inventory_fires_a_slurm_run(slurm, tmp_path, job):
    runs = tmp_path / "runs"
    saved = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    name = f"slurm{secrets.token_hex(3)}"
    try:
        cddp("schedule", "add", name, "--cron", "0 3 * * *", str(slurm_inv(tmp_path)), str(job / "probe.py"),
             "--runs-dir", str(runs), "--gpus", "1", "--", "a b", check_rc=0)
        spec = runs / "schedules" / f"{name}.json"
        # what cron's line runs (cron itself fires once a minute at best: test_schedule_cron.py waits for it)
        cddp("schedule", "fire", str(spec), env=slurm.env(), timeout=300, check_rc=0)
    finally:
        cddp("schedule", "remove", name, "--runs-dir", str(runs))
        if saved.returncode == 0:
            subprocess.run(["crontab", "-"], input=saved.stdout, text=True, check=True)
    (rec,) = [record(runs, p.name) for p in runs.iterdir() if (p / "run.json").exists()]
    assert rec["schedule"] == name and rec["status"] == "succeeded" and rec["slurm"]["job_id"]
    assert rec["args"] == ["a b"] and [n["host"] for n in rec["nodes"]] == ["node-1", "node-2"]


def test_sigterm_right_after_sbatch_answered_still_cancels_and_records_the_job(slurm, tmp_path, job):
    """The window between sbatch printing the job id and the run record holding it: a SIGTERM there
    must not leave a submitted job running and unrecorded. An `sbatch` on PATH runs the real one,
    prints its answer, then signals its parent (clusterddp) before exiting."""
    runs = tmp_path / "runs"
    wrapper = tmp_path / "bin" / "sbatch"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nout=$({shutil.which("sbatch")} "$@") || exit $?\necho "$out"\n'
                       'kill -TERM "$PPID"\nexit 0\n')
    wrapper.chmod(0o755)
    env = {**slurm.env(), "PATH": f"{wrapper.parent}:{os.environ['PATH']}"}
    r = cddp("up", str(slurm_inv(tmp_path)), str(job / "probe.py"), "-e", "CDDP_TEST_MODE=hang",
             "--runs-dir", str(runs), env=env, timeout=180)
    assert r.returncode == 130, r.stdout + r.stderr
    run_id = run_id_of(r.stdout)
    rec = record(runs, run_id)
    job_id = rec["slurm"]["job_id"]
    assert job_id and rec["status"] == "stopped", rec  # recorded, then cancelled
    names = slurm.client("squeue", "-h", "-o", "%i %j").stdout
    assert f"clusterddp-{run_id}" not in names, f"the run's job is still queued: {names}"
    state = slurm.client("scontrol", "-o", "show", "job", job_id, check=False).stdout
    assert "JobState=CANCELLED" in state or not state, state
    gone(slurm, run_id, job_id)


# A plain torch script: no clusterddp.train, no @record, so torchrun writes no error file of its own.
PLAIN_RAISE = r'''
import torch, torch.distributed as dist

dist.init_process_group("gloo")


def explode(step):
    raise ValueError("plain boom at step %d \x1b[31mred" % step)


if dist.get_rank() == 3:
    explode(5)
dist.all_reduce(torch.ones(1))  # the others wait here until rank 3's end breaks the collective
dist.barrier()
'''


def test_an_exception_on_one_rank_is_the_root_cause_in_up_and_run_json(slurm, tmp_path):
    """The Slurm path diagnoses as the SSH path does: torchrun's --log-dir in node.sh, each node's own
    control folder read through the login host by the node program diagnose."""
    runs = tmp_path / "runs"
    src = tmp_path / "plain"
    src.mkdir()
    (src / "fail.py").write_text(PLAIN_RAISE)
    r = up(slurm, tmp_path, src / "fail.py", check_rc=1)
    run_id = run_id_of(r.stdout)
    assert "root cause: node-2, rank 3 (local rank 1): ValueError: plain boom at step 5 \\x1b[31mred" in r.stderr, \
        r.stderr
    assert "in explode: raise ValueError(" in r.stderr and "\x1b" not in r.stderr
    rec = record(runs, run_id)
    f = rec["failure"]
    assert (f["host"], f["kind"], f["rank"], f["local_rank"]) == ("node-2", "exception", 3, 1), f
    assert f["exc_type"] == "ValueError" and f["message"] == "plain boom at step 5 \x1b[31mred"
    assert [o["host"] for o in f["others"]] == ["node-1"]
    ctl = tmp_path / "shared" / "runs" / run_id / ".clusterddp" / "nodes"
    errors = ctl / "node-2" / "errors"  # torchrun's --log-dir, private as on SSH nodes
    assert list(errors.glob("*/attempt_0")) and errors.stat().st_mode & 0o777 == 0o700
    st = cddp("status", run_id, "--runs-dir", str(runs), env=slurm.env(), check_rc=0).stdout
    assert "root cause: node-2, rank 3 (local rank 1): ValueError: plain boom" in st, st
    gone(slurm, run_id, rec["slurm"]["job_id"])


# How many times the crash above runs in a row: 1 in CI's normal set, more by hand
# (CDDP_ROOT_CAUSE_RUNS=10) to look for the race that lost the root cause in one run of six (issue 40).
ROOT_CAUSE_RUNS = int(os.environ.get("CDDP_ROOT_CAUSE_RUNS", "1"))


@pytest.mark.parametrize("n", range(ROOT_CAUSE_RUNS))
def test_the_root_cause_of_one_ranks_crash_is_named_in_every_run(slurm, tmp_path, n):
    """Issue 40: the same crash (rank 3's ValueError, the other ranks' 'Connection closed by peer'
    echoing it) lost its root cause from the summary and run.json in about one run of six, depending
    on which node's end Slurm reported first."""
    src = tmp_path / "plain"
    src.mkdir()
    (src / "fail.py").write_text(PLAIN_RAISE)
    r = up(slurm, tmp_path, src / "fail.py", check_rc=1)
    run_id = run_id_of(r.stdout)
    f = record(tmp_path / "runs", run_id)["failure"]
    nodes = [(x["host"], x["state"], x["exit_code"]) for x in record(tmp_path / "runs", run_id)["nodes"]]
    assert "root cause: node-2, rank 3 (local rank 1): ValueError: plain boom" in r.stderr, (nodes, r.stderr)
    assert f and (f["host"], f["rank"], f["exc_type"]) == ("node-2", 3, "ValueError"), (nodes, f)
    gone(slurm, run_id, record(tmp_path / "runs", run_id)["slurm"]["job_id"])


def test_a_node_python_without_clusterddp_gets_clusterddp_train_shipped(slurm, tmp_path):
    from test_shared_workdir import WHICH_TRAIN, python_without_clusterddp
    bare = python_without_clusterddp(tmp_path / "bare")
    r = subprocess.run([str(bare), "-c", "import importlib.util as u; print(bool(u.find_spec('torch')), "
                        "u.find_spec('clusterddp'))"], capture_output=True, text=True, cwd=tmp_path)
    assert r.stdout.strip() == "True None", r  # the honest premise: torch is there, clusterddp is not
    src = tmp_path / "which"
    src.mkdir()
    (src / "which.py").write_text(WHICH_TRAIN)
    runs = tmp_path / "runs"
    r = cddp("up", str(slurm_inv(tmp_path, python=str(bare))), str(src / "which.py"), "--runs-dir", str(runs),
             env=slurm.env(), check_rc=0, timeout=300)
    run_id = run_id_of(r.stdout)
    run_dir = tmp_path / "shared" / "runs" / run_id
    shipped = run_dir / ".clusterddp" / "lib" / "clusterddp" / "train.py"
    for rank, host in ((0, "node-1"), (3, "node-2")):
        assert f"[{host}] TRAIN rank {rank} {shipped} own=False" in r.stdout, r.stdout
    assert shipped.read_bytes() == (REPO / "clusterddp" / "train.py").read_bytes()
    assert (run_dir / "checkpoints").is_dir()  # the shipped helpers work: rank 0 saved there
    assert "[clusterddp] note" not in r.stdout
