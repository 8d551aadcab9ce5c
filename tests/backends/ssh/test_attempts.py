"""The pure parts of spare hosts (issue 26 section 1): the inventory's `spares:`, choosing the next
attempt's hosts, renumbering node ranks, `--nodes`, and run.json's `attempts` read back as untrusted."""

from __future__ import annotations

import json

import pytest

from clusterddp import plan as ssh_plan
from clusterddp.backends.ssh import attempts as next_attempts
from clusterddp.errors import InventoryError, RecordError, UsageError
from clusterddp.inventory import parse
from clusterddp.launch import parse_nodes
from clusterddp.record import Attempt, RunRecord
from clusterddp.runspec import RunSpec
from helpers import make_record, resolved

INV = """\
defaults: {user: me, gpus: 1, workdir: /w}
master: {host: b}
hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}, {name: c, address: 10.0.0.3}]
spares:
  - {name: s1, address: 10.0.0.11, python: /opt/py}
  - {name: s2, address: 10.0.0.12}
"""


@pytest.fixture
def inv():
    return parse(INV, "lab.yaml")


def names(hosts) -> list[str]:
    return [h.name for h in hosts]


def test_spares_take_the_defaults_like_hosts_and_are_not_run_on(inv):
    assert names(inv.spares) == ["s1", "s2"] and names(inv.hosts) == ["a", "b", "c"]
    s1, s2 = inv.spares
    assert (s1.user, s1.gpus, s1.workdir, s1.python) == ("me", 1, "/w", "/opt/py")
    assert s2.python == "python3"
    plan = ssh_plan.build_plan(inv, resolved(RunSpec("t.py"), inv), "r1")
    assert [n.host.name for n in plan.nodes] == ["b", "a", "c"]  # no spare while every host is healthy


@pytest.mark.parametrize("text, where", [
    ("hosts: [{name: a}]\nspares: [{name: s, adress: x}]", "lab.yaml:2: spares[0].adress: unknown key"),
    ("hosts: [{name: a}]\nspares: [{name: a}]", "lab.yaml:2: spares[0].name: duplicate host name 'a' (also hosts[0])"),
    ("hosts: [{name: a}]\nspares: [{name: s, port: 0}]", "lab.yaml:2: spares[0].port:"),
    ("hosts: [{name: a}]\nspares: [{name: s, env: {RANK: 1}}]", "lab.yaml:2: spares[0].env.RANK: a reserved name"),
    ("hosts: [{name: a}]\nmaster: {host: s}\nspares: [{name: s}]", "master.host: 's' is not one of the hosts (it is"),
])
def test_a_bad_spare_is_a_located_error(text, where):
    with pytest.raises(InventoryError) as e:
        parse(text, "lab.yaml")
    assert where in str(e.value), str(e.value)


def test_hosts_chooses_among_hosts_only_and_exclude_leaves_spares_out_too(inv):
    with pytest.raises(InventoryError) as e:
        inv.narrow(["a", "s1"])
    assert "s1: a spare, used only to replace a lost host" in str(e.value) and "list it under hosts:" in str(e.value)
    assert names(inv.narrow(["a", "c"]).spares) == ["s1", "s2"]
    narrowed = inv.narrow(None, ["c", "s1"])
    assert names(narrowed.hosts) == ["a", "b"] and names(narrowed.spares) == ["s2"]


def test_each_host_out_is_replaced_by_the_first_healthy_spare_after_the_hosts(inv):
    nxt = next_attempts.next_hosts(inv.hosts, ["a"], list(inv.spares), None)
    assert isinstance(nxt, next_attempts.Next)
    assert names(nxt.hosts) == ["b", "c", "s1"] and nxt.out == ("a",) and nxt.in_ == ("s1",)
    assert nxt.says() == "a out, s1 in"
    # the master b stays rank 0; the others keep their order, the spare last
    plan = ssh_plan.build_plan(inv.in_use(nxt.hosts), resolved(RunSpec("t.py"), inv), "r1", attempt=2)
    assert [(n.host.name, n.node_rank) for n in plan.nodes] == [("b", 0), ("c", 1), ("s1", 2)]


def test_a_lost_master_moves_rank_0_to_the_first_host_left(inv):
    nxt = next_attempts.next_hosts(inv.hosts, ["b"], list(inv.spares[1:]), None)
    assert isinstance(nxt, next_attempts.Next)
    new = inv.in_use(nxt.hosts)
    assert new.master.host == "a" and new.master.addr == "10.0.0.1"
    plan = ssh_plan.build_plan(new, resolved(RunSpec("t.py", max_restarts=1), new), "r1", attempt=2)
    assert [(n.host.name, n.node_rank) for n in plan.nodes] == [("a", 0), ("c", 1), ("s2", 2)]
    argv = plan.nodes[0].argv
    assert argv[argv.index("--rdzv-id") + 1] == "r1.attempt-2"  # an old torchrun coming back meets no one
    assert argv[argv.index("--rdzv-endpoint") + 1] == "10.0.0.1:29500"


def test_without_enough_spares_the_run_goes_on_with_fewer_only_down_to_nodes_min(inv):
    said = next_attempts.next_hosts(inv.hosts, ["a", "c"], list(inv.spares[:1]), None)
    assert said == "no healthy spare for c, and without --nodes MIN:MAX the run does not go on with fewer nodes"
    nxt = next_attempts.next_hosts(inv.hosts, ["a", "c"], list(inv.spares[:1]), (2, 3))
    assert isinstance(nxt, next_attempts.Next) and names(nxt.hosts) == ["b", "s1"]
    assert nxt.says() == "a out, c out, s1 in, going on with 2 nodes"
    said = next_attempts.next_hosts(inv.hosts, ["a", "c"], [], (3, 3))
    assert isinstance(said, str) and "fewer than --nodes 3:3 allows" in said


def test_candidates_skip_spares_used_already_and_quarantined(inv):
    assert names(next_attempts.candidates(inv.spares, used=["s1"], quarantined=[])) == ["s2"]
    assert names(next_attempts.candidates(inv.spares, used=[], quarantined=["s1", "s2"])) == []


def test_where_a_nodes_range_starts(inv):
    # how many attempts: tests/runspec/test_resolve.py (runspec.resolve's restarts)
    hosts, problem = next_attempts.start_hosts(inv.hosts, (1, 2))
    assert names(hosts) == ["a", "b"] and problem is None
    _, problem = next_attempts.start_hosts(inv.hosts, (4, 5))
    assert problem == "--nodes 4:5 needs at least 4 hosts, and the run has 3"


@pytest.mark.parametrize("text, want", [("1:2", (1, 2)), ("3", (3, 3)), (None, None)])
def test_nodes_option(text, want):
    assert parse_nodes(text) == want


@pytest.mark.parametrize("text", ["2:1", "0:2", "a:b", "1:", ":2", "١:٢", "1:2:3", "-1:2"])
def test_a_bad_nodes_option_is_bad_input(text):
    with pytest.raises(UsageError) as e:
        parse_nodes(text)
    assert "--nodes" in str(e.value) and "--nodes 2:4" in (e.value.hint or ""), e.value


def test_attempts_round_trip_and_old_records_read_without_them():
    rec = make_record("r1", ("a", "s1"))
    rec = type(rec)(**{**rec.__dict__, "attempts": (
        Attempt(2, "2026-12-02T08:00:00+00:00", ("b",), ("s1",), "b lost: the machine's failure, not the job's"),
        Attempt(None, "2026-12-02T09:00:00+00:00", ("a",), (), "a lost; --max-restarts 1 allows no more attempts"))})
    data = json.loads(json.dumps(rec.to_json()))
    assert data["attempts"][0] == {"attempt": 2, "at": "2026-12-02T08:00:00+00:00", "out": ["b"], "in": ["s1"],
                                   "why": "b lost: the machine's failure, not the job's"}
    back = RunRecord.from_json(data, "run.json")
    assert back.attempts == rec.attempts and back.attempt == 2
    assert back.attempts[0].describe() == ("attempt 2 (2026-12-02T08:00:00+00:00): b out, s1 in: "
                                           "b lost: the machine's failure, not the job's")
    del data["attempts"]
    old = RunRecord.from_json(data, "run.json")
    assert old.attempts == () and old.attempt == 1 and "attempts" not in old.to_json()


@pytest.mark.parametrize("bad, field", [
    ([{"attempt": 1, "at": "", "out": [], "in": [], "why": ""}], "attempts[0].attempt"),
    ([{"attempt": 2, "at": "", "out": ["../etc"], "in": [], "why": ""}], "attempts[0].out[0]"),
    ([{"attempt": 2, "at": "", "out": [], "in": [], "why": "x" * 5000}], "attempts[0].why"),
    ([{"attempt": "2", "at": "", "out": [], "in": [], "why": ""}], "attempts[0].attempt"),
    ([{"attempt": 2, "at": "", "out": [], "why": ""}], "attempts[0].in"),
    ([{"attempt": 2, "at": "", "out": [], "in": [], "why": "\0"}], "attempts[0].why"),
    ({"attempt": 2}, "attempts"),
    ([{}] * 1001, "attempts"),
])
def test_damaged_attempts_are_a_located_error(bad, field):
    data = json.loads(json.dumps(make_record("r1").to_json()))
    data["attempts"] = bad
    with pytest.raises(RecordError) as e:
        RunRecord.from_json(data, "run.json")
    assert f"run.json: {field}" in str(e.value), str(e.value)


def test_retire_command_moves_the_old_attempts_control_folder_aside(inv):
    node = ssh_plan.build_plan(inv, resolved(RunSpec("t.py"), inv), "r1").nodes[0]
    ctl = "/w/runs/r1/.clusterddp/b"
    assert ssh_plan.retire_command(node, 2) == (f"if [ -d {ctl} ]; then rm -rf {ctl}@attempt-1 "
                                         f"&& mv {ctl} {ctl}@attempt-1; fi")


def test_lost_nodes_of_earlier_attempts_round_trip_and_damage_is_a_located_error():
    """run.json's ``lost_nodes``: a lost host's old job, for `stop` to reach once the host answers."""
    old = make_record("r1", ("a", "b"))
    rec = type(old)(**{**old.__dict__, "nodes": old.nodes[:1], "lost": old.nodes[1:]})
    data = json.loads(json.dumps(rec.to_json()))
    assert [n["host"] for n in data["lost_nodes"]] == ["b"]
    assert RunRecord.from_json(data, "run.json").lost == rec.lost
    assert "lost_nodes" not in old.to_json() and RunRecord.from_json(old.to_json(), "run.json").lost == ()
    for bad, field in ((data["lost_nodes"] * 2, "lost_nodes"), ({"host": "b"}, "lost_nodes"),
                       ([{**data["lost_nodes"][0], "host": "../b"}], "lost_nodes[0].host"),
                       ([{**data["lost_nodes"][0], "marker": 5}], "lost_nodes[0].marker")):
        with pytest.raises(RecordError) as e:
            RunRecord.from_json({**data, "lost_nodes": bad}, "run.json")
        assert f"run.json: {field}" in str(e.value), str(e.value)


def test_each_attempt_adds_its_lost_hosts_to_every_earlier_attempts(inv):
    """run.json's ``lost_nodes`` keeps the lost hosts of every attempt, not only the last one's: each
    still runs its part of the job, out of reach, until `stop` or the end of the run reaches it."""
    from dataclasses import replace

    from clusterddp.backends.ssh.launch import next_attempt_record, node_records
    from clusterddp.record import NodeState
    first = ssh_plan.build_plan(inv, resolved(ssh_plan.RunSpec("t.py"), inv), "r1")
    rec = make_record("r1", nodes=tuple(node_records(first)))
    a = next(n for n in rec.nodes if n.host == "a")
    # attempt 1 loses a: attempt 2 runs on s1, b, c
    by = {h.name: h for h in (*inv.hosts, *inv.spares)}
    second = ssh_plan.build_plan(
        inv.in_use(tuple(by[h] for h in ("b", "c", "s1"))), first.spec, "r1", attempt=2
    )
    rec = next_attempt_record(rec, second, Attempt(2, "t2", ("a",), ("s1",), "a lost"),
                              (replace(a, state=NodeState.LOST),))
    assert [n.host for n in rec.lost] == ["a"] and [n.host for n in rec.nodes] == ["b", "c", "s1"]
    # attempt 2 loses c: a is still out there, and so is c now
    third = ssh_plan.build_plan(
        inv.in_use(tuple(by[h] for h in ("b", "s1", "s2"))), first.spec, "r1", attempt=3
    )
    lost_c = replace(next(n for n in rec.nodes if n.host == "c"), state=NodeState.LOST)
    rec = next_attempt_record(rec, third, Attempt(3, "t3", ("c",), ("s2",), "c lost"), (lost_c,))
    assert [n.host for n in rec.lost] == ["a", "c"]
    assert [x.attempt for x in rec.attempts] == [2, 3] and [n.host for n in rec.nodes] == ["b", "s1", "s2"]
    back = RunRecord.from_json(json.loads(json.dumps(rec.to_json())), "run.json")
    assert [n.host for n in back.lost] == ["a", "c"]
