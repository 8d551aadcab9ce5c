"""torchrun's teardown, for real (issue 39 §5): a plain script (no clusterddp.train) on 2 sshd hosts x 2
torchrun processes whose one rank raises, and the same script stopped with Ctrl-C. `up -q` prints the
ranks' own lines and the summary, not torchrun's ChildFailedError / SignalException tracebacks; the
local copies of the nodes' logs keep every line."""

from __future__ import annotations

import signal

import pytest

from helpers import cddp, cddp_popen, run_id_of, wait_for_line

pytestmark = pytest.mark.integration

JOB = '''
import os, sys, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
for epoch in range(600):
    print(f"Epoch {epoch} | rank {rank}", flush=True)
    time.sleep(0.2)
    if epoch == 3 and rank == 3 and sys.argv[1:] == ["crash"]:
        raise ValueError("boom")
    dist.barrier()
'''
TEARDOWN = ("ChildFailedError", "SignalException", "closing signal", "death signal", "torch/distributed/run.py",
            "Root Cause (first observed failure)")


def _logs(runs, out: str) -> str:
    folder = runs / run_id_of(out) / "logs"
    return "".join(p.read_text(errors="replace") for p in sorted(folder.glob("*.log")))


def test_a_one_rank_crash_prints_the_summary_not_torchruns_teardown(bed, tmp_path):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text(JOB)
    runs = tmp_path / "runs"
    r = cddp("up", str(inv), str(tmp_path / "job" / "train.py"), "-q", "--runs-dir", str(runs), "--", "crash",
             timeout=240)
    assert r.returncode == 1, r.stderr
    shown = r.stdout + r.stderr
    assert not [m for m in TEARDOWN if m in shown], shown
    assert "[rank3]: ValueError: boom" in r.stdout and "root cause: node2, rank 3 (local rank 1): ValueError: boom" \
        in r.stderr, shown
    assert "line(s) of torchrun's teardown not shown" in r.stderr
    # what is left is the ranks' own words and ours: few lines besides the epochs
    rest = [line for line in shown.splitlines() if "Epoch" not in line]
    assert len(rest) < 60, "\n".join(rest)
    logs = _logs(runs, r.stdout)  # every node's torchrun said its teardown: in the logs, whole
    assert logs.count("ChildFailedError") >= 2 and "Root Cause (first observed failure)" in logs


def test_ctrl_c_prints_no_signal_exception_tracebacks(bed, tmp_path):
    inv = bed.write_inventory(tmp_path / "inv.yaml")
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "train.py").write_text(JOB)
    runs = tmp_path / "runs"
    p = cddp_popen("up", str(inv), str(tmp_path / "job" / "train.py"), "--runs-dir", str(runs))
    try:
        seen = wait_for_line(p, "Epoch 5 ")
        p.send_signal(signal.SIGINT)
        out, _ = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
    shown = "".join(seen) + out
    assert p.returncode == 130, shown
    assert not [m for m in TEARDOWN if m in shown], shown
    assert "SignalException" in _logs(runs, shown)
