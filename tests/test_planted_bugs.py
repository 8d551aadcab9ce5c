"""Tests that notice bugs planted in recent features (issue 22, section 5), each at one of its bounds:
the failure summary's log tail, the node's diagnosis under its file cap, the prune path guard,
`check --collective`'s slow rule on both sides of each threshold, and the heartbeat's own deadline.
Each was written against a mutation of the product code that the older tests let through (the
mutation is named in each test's docstring). The lease and Slurm ones need a bed: see
test_planted_bugs_leases_ssh.py and test_planted_bugs_slurm.py."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from clusterddp import collective as collectives
from clusterddp import failure as failures
from clusterddp import inventory
from clusterddp import plan as ssh_plan
from clusterddp import prune as pruning
from clusterddp.backends.ssh.supervisor import NodeState, Supervisor
from clusterddp.errors import HostError
from clusterddp.fleet import HostResult
from clusterddp.node import diagnose as diagnose_module
from clusterddp.node.collective import MARK
from clusterddp.prune import prune_target_problem
from clusterddp.record import RunStatus
from clusterddp.runspec import RunSpec
from clusterddp.store import RunStore, new_run_id
from clusterddp.transport import CommandResult
from helpers import cddp, make_record, record, resolved, run_id_of

# ---- the failure summary keeps the last 15 lines of a long log (mutation: the cap removed) ----


def _facts(log: bytes) -> failures.NodeFacts:
    report = {"joined": True, "reach": None, "errors": [], "kernel_lines": [], "kernel_error": None,
              "nvidia_smi": None, "log": None}
    return failures.NodeFacts("a", 0, 1, "failed", 3, None, log, report)


def test_the_failure_summary_shows_only_the_last_15_lines_of_a_long_log():
    """Mutation: ``lines[-MAX_LOG_LINES:]`` -> ``lines`` in failure._tail."""
    log = "".join(f"step {i} loss 0.{i}\n" for i in range(400)).encode()
    f = failures.diagnose([_facts(log)], "a")
    assert failures.MAX_LOG_LINES == 15
    assert f.log_tail == tuple(f"step {i} loss 0.{i}" for i in range(385, 400)), f.log_tail
    shown = [line for line in f.lines() if line.startswith("  | ")]
    assert shown == [f"  | step {i} loss 0.{i}" for i in range(385, 400)]
    # and what run.json keeps is as small
    assert len(f.to_json()["log_tail"]) == 15


def test_up_local_a_failing_job_with_a_long_log_shows_its_last_15_lines_and_records_them(tmp_path):
    """The same bound end to end: a real torchrun whose rank prints 300 lines, then exits 3: the tail is
    the rank's own last 15 lines, not torchrun's report after them (issue 24)."""
    (tmp_path / "chatty.py").write_text("import os, sys\nfor i in range(300):\n"
                                        "    os.write(1, f'chatty line {i}\\n'.encode())\nsys.exit(3)\n")
    r = cddp("up", "local", "chatty.py", "--runs-dir", "runs", cwd=tmp_path, check_rc=1)
    run_id = run_id_of(r.stdout)
    f = record(tmp_path / "runs", run_id)["failure"]
    assert f["kind"] == "exit" and len(f["log_tail"]) == 15, f
    log = [line.rstrip() for line in (tmp_path / "runs" / run_id / "logs" / "local.log").read_text().splitlines()
           if line.strip()]
    own = [f"chatty line {i}" for i in range(285, 300)]
    assert len(log) > 300 and f["log_tail"] == own, (f["log_tail"], log[-20:])
    shown = [line.strip()[2:] for line in r.stderr.splitlines() if line.strip().startswith("| ")]
    assert [s.strip() for s in shown] == own, r.stderr


# ---- the node's diagnosis sends the newest attempt first under its cap (mutation: oldest first) ----


def _error_json(attempt: int, local_rank: int) -> str:
    return json.dumps({"message": {"message": f"RuntimeError: attempt {attempt} rank {local_rank}",
                                   "extraInfo": {"py_callstack": "", "timestamp": str(1_800_000_000 + attempt)}}})


def test_the_diagnosis_sends_the_newest_attempts_error_files_first_under_its_cap(tmp_path):
    """Five attempts of 20 ranks: 100 error files, over the 64 sent. Mutations: attempts sorted
    oldest first (``key=lambda a: int(a[8:])``), or by name (attempt_9 before attempt_10)."""
    ctl = tmp_path / "ctl"
    attempts = (0, 1, 2, 9, 10)
    for a in attempts:
        for lr in range(20):
            d = ctl / "errors" / "job_x1" / f"attempt_{a}" / str(lr)
            d.mkdir(parents=True)
            (d / "error.json").write_text(_error_json(a, lr))
    assert len(attempts) * 20 > diagnose_module.MAX_ERROR_FILES
    sent = diagnose_module.error_files(str(ctl))
    assert len(sent) == diagnose_module.MAX_ERROR_FILES
    got = [e["attempt"] for e in sent]
    assert got == sorted(got, reverse=True) and got[:20] == [10] * 20, got
    assert {e["local_rank"] for e in sent if e["attempt"] == 10} == set(range(20))
    # what the launcher makes of it: the newest attempt's failure, not an older one's
    answer = diagnose_module.read_answer((json.dumps({"joined": True, "errors": sent}) + "\n").encode())
    node = failures.NodeFacts("a", 0, 20, "failed", 1, None, b"", answer)
    f = failures.diagnose([node], "a")
    assert (f.kind, f.exc_type) == ("exception", "RuntimeError") and f.message.startswith("attempt 10 "), f


# ---- the prune guard: exactly <workdir>/runs/<id> (mutation: any <something>/runs/<id>) ----


@pytest.mark.parametrize("run_id, workdir, run_dir, control_dir", [
    ("r1", "/w", "/etc/runs/r1", "/etc/runs/r1/.clusterddp"),           # another workdir's runs folder
    ("r1", "/w", "/w/x/runs/r1", "/w/x/runs/r1/.clusterddp"),           # below the workdir, not its runs/
    ("r1", "/w", "runs/r1", "runs/r1/.clusterddp"),                      # relative: the node's home
    ("r1", "/w", "/runs/r1", "/runs/r1/.clusterddp"),
    ("r1", "~/w", "~/runs/r1", "~/runs/r1/.clusterddp"),
    ("r1", "/w", "/w/runs/r2", "/w/runs/r2/.clusterddp"),               # another run's folder
])
def test_prune_refuses_a_run_folder_under_another_workdir(run_id, workdir, run_dir, control_dir):
    """Mutation: ``run_dir != join(workdir, "runs", run_id)`` -> ``not run_dir.endswith("/runs/" + run_id)``."""
    assert prune_target_problem(run_id, workdir, run_dir, control_dir)


def _damaged(run_id: str, run_dir: str):
    rec = make_record(run_id, hosts=("a",), status=RunStatus.SUCCEEDED, started_at="2026-11-01T10:00:00+00:00",
                      ended_at="2026-11-01T11:00:00+00:00")
    return replace(rec, nodes=tuple(replace(n, run_dir=run_dir, control_dir=run_dir + "/.clusterddp")
                                    for n in rec.nodes))


def test_prune_never_asks_a_node_to_remove_a_folder_of_another_workdir(tmp_path):
    """Through `prune` itself: a record whose node folder is /etc/runs/<id> (its workdir /w) is
    damaged, nothing is sent to the node, and the run is kept; /w/runs/<id> is sent."""
    store = RunStore(tmp_path / "runs")
    store.create(_damaged("bad", "/etc/runs/bad"))
    store.create(_damaged("good", "/w/runs/good"))
    asked: list[str] = []

    def connect(host):
        asked.append(host.name)
        raise HostError(host.name, "no network in this test")
    sel = pruning.select(store, pruning.Policy(keep=0))
    assert sorted(r.run_id for r in sel.remove) == ["bad", "good"]
    res = {r.run_id: r for r in pruning.prune(store, sel, connect=connect)}
    bad = res["bad"]
    assert not bad.removed and [(n.host, n.word) for n in bad.nodes] == [("a", "damaged")], bad
    assert "/etc/runs/bad" in (bad.nodes[0].detail or "") and "<workdir>/runs/bad" in (bad.nodes[0].detail or "")
    assert store.load("bad")
    # the well-formed one did go to the node (which could not be reached here)
    assert [(n.host, n.word) for n in res["good"].nodes] == [("a", "unreachable")] and asked == ["a"]


# ---- check --collective: both sides of each threshold (mutation: 1/5 of the median -> 1/50) ----

MiB = 1 << 20
B = 1e9  # bytes/s: the healthy pairs' bus bandwidth


def _inv(n: int) -> inventory.Inventory:
    hosts = "".join(f"  - {{name: h{i}, address: 10.0.0.{i + 1}}}\n" for i in range(n))
    return inventory.parse(f"hosts:\n{hosts}", "inv.yaml")


def _line(event: str, **fields) -> bytes:
    return (MARK + json.dumps({"event": event, "t": 1.0, **fields}) + "\n").encode()


def _sweep(bw: float, lat: float, sizes: tuple[int, ...]) -> list:
    """A pair's [size, ops, median, fastest]: ``lat + size / bw`` seconds (``lat`` 0: bus bandwidth
    exactly ``bw`` for a pair; the smallest size's time is the latency figure)."""
    return [[s, 5, lat + s / bw, lat + s / bw] for s in sizes]


def _report(n: int, bw: dict[tuple[int, int], float] | None = None, lat: dict[tuple[int, int], float] | None = None,
            base_lat: float = 0.0, sizes: tuple[int, ...] = (1024, 64 * 1024, MiB)) -> collectives.CollectiveReport:
    """``evaluate`` on a run where every ring pair went through: ``bw``/``lat`` by pair, the rest healthy."""
    out = {}
    for r in range(n):
        pairs = {}
        for a, b in (tuple(sorted((r, (r + 1) % n))), tuple(sorted(((r - 1) % n, r)))):
            peer = b if r == a else a
            pairs[str(peer)] = _sweep((bw or {}).get((a, b), B), (lat or {}).get((a, b), base_lat), sizes)
        out[f"h{r}"] = (_line("started", python="3.11.7", hostname=f"h{r}", iface="eth0", addr="10.0.0.1",
                              torch="2.13.0+cpu", cuda=None, gpu=False)
                        + _line("joined") + _line("connected", backend="gloo")
                        + _line("result", backend="gloo", world=_sweep(B, base_lat, sizes), pairs=pairs))
    return collectives.evaluate(_inv(n), [HostResult(f"h{r}") for r in range(n)], out)


def _status(rep: collectives.CollectiveReport) -> list[str]:
    return [h.status for h in rep.hosts]


@pytest.mark.parametrize("factor, slow", [(1.02, False), (0.98, True)], ids=["just_inside", "just_outside"])
def test_a_hosts_bandwidth_just_above_or_below_a_fifth_of_the_median(factor, slow):
    """h2 is at 1/5 of the median bandwidth with both its neighbours, times ``factor``.
    Mutations: SLOW_BW 5 -> 50 (just outside passes as ok), 5 -> 4 (just inside is flagged)."""
    x = B / 5 * factor
    rep = _report(4, bw={(1, 2): x, (2, 3): x})
    assert _status(rep) == ["ok", "ok", "slow" if slow else "ok", "ok"], [(h.host, h.problem) for h in rep.hosts]
    assert not any(li.slow for li in rep.links)  # the host is slow, not its links
    assert rep.ok is not slow
    if slow:
        assert (rep.hosts[2].problem or "").startswith("bus bandwidth") and "0.2x the median" in rep.hosts[2].problem


@pytest.mark.parametrize("factor, slow", [(1.02, False), (0.98, True)], ids=["just_inside", "just_outside"])
def test_a_links_bandwidth_just_above_or_below_a_fifth_of_both_its_hosts(factor, slow):
    """One link between two hosts that are fast with their other neighbours. Mutation: SLOW_BW 5 -> 50."""
    rep = _report(4, bw={(0, 1): B / 5 * factor})
    assert _status(rep) == ["ok"] * 4
    assert [(li.a, li.b) for li in rep.links if li.slow] == ([("h0", "h1")] if slow else [])
    assert rep.ok is not slow


# Latency rule: over SLOW_LAT (5) times the median and SLOW_LAT_MIN_S (1 ms) more. The sizes reach
# 1 GiB so that the extra latency leaves the pairs' bandwidth as everyone's (it is judged on its own).
BIG = (1024, 64 * MiB, 1024 * MiB)


@pytest.mark.parametrize("base, mine, slow", [
    (0.001, 0.0049, False),    # 4.9x the median, 3.9 ms more: under the ratio
    (0.001, 0.0051, True),     # 5.1x, 4.1 ms more
    (0.0001, 0.0010, False),   # 10x, but 0.9 ms more: under the floor
    (0.0001, 0.0012, True),    # 12x and 1.1 ms more
], ids=["ratio_inside", "ratio_outside", "floor_inside", "floor_outside"])
def test_a_hosts_latency_on_each_side_of_five_times_the_median_and_of_the_1ms_floor(base, mine, slow):
    """h1's latency with both its neighbours is ``mine``, the others' ``base``. Mutations: SLOW_LAT
    5 -> 50 (ratio_outside ok), SLOW_LAT_MIN_S 1 ms -> 10 ms (floor_outside ok) or -> 0.1 ms
    (floor_inside flagged)."""
    rep = _report(4, lat={(0, 1): mine, (1, 2): mine}, base_lat=base, sizes=BIG)
    assert _status(rep) == ["ok", "slow" if slow else "ok", "ok", "ok"], [(h.host, h.problem) for h in rep.hosts]
    if slow:
        assert (rep.hosts[1].problem or "").startswith(f"latency {mine * 1e3:.3g} ms is"), rep.hosts[1].problem
        assert "bus bandwidth" not in (rep.hosts[1].problem or "")


def test_the_rule_the_report_states_is_the_one_applied():
    assert (
        "under 1/5 of the median" in collectives.RULE
        and "over 5x the median" in collectives.RULE
        and "1 ms more" in collectives.RULE
    )


# ---- a heartbeat miss is never an answer: lost within the test's own deadline of the cut ----

LOST_AFTER_S = 2.0
NOTICE_BOUND_S = LOST_AFTER_S + 4.0  # the main loop's 1 s tick, and a loaded machine


class _Node:
    """One node at the transport seam: start commands succeed, the log stream lasts until ``ended``;
    once ``cut`` is set every heartbeat and status fails at once (a reset connection: misses come fast, so a
    miss counted as an answer would keep the node 'alive' forever) while the stream hangs on."""

    def __init__(self, node: ssh_plan.NodeLaunch) -> None:
        self.node = node
        self.cut, self.ended, self.closed = threading.Event(), threading.Event(), threading.Event()
        self.misses = 0

    def run(self, command, *, timeout=None, stdin=None):
        if command == ssh_plan.status_command(self.node):
            if self.cut.is_set():
                self.misses += 1
                raise HostError(self.node.host.name, "connection reset by peer")
            return CommandResult(0, b"exit 143\n" if self.ended.is_set() else b"running\n", b"")
        if command == ssh_plan.teardown_command(self.node, 1.0):
            self.ended.set()
            return CommandResult(0, b"terminated\n", b"")
        return CommandResult(0, b"", b"")

    def stream(self, command, on_data, **kw):
        while not (self.ended.wait(0.02) or self.closed.is_set()):
            pass
        return 0

    def ping(self):  # a heartbeat
        if self.cut.is_set():
            self.misses += 1
            raise HostError(self.node.host.name, "connection reset by peer")

    def close(self):
        self.closed.set()


def _plan(tmp_path: Path) -> ssh_plan.LaunchPlan:
    hosts = tuple(replace(inventory.local().hosts[0], name=name, workdir=str(tmp_path / name)) for name in "ab")
    inv = inventory.Inventory("t", "t", hosts, inventory.Master("a", "127.0.0.1", 29500))
    return ssh_plan.build_plan(inv, resolved(RunSpec("t.py"), inv), new_run_id())


def test_a_node_whose_heartbeats_fail_at_once_is_lost_within_the_tests_own_deadline(tmp_path):
    """Mutations: ``node.answered_at = self.clock()`` for every _Beat (a miss too), or the heartbeat
    thread posting ``_Beat(name, None)`` for a failed ping: the node is never lost, and the run
    would hang until the jobs end. The test measures from the cut and fails at its own deadline."""
    p = _plan(tmp_path)
    fakes = {n.host.name: _Node(n) for n in p.nodes}
    lost = threading.Event()
    at: dict[str, float] = {}

    def on_state(host: str, state: NodeState, node) -> None:
        at.setdefault(f"{host}:{state}", time.monotonic())
        if state is NodeState.LOST:
            lost.set()
    sup = Supervisor(p, on_output=lambda h, d: None, connect=lambda h: fakes[h.name], heartbeat_s=0.05,
                     lost_after_s=LOST_AFTER_S, grace_s=1.0, on_state=on_state)
    sup.start()
    outcome = []
    follower = threading.Thread(target=lambda: outcome.append(sup.follow()), daemon=True)
    follower.start()
    try:
        time.sleep(0.3)  # not synchronisation: let a few healthy beats answer before the cut
        fakes["b"].cut.set()
        cut = time.monotonic()
        noticed = lost.wait(NOTICE_BOUND_S)
        took = time.monotonic() - cut
        assert noticed, (f"b was not declared lost within {NOTICE_BOUND_S:g}s of the cut ({fakes['b'].misses} "
                         f"heartbeats failed meanwhile): are misses counted as answers?")
        assert fakes["b"].misses >= 2, "the heartbeats did not go on failing until the node was lost"
        took = at["b:lost"] - cut
        assert LOST_AFTER_S - 0.3 <= took <= NOTICE_BOUND_S, f"b lost {took:.2f}s after the cut"
        follower.join(30)
        assert outcome and (outcome[0].status, outcome[0].first_failed) == ("failed", "b")
        assert "stopped answering" in (sup.nodes[1].error or "") and "connection reset" in sup.nodes[1].error
    finally:
        for f in fakes.values():
            f.ended.set()
            f.close()
        follower.join(30)
        sup.close()
