"""An attached run's stragglers, told as they are named (clusterddp.stragglers.Watch): one command a node a
look, through the run's fleet (a fake transport at the seam); a host told once, again only after it recovered."""

from __future__ import annotations

import json

from clusterddp import stragglers as stragglers_module
from clusterddp.fleet import Fleet
from clusterddp.nodeops import nodes_of
from helpers import ScriptedNode, make_record


def tail(rank: int, state: str, n: int = 30) -> bytes:
    return b"".join((json.dumps({"t": 1000.0 + 2 * i, "ranks": {str(rank): [state, "all_reduce" if state == "w"
                                                                           else "extra (job.py:3)"]}}) + "\n").encode()
                    for i in range(n))


Node = ScriptedNode


def test_each_newly_named_host_is_told_once_and_again_after_it_recovered():
    rec = make_record("r1", hosts=("a", "b"))
    nodes = {"a": Node([tail(0, "w")] * 4), "b": Node([tail(1, "c"), tail(1, "c"), tail(1, "w"), tail(1, "c")])}
    told: list = []
    with Fleet([n.host for n in nodes_of(rec)], connect=lambda h: nodes[h.name]) as fleet:
        w = stragglers_module.Watch(fleet, nodes_of(rec), told.append)
        assert [s.host for s in w.look()] == ["b"]
        assert [s.host for s in w.look()] == ["b"]       # still slow: not told twice
        assert w.look() == []                             # recovered
        assert [s.host for s in w.look()] == ["b"]       # slow again: told again
    assert [(s.host, s.ranks) for s in told] == [("b", (1,)), ("b", (1,))]
    assert all(len(n.commands) == 4 and "where.jsonl" in n.commands[0] and "tail -c 65536" in n.commands[0]
               for n in nodes.values())


def test_a_node_that_does_not_answer_is_left_out_and_the_watch_never_raises_into_the_run():
    rec = make_record("r1", hosts=("a", "b"))
    nodes = {"a": Node([OSError("link down")]), "b": Node([tail(1, "c")])}
    told: list = []
    with Fleet([n.host for n in nodes_of(rec)], connect=lambda h: nodes[h.name]) as fleet:
        assert (
            stragglers_module.Watch(fleet, nodes_of(rec), told.append).look() == []
        )  # one host's ranks alone: none to compare
    assert told == []
