"""The stall watchdog in a Slurm run's node script, and a hang read back from the shared folder.

node.sh starts the node program ``watch`` beside torchrun when the run has a stall timeout, with
the run's store as the node finds it (``$MASTER_ADDR``/``$MASTER_PORT`` exported for the watchdog
alone), and exits 1 when the watchdog ended the job; a node count given as a range is refused. The
launcher's diagnosis reads each node's hang.json and stacks in its own control folder in the shared
folder and makes the hang the run's failure. The real thing: test_up_slurm.py's --stall-timeout run."""

from __future__ import annotations

import json
import shlex
import subprocess
from dataclasses import replace

import pytest

from clusterddp.backends import base
from clusterddp.backends.slurm import job as slurm
from clusterddp.backends.slurm import plan as slurm_plan
from clusterddp.backends.slurm.login import LocalLogin
from clusterddp.errors import UsageError
from clusterddp.node import stacks as node_stacks
from clusterddp.record import RunStatus
from clusterddp.runspec import RunSpec
from clusterddp.store import RunStore
from helpers import parse_inventory, resolved

INV = """
slurm:
  nodes: {nodes}
  gpus_per_node: 2
  shared_dir: {shared}
  python: /opt/py/bin/python3
"""


def inv(tmp_path, nodes="2"):
    return parse_inventory(INV.format(nodes=nodes, shared=tmp_path / "shared"), "c.yaml")


def test_node_sh_starts_the_watchdog_with_the_store_the_node_finds_and_exits_1_on_a_hang(tmp_path):
    i = inv(tmp_path)
    p = slurm_plan.build(i, resolved(RunSpec("t.py", (), stall_timeout=20.0, progress_regex="^step "), i), "r1", "/s")
    subprocess.run(["bash", "-n"], input=p.node_script, text=True, check=True)
    lines = p.node_script.splitlines()
    at = lines.index("export MASTER_ADDR MASTER_PORT=$((20000 + SLURM_JOB_ID % 20000))")
    start = next(i for i, ln in enumerate(lines) if ln.startswith("/opt/py/bin/python3 \"$CTL/watch\"/watch.py"))
    assert at < start < lines.index("export -n MASTER_ADDR MASTER_PORT")  # for the watchdog alone
    args = json.loads(shlex.split(lines[start])[3])
    assert (args["store"], args["nnodes"], args["timeout"], args["regex"]) == (None, 2, 20.0, "^step ")
    torchrun = next(i for i, ln in enumerate(lines) if " torch.distributed.run " in ln and not ln.startswith("#"))
    # right after the job: the rank sampler ends (the job's $? kept), then the watchdog's end reads that $?
    assert start < torchrun and "# the rank sampler ends" in lines[torchrun + 1], lines[torchrun + 1]
    assert lines[torchrun + 2] == "cddp_rc=$?" and lines[-1] == "cddp_exit $cddp_rc"
    # off by default: the node script is as before (its golden file)
    # (not "watch.py": the metrics sampler writes it beside itself for its line reader)
    assert "CDDP_WATCH_PID" not in slurm_plan.build(i, resolved(RunSpec("t.py", ()), i), "r1", "/s").node_script


def test_a_node_count_range_is_refused_with_a_stall_timeout(tmp_path):
    (tmp_path / "t.py").write_text("pass\n")
    i = inv(tmp_path, '"2:4"')
    spec = resolved(RunSpec(str(tmp_path / "t.py"), (), stall_timeout=20.0), i)
    req = base.LaunchRequest(inventory_arg="c.yaml", inventory=i, spec=spec,
                             runs_dir=str(tmp_path / "runs"))
    with pytest.raises(UsageError, match=r"--stall-timeout: slurm.nodes is a range \(2-4\)"):
        slurm.prepare_request(req)
    slurm.prepare_request(replace(req, spec=replace(spec, stall_timeout=None)))  # no watchdog: a range is fine


def _stacks_reply(host: str, procs: list) -> str:
    return node_stacks.MARK + json.dumps({"time": 1.0, "host": host, "state": "running", "exit_code": None,
                                          "procs": procs}) + "\n"


def _proc(pid: int, rank: int, where: tuple[str, int]) -> dict:
    dump = ("Current thread 0x0000000000000001 (most recent call first):\n"
            f'  File "/s/runs/r/stalls.py", line {where[1]} in {where[0]}\n')
    return {"pid": pid, "role": "rank", "rank": rank, "local_rank": rank % 2, "how": "faulthandler", "main": "1",
            "dump": dump, "note": ""}


def test_a_hang_the_nodes_watchdogs_left_in_the_shared_folder_is_the_runs_failure(tmp_path):
    i = inv(tmp_path)
    (tmp_path / "t.py").write_text("pass\n")
    spec = resolved(RunSpec("t.py", (), stall_timeout=20.0), i)
    prep = slurm.prepare(i, spec, str(tmp_path / "runs"), tmp_path / "t.py")
    rec = slurm.new_record(prep, "c.yaml")
    store = RunStore(str(tmp_path / "runs"))
    info = slurm.JobInfo("7", "FAILED", "None", "main", ("n1", "n2"))
    rec = replace(slurm.allocated(rec, info), status=RunStatus.FAILED)
    store.create(rec)
    waiting, stuck = ("all_reduce", 22), ("stuck_in_my_function", 12)
    for host, procs in (("n1", [_proc(11, 0, waiting), _proc(12, 1, waiting)]),
                        ("n2", [_proc(21, 2, waiting), _proc(22, 3, stuck)])):
        ctl = tmp_path / "shared" / "runs" / rec.run_id / ".clusterddp" / "nodes" / host
        ctl.mkdir(parents=True)
        (ctl / "hang.json").write_text(json.dumps({"schema": 1, "host": host, "time": 1.7e9, "timeout": 20.0,
                                                   "silent_s": 20.4, "decided_by": "n1", "nnodes": 2,
                                                   "dumped": 2, "stacks": "hang-stacks.txt"}))
        (ctl / "hang-stacks.txt").write_text(_stacks_reply(host, procs))
    failure = slurm.diagnose(LocalLogin(), store, rec)
    assert (failure.kind, failure.host, failure.rank, failure.local_rank) == ("hang", "n2", 3, 1)
    assert failure.summary == ("hang: no rank made progress for 20s (stall timeout 20s); rank 3 (n2 local 1) "
                               "not where the others are: stuck_in_my_function (stalls.py:12)")
    assert failure.hang is not None and [g.odd for g in failure.hang.groups] == [True, False]
    saved = sorted(p.relative_to(store.run_dir(rec.run_id) / "stacks").as_posix().split("/", 1)[1]
                   for p in (store.run_dir(rec.run_id) / "stacks").glob("*/*/rank*.txt"))
    assert saved == ["n1/rank0.txt", "n1/rank1.txt", "n2/rank2.txt", "n2/rank3.txt"]
