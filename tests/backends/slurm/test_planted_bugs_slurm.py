"""A `slurm:` run whose surviving ranks never notice a peer's failure still ends, failed (issue 22,
section 5), on the real Slurm bed: real sbatch, slurmctld, slurmd, srun and torchrun.

Only the golden text noticed ``--kill-on-bad-exit`` dropped from the srun step: every other test's
ranks wait in a collective, which the failure breaks, so each node's torchrun ends on its own. Here
the rank on the first node ignores SIGTERM and waits outside any collective; only Slurm ending the
step on every node (``--kill-on-bad-exit=1``, SIGKILL KillWait s after SIGTERM) ends it. One process
per node (``--gpus 1``): a sibling of the failing rank on the last node would only add torchrun's 30 s
wait for it, and nothing the flag does.
Mutation: the flag removed from the step in backends/slurm/plan.py."""

from __future__ import annotations

import time

import pytest

from helpers import cddp, job_pids, job_script, record, run_id_of, wait_for_line
from test_up_slurm import gone, popen_up

pytestmark = pytest.mark.integration

DEAF = r'''
import os, signal, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
dist.barrier()
if rank == world - 1:  # on the last node
    os.write(1, f"rank {rank} fails now\n".encode())
    os._exit(13)
signal.signal(signal.SIGTERM, lambda *_: os.write(1, f"rank {rank} ignores SIGTERM\n".encode()))
os.write(1, f"rank {rank} waits outside any collective\n".encode())
while True:
    time.sleep(0.5)
'''

# From the failing rank's exit to `up` returning: the failing node's torchrun ends at once (the rank was
# its only one), then Slurm ends the step on every node (KillWait is 5 s on the bed) and `up` sees the
# job end. Without the flag the first node's part runs until the time limit (10 min).
END_BOUND_S = 150.0


def test_a_failed_rank_ends_the_run_when_the_survivors_ignore_sigterm_outside_a_collective(slurm, tmp_path):
    runs = tmp_path / "runs"
    script = job_script(tmp_path, "deaf.py", DEAF)
    p = popen_up(slurm, tmp_path, script, "--gpus", "1")
    try:
        lines = wait_for_line(p, "fails now", timeout=240)
        failed_at = time.monotonic()
        run_id = run_id_of(lines[0])
        try:
            rest = p.communicate(timeout=END_BOUND_S)[0]
        except Exception:
            raise AssertionError(f"the run still goes on {END_BOUND_S:g}s after a rank failed: the ranks that "
                                 f"ignore SIGTERM were never ended (--kill-on-bad-exit?)\n" + "".join(lines)) from None
        took = time.monotonic() - failed_at
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
            rid = locals().get("run_id")
            if rid:
                cddp("stop", rid, "--runs-dir", str(runs), env=slurm.env(), timeout=120)
    out = "".join(lines) + rest
    assert p.returncode == 1, out
    print(f"the run ended {took:.1f}s after rank 1 (node-2) failed")
    assert "rank 1 fails now" in out and "rank 0 waits outside any collective" in out, out
    rec = record(runs, run_id)
    assert rec["status"] == "failed" and rec["failed_host"] == "node-2", rec
    assert {n["host"]: n["state"] for n in rec["nodes"]} == {"node-1": "stopped", "node-2": "failed"}, rec["nodes"]
    assert not job_pids(run_id), "processes of the run outlived it"
    gone(slurm, run_id, rec["slurm"]["job_id"])
