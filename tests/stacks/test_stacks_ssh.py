"""`clusterddp stacks` for real: 2 sshd hosts x 2 torchrun processes (gloo, CPU), a plain torch script
(no clusterddp.train, no @record), detached; rank 3 stuck in a function of its own while ranks 0-2
wait in all_reduce. `stacks` names rank 3 on node2 and its function as the odd one out and saves every
dump; once rank 3 is let go, stacks are taken ten times more while every rank runs all_reduce in a
loop, and the run still succeeds, every rank through its last line."""

from __future__ import annotations

import json
import time

import pytest

from helpers import cddp, eventually, record, run_id_of

pytestmark = pytest.mark.integration

JOB = r'''
import os, time
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()


def stuck_in_my_function(release):
    while not os.path.exists(release):
        time.sleep(0.05)


if rank == 3:
    stuck_in_my_function(os.environ["CDDP_RELEASE"])
dist.all_reduce(torch.ones(1))  # ranks 0-2 wait here for rank 3
# then a healthy job, collectives in a loop (stacks taken meanwhile), until told to stop
steps, stop = 0, torch.zeros(1)
while not stop.item():
    t = torch.ones(4096)
    dist.all_reduce(t)
    assert t[0].item() == 4, t[0]
    steps += 1
    stop = torch.tensor([float(os.path.exists(os.environ["CDDP_RELEASE"] + ".stop"))])
    dist.all_reduce(stop)  # every rank stops at the same step
dist.barrier()
dist.destroy_process_group()
print("rank %d done after %d steps" % (rank, steps), flush=True)
'''


def test_stacks_names_the_stuck_rank_and_the_run_still_succeeds_after_several_calls(bed, tmp_path):
    src = tmp_path / "job"
    src.mkdir()
    (src / "hang.py").write_text(JOB)
    release = tmp_path / "release"
    inventory = bed.write_inventory(tmp_path / "inv.yaml")
    runs = tmp_path / "runs"
    started = time.monotonic()
    r = cddp("up", str(inventory), str(src / "hang.py"), "--runs-dir", str(runs), "-e", f"CDDP_RELEASE={release}",
             "--detach", check_rc=0)
    run_id = run_id_of(r.stdout)
    calls, took = [], []

    def odd_one_named() -> bool:  # the first calls may come while the ranks still meet
        t0 = time.monotonic()
        calls.append(cddp("stacks", run_id, "--runs-dir", str(runs)))
        took.append(time.monotonic() - t0)
        # the settled state, rank 3 the only odd one and ranks 0-2 together in all_reduce: while the ranks still
        # import torch each is odd alone, and on a loaded machine rank 2 can reach all_reduce while node1's ranks
        # still build the group (rank 2 and rank 3 both odd then, rightly)
        lines = calls[-1].stdout.splitlines()
        return (len(lines) > 2 and lines[1].startswith("rank 3 (node2 local 1, pid ")
                and "stuck_in_my_function" in lines[1] and calls[-1].stdout.count("<- the odd one out") == 1
                and any(ln.startswith("ranks 0-2 (node1, node2): ") for ln in lines))
    try:
        assert eventually(odd_one_named, 120, interval=0.5), (calls[-1].stdout, calls[-1].stderr)
        s = calls[-1]
        print(s.stdout)
        assert s.returncode == 0, s.stderr
        lines = s.stdout.splitlines()
        assert lines[1].startswith("rank 3 (node2 local 1, pid ") and "stuck_in_my_function (hang.py:" in lines[1]
        assert lines[2].startswith("    stuck_in_my_function (") and lines[2].endswith("hang.py:12)")
        assert any(ln.startswith("ranks 0-2 (node1, node2): <module> -> ") and "all_reduce" in ln
                   and "(hang.py:17)" in ln for ln in lines), s.stdout
        assert sum("torchrun agent (" in ln for ln in lines) == 2
        # the same as data, twice more; every dump saved under the run folder
        for _ in range(2):
            data = json.loads(cddp("stacks", run_id, "--runs-dir", str(runs), "--json", check_rc=0).stdout)
        (odd, rest) = data["groups"]
        assert (odd["odd"], odd["ranks"], rest["ranks"]) == (True, [3], [0, 1, 2])
        p = odd["procs"][0]
        assert (p["host"], p["rank"], p["local_rank"], p["how"]) == ("node2", 3, 1, "faulthandler")
        assert any(f["function"] == "stuck_in_my_function" for f in p["main"])
        saved = sorted(x.relative_to(runs / run_id / "stacks").parts[1:] for x in
                       (runs / run_id / "stacks").glob(f"{data['saved'].rsplit('/', 1)[1]}/*/*.txt"))
        assert [s for s in saved if s[1].startswith("rank")] == [("node1", "rank0.txt"), ("node1", "rank1.txt"),
                                                               ("node2", "rank2.txt"), ("node2", "rank3.txt")]
        assert "stuck_in_my_function" in (runs / run_id / "stacks" / data["saved"].rsplit("/", 1)[1] / "node2" /
                                          "rank3.txt").read_text()
    except BaseException:  # the run must end here too, or it holds the shared bed's slots for later tests
        (tmp_path / "release.stop").write_text("stop")
        raise
    finally:
        release.write_text("go")
    # let go: a healthy job in its loop of all_reduces, asked ten times (which must change nothing), then stopped
    try:
        for _ in range(10):
            h = json.loads(cddp("stacks", run_id, "--runs-dir", str(runs), "--json", check_rc=0).stdout)
            assert sorted(r for g in h["groups"] for r in g["ranks"]) == [0, 1, 2, 3]
            assert all(p["how"] == "faulthandler" for g in h["groups"] for p in g["procs"])
    finally:
        (tmp_path / "release.stop").write_text("stop")
    # the run ends as if nothing had asked: succeeded, every rank through its last line

    def ended() -> bool:
        return "succeeded" in cddp("status", run_id, "--runs-dir", str(runs)).stdout or \
            record(runs, run_id)["status"] not in ("running",)
    bed.wait_until_written(run_id, name="exit_code")  # both nodes ended: `status` knows at its first ask
    assert eventually(ended, 120, interval=1)
    assert record(runs, run_id)["status"] == "succeeded", cddp("logs", run_id, "--runs-dir", str(runs)).stdout
    logs = cddp("logs", run_id, "--runs-dir", str(runs), check_rc=0).stdout
    assert all(f"rank {k} done after " in logs for k in range(4)), logs
    # a run that has ended: said so, exit 2
    e = cddp("stacks", run_id, "--runs-dir", str(runs), check_rc=2)
    assert "has ended (succeeded" in e.stderr, e.stderr
    print(f"wall time {time.monotonic() - started:.1f}s, {len(calls) + 12} stacks calls, "
          f"{' '.join(f'{t:.1f}' for t in took)} s each")
