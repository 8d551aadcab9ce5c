"""The launcher side of leases, on pure data: what each node is asked, in which order, how a
refusal reads, and the queue's rule as the waiting launcher applies it."""

from __future__ import annotations

import pytest

from clusterddp import inventory, leases
from clusterddp.errors import LeaseBusy, UsageError
from clusterddp.plan import build_plan
from clusterddp.runspec import RunSpec
from helpers import resolved

INV = """
master: {host: b}
hosts:
  - {name: b, address: 10.0.0.2, gpus: [1, 3]}
  - {name: a, address: 10.0.0.9}
  - {name: c, address: 10.0.0.1, gpus: 4}
"""


def plan(**spec):
    inv = inventory.parse(INV, "inv.yaml")
    return build_plan(inv, resolved(RunSpec("t.py", **spec), inv), "r1")


def test_nodes_are_asked_in_one_order_for_their_slots_and_the_master_for_its_port():
    asks = leases.asks(plan(), port_fixed=False)
    assert [a.host.name for a in asks] == ["c", "b", "a"]  # by address, whatever the inventory's order
    by = {a.host.name: a for a in asks}
    assert (by["b"].slots, by["b"].need, by["b"].wants) == ((1, 3), None, "slots 1,3")
    assert (by["a"].need, by["a"].wants) == (None, "every slot")  # gpus: auto
    assert by["c"].need == 4 and by["b"].port == {"from": 29500, "span": 100} and by["a"].port is None
    fixed = {a.host.name: a for a in leases.asks(plan(gpus=1, master_port=29611), port_fixed=True)}
    assert (fixed["b"].slots, fixed["b"].need, fixed["b"].port) == (None, 1, {"fixed": 29611})  # --gpus wins


def view(host="b", capacity=2, holders=(), waiting=()):
    return leases.NodeView(host, capacity, tuple(holders), tuple(waiting))


HOLDER = leases.Holding("20261130-140211-ab12", "alice@laptop", "2026-11-30 14:02:11+0000", "b", (0, 1), 29500,
                        "running")


def test_a_refusal_names_every_holder_and_waiter_of_the_node_and_never_fitting_is_bad_input():
    a = {x.host.name: x for x in leases.asks(plan(), port_fixed=False)}["b"]
    w = leases.Waiting("0000000000000000009-r0", "r0", "bob@desk", "2026-11-30 14:05:00+0000", 2, None)
    e = leases._busy("r1", a, view(holders=[HOLDER], waiting=[w]), "busy", False)
    assert isinstance(e, LeaseBusy) and e.exit_code == 75 and e.holders == (HOLDER,)
    assert str(e).splitlines()[:3] == [
        "the run does not fit: it needs slots 1,3 on b, which has 2",
        "  b: slots 0,1 held by run 20261130-140211-ab12 of alice@laptop since 2026-11-30 14:02:11+0000, "
        "master port 29500 (running)",
        "  b: run r0 of bob@desk waits since 2026-11-30 14:05:00+0000 for 2 slot(s)"]
    assert "up --wait" in e.hint
    never = leases._busy("r1", a, view(), "slot 3 asked for, but the node has 2 (0..1)", True)
    assert isinstance(never, UsageError) and never.exit_code == 2 and "can never fit on b" in str(never)


@pytest.mark.parametrize("waiting, holders, fits", [
    ((), (), True),
    ((), [HOLDER], False),                                                      # every slot held
    ([leases.Waiting("0000000000000000001-x", "x", "u", "s", 1, None)], (), True),   # 2 free: 1 for x, 1 for us
    ([leases.Waiting("0000000000000000001-x", "x", "u", "s", 2, None)], (), False),  # x came first and needs both
    ([leases.Waiting("0000000000000000009-x", "x", "u", "s", 2, None)], (), True),   # x came after us
    ([leases.Waiting("0000000000000000001-x", "x", "u", "s", None, (0,))], (), True),
    ([leases.Waiting("0000000000000000001-x", "x", "u", "s", None, (1,))], (), False),  # x fixed on our slot
])
def test_the_queue_rule_as_a_waiter_reads_it(waiting, holders, fits):
    ask = leases.Ask(inventory.parse("hosts: [{name: b, gpus: 2}]", "i.yaml").hosts[0], "/c", None, (1,), None)
    views = {"b": view(holders=holders, waiting=waiting)}
    assert leases._may_fit([ask], views, "0000000000000000005-me") is fits


def test_a_waiter_is_told_its_place_and_whose_runs_hold_its_slots():
    ask = leases.Ask(inventory.parse("hosts: [{name: b, gpus: 2}]", "i.yaml").hosts[0], "/c", 2, None, None)
    ahead = [leases.Waiting(f"000000000000000000{i}-w{i}", f"w{i}", "u", "s", 1, None) for i in (1, 2, 8)]
    said = leases._position([ask], {"b": view(holders=[HOLDER], waiting=ahead)}, "0000000000000000005-me")
    assert said == ("waiting in the queue: position 3; the slots are held by run 20261130-140211-ab12 of "
                    "alice@laptop (b:0,1)")


def test_a_run_is_named_by_its_name_as_well_as_by_who_launched_it():
    a = {x.host.name: x for x in leases.asks(plan(), port_fixed=False)}["b"]
    named = leases.Holding("20261130-140211-ab12", "alice@laptop", "2026-11-30 14:02:11+0000", "b", (0, 1), 29500,
                           "running", "bert-base")
    w = leases.Waiting("0000000000000000009-r0", "r0", "bob@desk", "2026-11-30 14:05:00+0000", 2, None, "sweep-3")
    lines = str(leases._busy("r1", a, view(holders=[named], waiting=[w]), "busy", False)).splitlines()
    assert "held by run 20261130-140211-ab12 (bert-base) of alice@laptop since" in lines[1]
    assert lines[2] == "  b: run r0 (sweep-3) of bob@desk waits since 2026-11-30 14:05:00+0000 for 2 slot(s)"
    ask = leases.Ask(inventory.parse("hosts: [{name: b, gpus: 2}]", "i.yaml").hosts[0], "/c", 2, None, None)
    said = leases._position([ask], {"b": view(holders=[named])}, "0000000000000000005-me")
    assert said.endswith("held by run 20261130-140211-ab12 (bert-base) of alice@laptop (b:0,1)")
    # the request a node records it from carries it
    import json
    assert json.loads(leases._request(ask, "r1", "me@x", "now", "bert-base"))["name"] == "bert-base"


def test_a_waiter_is_never_told_that_nobody_holds_its_slots():
    """Between a holder giving its slots back and the next take, or while they are kept for the runs
    ahead, a waiting run was told "the slots are held by nobody"."""
    ask = leases.Ask(inventory.parse("hosts: [{name: b, gpus: 2}]", "i.yaml").hosts[0], "/c", 2, None, None)
    ahead = [leases.Waiting(f"000000000000000000{i}-w{i}", f"w{i}", "u@h", "s", 1, None, "job" if i == 1 else None)
             for i in (1, 2, 8)]
    kept = leases._position([ask], {"b": view(waiting=ahead)}, "0000000000000000005-me")
    assert kept == ("waiting in the queue: position 3; the slots are free, kept for the run(s) ahead: "
                    "run w1 (job) of u@h; run w2 of u@h")
    free = leases._position([ask], {"b": view()}, "0000000000000000005-me")
    assert free == "waiting in the queue: position 1; the slots are free now; taking them"
    assert "nobody" not in kept + free


def test_every_node_is_told_the_runs_name_with_its_request(monkeypatch):
    import json
    sent = []

    class Channel:  # the node program's side of the channel: it answers "taken"
        def __init__(self, host, t, command, stdin):
            sent.append((host, json.loads(stdin)))

        def reply(self):
            return {"ok": True, "slots": [0], "port": 29500}

    class Fleet:
        def transport(self, host):
            return None
    monkeypatch.setattr(leases, "_Channel", Channel)
    p = plan(name="bert-base")
    leases.try_acquire(p, Fleet(), leases.asks(p, port_fixed=False), user="me@x")
    assert [(h, r["run"], r["name"], r["user"]) for h, r in sent] == [
        (h, "r1", "bert-base", "me@x") for h in ("c", "b", "a")]


class _Nodes:
    """The node side of every host's lease channel, scripted: ``answers[host]`` is the list of replies
    that host gives, one per try. ``events`` records each ask and each read of a reply, in order, and
    what the lease gave back (``release`` runs its command through ``each``)."""

    def __init__(self, answers):
        self.answers = {h: list(r) for h, r in answers.items()}
        self.events, self.released = [], []
        nodes = self

        class Channel:
            def __init__(self, host, t, command, stdin):
                nodes.events.append(("ask", host))
                self.host = host

            def reply(self):
                nodes.events.append(("reply", self.host))
                return nodes.answers[self.host].pop(0)
        self.Channel = Channel

    def transport(self, host):
        return None

    def each(self, fn, hosts):
        self.released += [h.name for h in hosts]


OK = {"ok": True, "slots": [0], "port": 29500}
TAKEN = {"ok": False, "capacity": 1, "why": "busy", "holders": [
    {"garbled": False, "run": "r0", "user": "u@h", "since": "s", "host": "b", "slots": [0], "port": None,
     "state": "starting"}]}


def test_the_first_try_asks_every_node_at_once_and_a_refusal_gives_back_every_node_taken(monkeypatch):
    nodes = _Nodes({"c": [OK], "b": [TAKEN], "a": [OK]})
    monkeypatch.setattr(leases, "_Channel", nodes.Channel)
    p = plan()
    with pytest.raises(LeaseBusy) as e:
        leases.try_acquire(p, nodes, leases.asks(p, port_fixed=False), user="me@x", together=True)
    # every node asked before any answer is read, every answer read before anything is given back
    assert nodes.events == [("ask", "c"), ("ask", "b"), ("ask", "a"), ("reply", "c"), ("reply", "b"), ("reply", "a")]
    assert sorted(nodes.released) == ["a", "c"]  # a, asked after the refusing b, is given back too
    assert "it needs slots 1,3 on b" in str(e.value) and e.value.holders[0].run == "r0"


def test_the_first_refusal_in_the_nodes_order_is_the_one_told_whichever_answered(monkeypatch):
    nodes = _Nodes({"c": [OK], "b": [TAKEN], "a": [{**TAKEN, "capacity": 7}]})
    monkeypatch.setattr(leases, "_Channel", nodes.Channel)
    p = plan()
    with pytest.raises(LeaseBusy) as e:
        leases.try_acquire(p, nodes, leases.asks(p, port_fixed=False), user="me@x", together=True)
    assert "on b, which has 1" in str(e.value) and nodes.released == ["c"]


def test_a_retry_while_another_launcher_is_taking_the_nodes_asks_them_one_after_another(monkeypatch):
    """The first try asks all at once; after a refusal by a run still starting, the retry goes node
    by node in the one order, so two launchers that each took half meet on the first node."""
    nodes = _Nodes({"c": [OK, OK], "b": [TAKEN, OK], "a": [OK, OK]})
    monkeypatch.setattr(leases, "_Channel", nodes.Channel)
    p = plan()
    lease = leases.acquire(p, nodes, port_fixed=False, user="me@x", sleep=lambda s: None)
    assert nodes.events[6:] == [("ask", "c"), ("reply", "c"), ("ask", "b"), ("reply", "b"), ("ask", "a"),
                                ("reply", "a")]
    assert nodes.events[:3] == [("ask", "c"), ("ask", "b"), ("ask", "a")]
    assert sorted(lease.grants) == ["a", "b", "c"] and lease.port == 29500
