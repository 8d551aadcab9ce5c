"""The slow node, named, for real: 2 sshd hosts x 1 torchrun process (gloo, CPU), a plain DDP script (no
clusterddp.train), detached. Ranks on the hosts listed in SLOW_HOSTS do extra work of their own each step.

- node2 alone slow: `top` names node2 (its rank, since when, and its own function as why) within a bounded
  time; once the run has ended, its samples came back with the logs and `stragglers_of` names node2 too.

A CPU quota on one node's ranks is not tested here: the bed's nodes share one loaded 2-core machine (every
rank is short of CPU, so a quota on one is not reliably what sets it apart within a bound), and a node in
`ip netns exec` has a /sys of its own without the cgroup files. The quota and run-queue whys are unit-tested
(tests/stragglers/test_stragglers.py) and the counters they come from read on real processes
(tests/node/test_node_where.py).
- attached, with `quarantine_stragglers: true`: said, told to the targets that want it, and node2 struck.
- every node doing the same extra work: nothing is named, though the samples cover longer than the first
  case took to name node2."""

from __future__ import annotations

import json
import time
import warnings
from pathlib import Path

import pytest

from clusterddp.quarantine import Quarantine
from clusterddp.stragglers import MIN_STREAK, WINDOW, read_run, stragglers_of
from helpers import cddp, eventually, gloo_exit_abort, record, run_id_of

pytestmark = pytest.mark.integration

JOB = r'''
import os, time
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
slow = os.environ["CLUSTERDDP_HOST"] in os.environ.get("SLOW_HOSTS", "").split(",")


def extra_work():  # this rank's own code, each step: what the other ranks wait for
    t0 = time.monotonic()
    while time.monotonic() - t0 < 0.15:
        sum(range(2000))


steps, stop, t0 = 0, torch.zeros(1), time.monotonic()
while not stop.item():
    x = torch.randn(16, 64)
    loss = model(x).pow(2).mean()
    if slow:
        extra_work()
    opt.zero_grad()
    loss.backward()
    opt.step()
    steps += 1
    if steps % 5 == 0:
        print("step", steps, flush=True)
        limit = float(os.environ.get("CDDP_SECONDS") or 0)  # an attached run: ends by itself after that long
        over = bool(limit and time.monotonic() - t0 > limit)
        stop = torch.tensor([float(os.path.exists(os.environ["CDDP_STOP"]) or over)])
        dist.all_reduce(stop)  # every rank stops at the same step
dist.barrier()
dist.destroy_process_group()
print("rank %d done after %d steps" % (rank, steps), flush=True)
'''

NAMED_WITHIN = 240.0  # seconds from `up` to node2 named, on a loaded 2-core machine


def start(bed, tmp_path: Path, slow_hosts: str) -> tuple[str, Path, Path]:
    src = tmp_path / "job"
    src.mkdir()
    (src / "ddp.py").write_text(JOB)
    inventory = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"gpus": 1})
    runs = tmp_path / "runs"
    stop = tmp_path / "stop"
    r = cddp("up", str(inventory), str(src / "ddp.py"), "--runs-dir", str(runs), "-e", f"CDDP_STOP={stop}",
             "-e", f"SLOW_HOSTS={slow_hosts}", "--detach", check_rc=0)
    return run_id_of(r.stdout), runs, stop


def end(bed, run_id: str, runs: Path, stop: Path) -> None:
    stop.write_text("stop")
    bed.wait_until_written(run_id, name="exit_code", timeout=180)

    def ended() -> bool:
        return record(runs, run_id)["status"] != "running" or \
            "succeeded" in cddp("status", run_id, "--runs-dir", str(runs)).stdout
    assert eventually(ended, 120, interval=1)
    cddp("collect", run_id, "--runs-dir", str(runs), check_rc=0)  # a detached run: its samples come back here
    if record(runs, run_id)["status"] != "succeeded":  # torch 2.13's gloo abort at exit, and only that, passes
        why = gloo_exit_abort(runs, run_id)
        assert why is not None, cddp("logs", run_id, "--runs-dir", str(runs)).stdout
        warnings.warn(why, stacklevel=2)


def named(run_id: str, runs: Path, took: list) -> list:
    """The stragglers `top --once --json` shows now."""
    r = cddp("top", run_id, "--runs-dir", str(runs), "--once", "--json")
    took.append(r.stdout)
    snap = json.loads(r.stdout.splitlines()[-1]) if r.returncode == 0 and r.stdout.strip() else {"runs": []}
    return [s for run in snap["runs"] for s in run.get("stragglers", [])]


def test_the_node_whose_ranks_do_extra_work_is_named_by_top_and_after_the_run(bed, tmp_path):
    t0 = time.monotonic()
    run_id, runs, stop = start(bed, tmp_path, "node2")
    seen: list = []
    try:
        got: list = []
        assert eventually(lambda: bool(got.extend(named(run_id, runs, seen)) or got), NAMED_WITHIN, interval=2), \
            seen[-1:]
        took = time.monotonic() - t0
        (s,) = got[:1]
        assert (s["host"], s["ranks"], s["until"]) == ("node2", [1], None), got
        assert "own code (most often extra_work (ddp.py:" in s["why"], s
        assert s["wait_share"] < 0.3 < s["others_wait_share"], s
        assert all(x["host"] == "node2" for x in got), got  # node1 is never named
        print(f"node2 named {took:.0f}s after up: {s}")
    finally:
        end(bed, run_id, runs, stop)
    after = stragglers_of(runs / run_id)
    assert [(s["host"], s["ranks"]) for s in after] == [("node2", [1])], after
    assert {h.host for h in read_run(runs / run_id)} == {"node1", "node2"}
    assert oct((runs / run_id / "where" / "node2" / "where.jsonl").stat().st_mode & 0o777) == "0o600"


@pytest.mark.timeout(600)
def test_nothing_is_named_when_every_node_does_the_same_extra_work(bed, tmp_path):
    run_id, runs, stop = start(bed, tmp_path, "node1,node2")
    seen: list = []
    try:
        # top, all along: never a straggler, until each host has samples enough for many decisions
        def enough() -> bool:
            assert named(run_id, runs, seen) == [], seen[-1]
            hosts = read_where(bed, run_id)
            return len(hosts) == 2 and all(n >= 2 * WINDOW + MIN_STREAK for n in hosts.values())
        assert eventually(enough, NAMED_WITHIN + 120, interval=2)
    finally:
        end(bed, run_id, runs, stop)
    assert stragglers_of(runs / run_id) == []
    hosts = read_run(runs / run_id)
    assert len(hosts) == 2 and all(len(h.samples) >= 2 * WINDOW for h in hosts)
    # the ranks were seen in their own code (the extra work), alike on both
    for h in hosts:
        assert sum(s["ranks"].get(r, ("?", ""))[0] == "c" for s in h.samples for r in s["ranks"]) > WINDOW


def read_where(bed, run_id: str) -> dict[str, int]:
    """Samples in each node's where.jsonl so far (the bed's nodes' folders are on this machine)."""
    out = {}
    for n in bed.nodes:
        path = bed.control_file(n, run_id, "where.jsonl")
        if path.exists():
            out[n.name] = max(0, len(path.read_bytes().splitlines()) - 1)
    return out


@pytest.mark.timeout(600)
def test_an_attached_run_says_its_straggler_and_tells_the_targets_that_want_it(bed, tmp_path):
    src = tmp_path / "job"
    src.mkdir()
    (src / "ddp.py").write_text(JOB)
    told, deaf = tmp_path / "told.json", tmp_path / "deaf.json"
    inventory = bed.write_inventory(tmp_path / "inv.yaml", defaults_extra={"gpus": 1}, extra={"notify": [
        {"command": f"cat > {told}", "on": ["straggler"]}, {"command": f"cat > {deaf}"}],
        "quarantine_stragglers": True})
    runs = tmp_path / "runs"
    r = cddp("up", str(inventory), str(src / "ddp.py"), "--runs-dir", str(runs), "-e", "SLOW_HOSTS=node2",
             "-e", f"CDDP_STOP={tmp_path / 'never'}", "-e", "CDDP_SECONDS=120", timeout=480, check_rc=0)
    said = [ln for ln in r.stderr.splitlines() if "is the straggler since" in ln]
    assert len(said) == 1 and ": node2 (ranks 1) is the straggler since " in said[0], r.stderr
    assert "own code (most often extra_work (ddp.py:" in said[0], said
    event = json.loads(told.read_text())
    assert (event["event"], event["host"], event["ranks"], event["run_id"]) == ("straggler", "node2", [1],
                                                                                run_id_of(r.stdout))
    assert json.loads(deaf.read_text())["event"] == "succeeded"  # a target without `on`: the end only
    run_id = run_id_of(r.stdout)
    assert [(s["host"], s["ranks"]) for s in stragglers_of(runs / run_id)] == [("node2", [1])]
    # quarantine_stragglers: true: node2 got a strike from this run (set aside by it, when `cddp` ran `up`
    # again after torch's gloo abort at exit: the first run struck it), node1 nothing
    q = Quarantine()  # this test's own $XDG_STATE_HOME (conftest), the launcher's too
    struck = [(k.host, k.run_id) for k in q.strikes()] + [(e.host, e.run_id) for e in q.entries()]
    assert ("node2", run_id) in struck and {h for h, _ in struck} == {"node2"}, struck

