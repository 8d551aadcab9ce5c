"""The stall watchdog for real: 2 sshd hosts x 2 torchrun processes (gloo, CPU), a plain torch script
(no clusterddp.train), rank 0 alone printing progress lines; then rank 3 stuck in a function of its
own while ranks 0-2 wait in all_reduce.

- Detached, ``stall_timeout: 10`` in the inventory: the run ends on its own (no launcher attached),
  within 10 s + 30 s of its last progress line, and `status` shows the hang and the stacks.
- Attached, ``up --stall-timeout 10`` on the same job, beside it: ends within the same bound, exit 1,
  the summary and run.json name rank 3, node2 and the function; nothing is left running anywhere.
- A job whose rank 0 alone prints a line every 2 s, for several times S, is never stopped: node2's
  ranks print nothing, and its watchdog knows from the run's store that rank 0 makes progress.
"""

from __future__ import annotations

import re
import time
from datetime import datetime

import pytest

from helpers import STUCK_JOB as STUCK
from helpers import cddp, cddp_popen, eventually, job_pids, record, run_id_of

pytestmark = pytest.mark.integration

HEALTHY = r'''
import sys, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
for step in range(int(sys.argv[1])):
    dist.all_reduce(torch.ones(1))  # every rank in step; only rank 0 prints, every 2 s
    if rank == 0 and step % 4 == 0:
        print("step %d" % step, flush=True)
    time.sleep(0.5)
dist.barrier()
dist.destroy_process_group()
print("rank %d done" % rank, flush=True)
'''

# The stuck jobs' stall timeout: short, since the watchdog's clock starts only at the first progress line
# (node/watch.py), so a job still starting on a loaded machine is never cut short.
STALL_S = 10
BOUND_S = STALL_S + 30  # the issue's: the stall timeout, and 30 s to take the stacks, end the job and say why


def _last_step(text: str) -> float:
    times = [float(t) for t in re.findall(r"step \d+ at (\d+\.\d+)", text)]
    assert times, text
    return times[-1]


def test_a_stalled_run_ends_itself_attached_and_detached_naming_the_stuck_rank_and_a_healthy_one_runs_on(
        bed, tmp_path):
    src = tmp_path / "job"
    src.mkdir()
    (src / "stuck.py").write_text(STUCK)
    (src / "healthy.py").write_text(HEALTHY)
    runs = tmp_path / "runs"
    detached_inv = bed.write_inventory(tmp_path / "detached.yaml", defaults_extra={"gpus": 5},
                                       extra={"stall_timeout": STALL_S})
    attached_inv = bed.write_inventory(tmp_path / "attached.yaml", defaults_extra={"gpus": 5})
    started = time.monotonic()
    # beside them (one GPU slot each of the five): a healthy job, only rank 0 printing, every 2 s, for 30 s:
    # 3 times its stall timeout of 10 s; node2's watchdog sees rank 0's progress through the run's store
    h = cddp("up", str(attached_inv), str(src / "healthy.py"), "--runs-dir", str(runs), "--gpus", "1",
             "--stall-timeout", "10", "--detach", "--", "60", check_rc=0)
    healthy = run_id_of(h.stdout)
    # detached: nobody attached; the nodes end it themselves
    d = cddp("up", str(detached_inv), str(src / "stuck.py"), "--runs-dir", str(runs), "--gpus", "2", "--detach",
             "--", "6", check_rc=0)
    detached = run_id_of(d.stdout)
    # attached, beside it on the same nodes (two GPU slots each of the four)
    p = cddp_popen("up", str(attached_inv), str(src / "stuck.py"), "--runs-dir", str(runs), "--gpus", "2",
                   "--stall-timeout", str(STALL_S), "--", "6")
    out, _ = p.communicate(timeout=400)
    ended = time.time()
    print(out)
    attached = run_id_of(out)
    assert p.returncode == 1, out
    assert ended - _last_step(out) <= BOUND_S, (ended - _last_step(out), out)
    assert re.search(r"root cause: node2, rank 3 \(local rank 1\): hang: no rank made progress for \d+s "
                     rf"\(stall timeout {STALL_S}s\); rank 3 \(node2 local 1\) not where the others are: "
                     r"stuck_in_my_function \(stuck\.py:\d+\)", out), out
    assert re.search(r"rank 3 \(node2 local 1, pid \d+\): stuck_in_my_function \(stuck\.py:\d+\)  <- the odd one out",
                     out), out
    assert re.search(r"ranks 0-2 \(node1, node2\): <module> -> .*all_reduce.* \(stuck\.py:\d+\)", out), out
    rec = record(runs, attached)
    f = rec["failure"]
    assert (rec["status"], f["kind"], f["host"], f["rank"], f["local_rank"]) == ("failed", "hang", "node2", 3, 1)
    odd = f["hang"]["groups"][0]
    assert odd["odd"] and [(r["host"], r["rank"], r["local_rank"]) for r in odd["ranks"]] == [("node2", 3, 1)]
    assert "stuck_in_my_function" in odd["where"] and f["hang"]["timeout"] == STALL_S
    saved = runs / attached / "stacks"
    assert "stuck_in_my_function" in next(saved.glob("*/node2/rank3.txt")).read_text()
    assert sorted(x.name for x in saved.glob("*/*/rank*.txt")) == ["rank0.txt", "rank1.txt", "rank2.txt",
                                                                  "rank3.txt"]
    assert "[clusterddp] stall: " in (runs / attached / "logs" / "node2.log").read_text()
    assert eventually(lambda: not job_pids(attached), 30), job_pids(attached)  # nothing left on either node

    # the detached run has ended by itself meanwhile (its nodes' clocks are this machine's)
    def over() -> bool:
        return not job_pids(detached)
    assert eventually(over, 120, interval=1), job_pids(detached)
    s = cddp("status", detached, "--runs-dir", str(runs))
    print(s.stdout)
    assert s.returncode == 0, s.stderr
    rec = record(runs, detached)
    assert rec["status"] == "failed" and rec["failure"]["kind"] == "hang", rec
    log = cddp("logs", detached, "--runs-dir", str(runs), check_rc=0).stdout
    assert "rank 3 (node2 local 1, pid " in s.stdout and "<- the odd one out" in s.stdout, s.stdout
    assert "stuck_in_my_function" in s.stdout and "hang: no rank made progress" in s.stdout, s.stdout
    assert "every thread of every rank: " in s.stdout, s.stdout
    last = _last_step(log)
    end = datetime.fromisoformat(rec["ended_at"]).timestamp()
    assert end - last <= BOUND_S + 1, (end - last, log)  # ended_at is whole seconds, by the nodes' clocks
    # the healthy job was never stopped: it ran to its end and succeeded
    assert eventually(lambda: not job_pids(healthy), 120, interval=1), job_pids(healthy)
    s = cddp("status", healthy, "--runs-dir", str(runs))
    log = cddp("logs", healthy, "--runs-dir", str(runs), check_rc=0).stdout
    assert record(runs, healthy)["status"] == "succeeded", (s.stdout, log)
    assert "rank 0 done" in log and "rank 1 done" in log and "[clusterddp] stall" not in log, log
    print(f"wall time {time.monotonic() - started:.1f}s; attached ended {ended - _last_step(out):.1f}s after "
          f"its last progress line, detached {end - last:.1f}s")
