"""A detached Slurm run tells its end from its batch script, on the real Slurm bed (tests/slurmbed.py):
a real HTTP server on this machine's side of the bed's bridge (the nodes reach it there, at
``slurm.bed.gateway``), real sbatch, srun, scancel and torchrun. Three runs at once, to keep wall time
small: one whose first attempt fails and is requeued (--max-restarts) and then succeeds, told once,
as succeeded, with the documented fields; one whose rank fails, told once as failed; one stopped with
`clusterddp stop` (scancel), told once as stopped. The URL stays in the 0600 request alone."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest
import yaml

from clusterddp.backends import load_inventory as load_named
from clusterddp.backends.slurm import plan as slurm_plan
from clusterddp.runspec import RunSpec
from helpers import cddp, eventually, job_pids, record, resolved, run_id_of
from test_notify import TOKEN, Receiver

pytestmark = pytest.mark.integration

# A plain torch script: the first attempt's last rank fails, the requeued attempt all-reduces.
FLAKY = r'''
import os, sys
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
if os.environ.get("SLURM_RESTART_COUNT", "0") == "0" and rank == dist.get_world_size() - 1:
    sys.exit(3)
t = torch.ones(1)
dist.all_reduce(t)
print(f"rank {rank} sum {t.item():g}", flush=True)
dist.destroy_process_group()
'''

FAILS = r'''
raise RuntimeError("this rank gives up")
'''

WAITS = r'''
import os, time
print(f"rank {os.environ['RANK']} ready", flush=True)
time.sleep(600)
'''


def inventory(tmp_path: Path, told: Receiver, got: Path) -> Path:
    url = tmp_path / "told.url"
    url.write_text(told.url + "\n")
    url.chmod(0o600)
    doc = {"name": "cluster", "notify": [{"webhook_file": str(url)}, {"command": f"cat >> {got}"}],
           "slurm": {"partition": "main", "nodes": 2, "gpus_per_node": 1, "request_gpus": False, "time": "00:10:00",
                     "shared_dir": str(tmp_path / "shared"), "python": sys.executable,
                     "env": {"OMP_NUM_THREADS": "1"}}}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_a_detached_slurm_run_is_told_once_by_its_batch_script(slurm, tmp_path, receiver):
    told = receiver(host=slurm.bed.gateway)
    got = tmp_path / "got.json"
    inv = inventory(tmp_path, told, got)
    runs = tmp_path / "runs"
    for name, text in (("flaky.py", FLAKY), ("fails.py", FAILS), ("waits.py", WAITS)):
        (tmp_path / name).write_text(text)

    def up(script: str, *args: str):
        r = cddp("up", str(inv), str(tmp_path / script), "--runs-dir", str(runs), "--detach", *args,
                 env=slurm.env(), check_rc=0, timeout=120)
        return run_id_of(r.stdout), r
    ok, r = up("flaky.py", "--max-restarts", "1")
    assert f"notify: the batch script, on the job's first node (node 0), tells this run's end to webhook " \
           f"{slurm.bed.gateway} ({inv}: notify[0])" in r.stdout, r.stdout
    assert f"notify: command ({inv}: notify[1]) is not told of a detached run's end" in r.stderr
    assert "is not told of its end" not in r.stderr  # up's old warning: a detached Slurm run is told now
    assert TOKEN not in r.stdout + r.stderr
    ctl = tmp_path / "shared" / "runs" / ok / ".clusterddp"
    assert TOKEN not in (ctl / "job.sbatch").read_text()
    request = ctl / "notify.json"
    if request.exists():  # until the batch script's end takes it
        assert stat.S_IMODE(request.stat().st_mode) == 0o600
    failed, _ = up("fails.py")
    stopped, _ = up("waits.py")

    def by_run() -> dict:
        return {p["body"]["run_id"]: p["body"] for p in told.posts}
    stop_ctl = tmp_path / "shared" / "runs" / stopped / ".clusterddp"
    assert eventually(lambda: "rank 0 ready" in "".join(
        p.read_text(errors="replace") for p in stop_ctl.glob("nodes/*/node.log")), 180, interval=0.5)
    assert stopped not in by_run()
    cddp("stop", stopped, "--runs-dir", str(runs), env=slurm.env(), check_rc=0, timeout=180)
    assert eventually(lambda: {ok, failed, stopped} <= set(by_run()), 240, interval=0.5), told.posts

    ev = by_run()[ok]  # told once, of the final end: the requeued attempt's success
    assert (ev["event"], ev["status"], ev["exit_code"], ev["detached"]) == ("succeeded", "succeeded", 0, True), ev
    assert ev["hosts"] == ["node-1", "node-2"] and ev["sent_by"] == "node 0 (node-1)", ev
    assert ev["text"].startswith(f"clusterddp: run {ok} succeeded in ") and ev["text"].endswith(
        " on node-1, node-2"), ev["text"]
    assert ev["inventory"] == str(inv) and ev["script"] == str(tmp_path / "flaky.py"), ev
    assert ev["failed_host"] is None and ev["summary"] is None and ev["started_at"] and ev["ended_at"], ev
    assert isinstance(ev["duration_s"], float) and ev["duration_s"] > 0, ev
    job = slurm.client("scontrol", "-o", "show", "job", record(runs, ok)["slurm"]["job_id"]).stdout
    assert " Restarts=1 " in job, job  # its first attempt failed and was requeued: told nothing
    # each attempt's samples come back (clusterddp.metrics): the requeued attempt's, and the first's beside it
    cddp("status", ok, "--runs-dir", str(runs), env=slurm.env(), check_rc=0, timeout=180)  # its hosts, from Slurm
    cddp("collect", ok, "--runs-dir", str(runs), env=slurm.env(), check_rc=0, timeout=180)
    for host in ("node-1", "node-2"):
        kept = sorted(p.name for p in (runs / ok / "metrics" / host).iterdir())
        assert kept == ["attempt-1.jsonl", "samples.jsonl"], (host, kept)

    ev = by_run()[failed]
    assert (ev["event"], ev["status"], ev["exit_code"]) == ("failed", "failed", 1), ev
    assert ev["summary"].startswith("node 0 (node-1) exited ") and f"clusterddp status {failed}" in ev["summary"], ev
    ev = by_run()[stopped]
    assert (ev["event"], ev["status"], ev["exit_code"]) == ("stopped", "stopped", 130), ev
    assert ev["text"].startswith(f"clusterddp: run {stopped} was stopped in "), ev

    for run in (ok, failed, stopped):
        assert eventually(lambda run=run: not job_pids(run), 60)
        assert eventually(lambda run=run: not any(j for j in slurm.jobs()), 60), slurm.jobs()
        folder = tmp_path / "shared" / "runs" / run / ".clusterddp"
        assert not list(folder.rglob("notify.json"))  # the URL leaves the shared folder once told
        log = (folder / slurm_plan.NOTIFY_LOG).read_text()
        assert f"told webhook {slurm.bed.gateway} ({inv}: notify[0]) of " in log and TOKEN not in log, log
    assert len(told.posts) == 3 and not got.exists()  # once each; a command is the launcher's
    assert record(runs, stopped)["status"] == "stopped"


def test_only_a_batch_script_that_tells_carries_the_notifier(tmp_path):
    """The rendered batch script: TERM noted and the end told after the requeue (which exits first),
    only when `up --detach` has webhooks to tell; an attached run's batch script is as it was."""
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"name": "c", "slurm": {"nodes": 2, "shared_dir": "/s", "python": "py"}}))
    inv = load_named(str(path))
    spec = RunSpec(script="t.py", max_restarts=2)
    plain = slurm_plan.build(inv, resolved(spec, inv), "R", "/s").batch_script
    told = slurm_plan.build(inv, resolved(spec, inv), "R", "/s", notify=True).batch_script
    assert "notify" not in plain and "trap" not in plain and 'scontrol requeue "$SLURM_JOB_ID"\nfi' in plain
    assert "trap 'cddp_term=1' TERM" in told
    requeue, tell = told.index('scontrol requeue "$SLURM_JOB_ID" && exit "$rc"'), told.index('"$CTL/notify.py" ended')
    assert requeue < tell and told.index('cp -p "$CTL/stop"') < tell
