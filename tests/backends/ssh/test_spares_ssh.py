"""Spare hosts and fewer nodes, for real (issue 26 section 1): a private 3-node bed, real torchrun
(gloo, CPU), a node's link cut mid-run (its veth down). One test, three runs, to keep the time small:

1. a rank raising a Python exception, with a spare and `restarts: 1`: not moved to the spare;
2. examples/ddp_train.py on node1 + node2 with node3 a spare: node2 cut after a checkpoint exists, the
   run carries on on node1 + node3 from that checkpoint and succeeds;
3. a plain torch script (no clusterddp.train) with --nodes 1:2 and no spare: node2 cut, the run
   finishes on node1 alone from where it was;
4. node2, lost in two runs in a row, is quarantined: the next `up` uses the spare or refuses it.

A second test cuts rank 0's host (whose disk holds the checkpoints) instead.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from helpers import REPO, cddp, cddp_popen, eventually, host_pids, job_script, record, run_id_of, wait_for_line

pytestmark = pytest.mark.integration

RAISES = r'''
import torch.distributed as dist
dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("bad batch shape in the user's own code")
dist.barrier()
dist.destroy_process_group()
'''

# Holds its node's slots (a detached run of another user) until the file HOLD_UNTIL names exists.
HOLDS = r'''
import os, time
while not os.path.exists(os.environ["HOLD_UNTIL"]):
    time.sleep(0.2)
'''

# A plain torch script that resumes by itself: rank 0 keeps the step it reached in a file of its run
# folder (the launcher knows nothing of it).
STEPS = r'''
import os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
start = int(open("progress.txt").read()) if os.path.exists("progress.txt") else 0
if rank == 0:
    os.write(1, f"start at step {start} world={world}\n".encode())
for step in range(start, 40):
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        with open("progress.tmp", "w") as f:
            f.write(str(step + 1))
        os.replace("progress.tmp", "progress.txt")
    time.sleep(0.25)
dist.barrier()
dist.destroy_process_group()
if rank == 0:
    os.write(1, f"finished at step 40 world={world}\n".encode())
'''


def kill_left(run_id: str, host: str) -> None:
    """A cut-off node's job runs on there (nobody can reach it): end it, so the next run finds its slots free."""
    for pid in host_pids(run_id, host):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert eventually(lambda: not host_pids(run_id, host), 20), host_pids(run_id, host)


def cut(node) -> None:
    subprocess.run(["ip", "link", "set", node.veth, "down"], check=True)


def mend(node) -> None:
    subprocess.run(["ip", "link", "set", node.veth, "up"], check=True)


def run_folder(node, run_id: str) -> Path:
    return Path(node.workdir) / "runs" / run_id


def test_a_lost_host_is_replaced_by_a_spare_or_the_run_goes_on_with_fewer_but_an_exception_is_not_moved(
        make_bed, tmp_path):
    bed = make_bed(3)
    node1, node2, node3 = bed.nodes
    runs = tmp_path / "runs"
    spare = {"name": node3.name, "address": node3.address, "workdir": node3.workdir}
    with_spare = bed.write_inventory(tmp_path / "spare.yaml", [node1, node2], defaults_extra={"connect_timeout": 3},
                                     extra={"spares": [spare]})
    job = tmp_path / "job"
    job.mkdir()
    (job / "raises.py").write_text(RAISES)
    (job / "steps.py").write_text(STEPS)

    # 1. The job's own exception would fail on any machine: the run fails as it always did, naming it,
    # and the spare is never touched (`restarts: 1` in the inventory: new attempts, no torchrun restarts).
    restarts = bed.write_inventory(tmp_path / "restarts.yaml", [node1, node2], defaults_extra={"connect_timeout": 3},
                                   extra={"spares": [spare], "restarts": 1})
    r = cddp("up", str(restarts), str(job / "raises.py"), "--runs-dir", str(runs), "--gpus", "1",
             check_rc=1, timeout=240)
    out = r.stdout + r.stderr
    run1 = run_id_of(r.stdout)
    assert "ValueError" in out and "bad batch shape" in out, out
    assert "not moved to another machine" in out and "attempt 2" not in out, out
    rec = record(runs, run1)
    assert rec["status"] == "failed" and [n["host"] for n in rec["nodes"]] == ["node1", "node2"], rec
    assert [(a["attempt"], a["in"]) for a in rec["attempts"]] == [(None, [])], rec["attempts"]
    assert not run_folder(node3, run1).exists(), "the spare was used for the job's own exception"

    # 2. node2 cut off after ddp_train.py wrote a checkpoint: the spare node3 takes its place, the code is
    # sent there, and the run resumes from node1's newest checkpoint (node1 stays rank 0) and succeeds.
    p = cddp_popen("up", str(with_spare), str(REPO / "examples" / "ddp_train.py"), "--runs-dir", str(runs),
                   "--gpus", "1", "--max-restarts", "1", "--", "--epochs", "60", "--epoch-time", "0.3")
    run2 = None  # 18 s at least: the cut comes while it runs, whatever the machine's speed
    try:
        lines = wait_for_line(p, "[node2] [clusterddp] node", timeout=180)
        run2 = run_id_of(lines[0])
        ckpts = run_folder(node1, run2) / "checkpoints"
        assert eventually(lambda: any(ckpts.glob("step-*.pt")), 180, 0.05), "".join(lines)
        cut(node2)
        t0 = time.monotonic()
        rest, _ = p.communicate(timeout=400)
        took = time.monotonic() - t0
    finally:
        p.kill()
        mend(node2)
    out = "".join(lines) + rest
    print(f"spare run: {took:.1f}s from the cut to the end")
    assert p.returncode == 0, out
    assert re.search(r"\[clusterddp\] attempt 2 of run \S+: node2 out, node3 in \(node2 lost", out), out
    resumed = re.search(r"\[node1\] resumed from step (\d+)", out)
    assert resumed and int(resumed.group(1)) > 0, out
    assert "[node3] [clusterddp] node 1/2 on node3" in out and "done world_size=2 final_step=" in out, out
    rec = record(runs, run2)
    assert rec["status"] == "succeeded", rec
    assert [(n["host"], n["node_rank"], n["state"]) for n in rec["nodes"]] == [
        ("node1", 0, "succeeded"), ("node3", 1, "succeeded")], rec["nodes"]
    (a,) = rec["attempts"]
    assert (a["attempt"], a["out"], a["in"]) == (2, ["node2"], ["node3"]) and "node2 lost" in a["why"], a
    assert (run_folder(node3, run2) / "ddp_train.py").is_file()  # the code went to the spare
    # attempt 1's logs are kept apart; the run's logs are the last attempt's hosts'
    assert "resumed from step" in (runs / run2 / "logs" / "node1.log").read_text()
    assert "[clusterddp] node 1/2 on node2" in (runs / run2 / "logs" / "attempt-1" / "node2.log").read_text()
    assert (run_folder(node1, run2) / ".clusterddp" / "node1@attempt-1" / "node.log").is_file()
    status = cddp("status", run2, "--runs-dir", str(runs), check_rc=0).stdout
    assert "node1" in status and "node3" in status and "attempt 2 (" in status and "node2 out, node3 in" in status
    rows = {r["run_id"]: r for r in json.loads(cddp("runs", "--json", "--runs-dir", str(runs), check_rc=0).stdout)}
    assert rows[run2]["hosts"] == "node1,node3", rows[run2]
    # node2's old job may have run on there, out of reach (here it usually ended by itself: its master
    # went silent); its link is back: `stop` reaches it, as for any lost node, and then forgets it
    assert [n["host"] for n in rec["lost_nodes"]] == ["node2"], rec
    stopped = cddp("stop", run2, "--runs-dir", str(runs), "--grace", "2", check_rc=0).stdout
    assert re.search(r"node2: lost in an earlier attempt: (ended by SIG(TERM|KILL)|nothing left to stop)",
                     stopped), stopped
    assert eventually(lambda: not host_pids(run2, "node2"), 20), host_pids(run2, "node2")
    assert "lost_nodes" not in record(runs, run2) and record(runs, run2)["status"] == "succeeded"

    # 3. A plain torch script, --nodes 1:2 and no spare: node2 cut off, the run finishes on node1 alone,
    # from the step it had reached.
    no_spare = bed.write_inventory(tmp_path / "two.yaml", [node1, node2], defaults_extra={"connect_timeout": 3})
    p = cddp_popen("up", str(no_spare), str(job / "steps.py"), "--runs-dir", str(runs), "--gpus", "1",
                   "--nodes", "1:2")
    try:
        lines = wait_for_line(p, "start at step 0 world=2", timeout=180)
        run3 = run_id_of(lines[0])
        progress = run_folder(node1, run3) / "progress.txt"
        assert eventually(lambda: progress.is_file() and int(progress.read_text() or 0) >= 3, 120, 0.05)
        cut(node2)
        rest, _ = p.communicate(timeout=400)
    finally:
        p.kill()
        mend(node2)
    out = "".join(lines) + rest
    assert p.returncode == 0, out
    assert "node2 out, going on with 1 node" in out, out
    started = re.search(r"\[node1\] start at step (\d+) world=1", out)
    assert started and int(started.group(1)) >= 3, out
    assert "[node1] finished at step 40 world=1" in out, out
    rec = record(runs, run3)
    assert rec["status"] == "succeeded" and [n["host"] for n in rec["nodes"]] == ["node1"], rec
    assert [(a["attempt"], a["out"], a["in"]) for a in rec["attempts"]] == [(2, ["node2"], [])], rec["attempts"]
    kill_left(run3, "node2")

    # 4. node2 was lost in run 2 and again in run 3, two runs in a row: set aside. The next `up` with a
    # spare runs the spare in its place, without one it refuses naming the host and until when, and
    # `quarantine release` lets it back.
    assert re.search(r"quarantine: node2 \(\S+:22\) is set aside until \S+ \S+", out), out
    script = str(job / "steps.py")
    planned = cddp("up", str(with_spare), script, "--runs-dir", str(runs), "--dry-run", check_rc=0).stdout
    assert re.search(r"node2 is quarantined until \S+ \S+ \(.*\): spare node3 runs in its place", planned), planned
    assert "== node3 (node 1, " in planned and "== node2 " not in planned, planned
    refused = cddp("up", str(no_spare), script, "--runs-dir", str(runs), "--dry-run", check_rc=75).stderr
    assert re.search(r"node2 \(\S+:22\) is quarantined until \S+ \S+", refused), refused
    assert "clusterddp quarantine release node2" in refused and "Traceback" not in refused, refused
    assert "released node2" in cddp("quarantine", "release", "node2", check_rc=0).stdout
    cddp("up", str(no_spare), script, "--runs-dir", str(runs), "--dry-run", check_rc=0)


def test_rank_0s_host_lost_the_run_resumes_on_the_others_from_the_mirrored_checkpoint(make_bed, tmp_path):
    """The done-when case the other test cannot show: node1 holds rank 0 and every checkpoint on its own
    disk (no shared folder anywhere), and its link is cut. The mirror had brought the newest checkpoint
    back; the next attempt runs on node2 + node3 (node2 now rank 0, its master), node2 is seeded with that
    checkpoint, and examples/ddp_train.py resumes from it (step > 0) and succeeds. The first spare, node4,
    is healthy but another run holds its GPU slots: it is passed over (said) for node3."""
    bed = make_bed(4)
    node1, node2, node3, node4 = bed.nodes
    for a, b in ((node1, node2), (node1, node3), (node2, node3)):  # each node's disk is its own
        wa, wb = Path(a.workdir), Path(b.workdir)
        assert wa != wb and wa not in wb.parents and wb not in wa.parents, (wa, wb)
    runs = tmp_path / "runs"
    spares = [{"name": n.name, "address": n.address, "workdir": n.workdir} for n in (node4, node3)]
    inventory = bed.write_inventory(tmp_path / "spare.yaml", [node1, node2], defaults_extra={"connect_timeout": 3},
                                    extra={"spares": spares})
    # another user's run holds both of node4's slots until the test ends
    hold = tmp_path / "hold"
    holder = cddp("up", str(bed.write_inventory(tmp_path / "node4.yaml", [node4])),
                  str(job_script(tmp_path, "hold.py", HOLDS)), "--runs-dir", str(tmp_path / "other"), "--detach",
                  "-e", f"HOLD_UNTIL={hold}", check_rc=0)
    holder_id = run_id_of(holder.stdout)
    p = cddp_popen("up", str(inventory), str(REPO / "examples" / "ddp_train.py"), "--runs-dir", str(runs),
                   "--gpus", "1", "--max-restarts", "1", "--", "--epochs", "60", "--epoch-time", "0.5",
                   env={"CLUSTERDDP_MIRROR_INTERVAL": "1"})  # 30 s at least, whatever the machine's speed
    run_id = None
    try:
        lines = wait_for_line(p, "[node2] [clusterddp] node", timeout=180)
        run_id = run_id_of(lines[0])
        index = runs / run_id / "mirror.json"

        def mirrored() -> dict[str, str]:  # the step checkpoints the launcher holds, by path
            try:
                doc = json.loads(index.read_text())
            except (OSError, ValueError):
                return {}
            return {f["path"]: f["sha256"] for c in doc["checkpoints"] for f in c["files"]
                    if re.fullmatch(r"checkpoints/step-[1-9]\d*\.pt", f["path"])}
        held = eventually(mirrored, 180, 0.2)
        assert held, f"no checkpoint mirrored from node1: {index}"
        step_held = max(int(re.search(r"(\d+)", path).group(1)) for path in held)
        assert not (run_folder(node2, run_id) / "checkpoints").exists()  # node2 never saved one: not rank 0
        cut(node1)
        rest, _ = p.communicate(timeout=400)
    finally:
        p.kill()
        mend(node1)
        hold.touch()
    out = "".join(lines) + rest
    assert p.returncode == 0, out
    assert re.search(r"\[clusterddp\] spare node4 is not used: the run does not fit: it needs .* on node4", out), out
    assert "node4" not in out.split("spare node4 is not used", 1)[1].split("\n", 1)[1], out
    moved = r"\[clusterddp\] attempt 2 of run \S+: node1 out, node3 in \(node1 lost.*node 0 on node2"
    assert re.search(moved, out), out
    assert re.search(r"\[clusterddp\] node2 seeded with the mirrored checkpoint .*\(sha256 checked there\)", out), out
    resumed = re.search(r"\[node2\] resumed from step (\d+)", out)
    assert resumed and int(resumed.group(1)) >= step_held > 0, out
    assert "[node3] [clusterddp] node 1/2 on node3" in out and "done world_size=2 final_step=" in out, out
    rec = record(runs, run_id)
    assert rec["status"] == "succeeded", rec
    assert [(n["host"], n["node_rank"], n["state"]) for n in rec["nodes"]] == [
        ("node2", 0, "succeeded"), ("node3", 1, "succeeded")], rec["nodes"]
    (a,) = rec["attempts"]
    assert (a["attempt"], a["out"], a["in"]) == (2, ["node1"], ["node3"]) and "node1 lost" in a["why"], a
    # what node2 resumed from is the checkpoint node1 wrote, sent from the mirror's copy of it (node2 has
    # pruned it since: ddp_train.py keeps its 3 newest)
    name = f"checkpoints/step-{resumed.group(1)}.pt"
    assert f"node2 seeded with the mirrored checkpoint {name}, " in out, out
    assert (runs / run_id / "artifacts" / "node1" / name).is_file()
    kill_left(run_id, "node1")
    assert record(tmp_path / "other", holder_id)["status"] != "failed"
