"""Ranks that resumed from different points (issue 39 section 1): one node's torchrun finished its
ranks and waits in its exit barrier while another's restarts them (or its ranks lose their peers). The
supervisor ends the attempt as soon as it sees that (:meth:`Supervisor._split`), and the root cause says
what happened (:func:`clusterddp.failure.diverged`), not `Connection closed by peer`."""

from __future__ import annotations

import json
from types import SimpleNamespace

from clusterddp import failure as F
from clusterddp import policy
from clusterddp.backends.ssh.supervisor import Supervisor
from clusterddp.record import NodeState

START = b"[clusterddp] node 0/2 on node1: torchrun\n"
AGENT = b"I1206 04:30:01.123000 4242 site-packages/torch/distributed/elastic/agent/server/api.py:900] "
FINISHED = AGENT + b"[default] worker group successfully finished. Waiting 300 seconds for other agents to finish.\n"
RESTART = AGENT + b"[default] Worker group FAILED. 1/1 attempts left; will restart worker group\n"


def facts(host, rank, state, log, errors=()):
    report = {"joined": True, "reach": None, "errors": list(errors), "kernel_lines": [], "kernel_error": None,
              "nvidia_smi": None, "log": None}
    return F.NodeFacts(host, rank, 1, state, None if state == "stopped" else 1, None, log, report)


def efile(exc, msg, t=1.8e9, rank=1):
    extra = {"py_callstack": "Traceback (most recent call last):\n", "timestamp": str(int(t)),
             "clusterddp": {"rank": rank, "time": t}}
    return {"attempt": 0, "local_rank": 0, "data": json.dumps({"message": {"message": f"{exc}: {msg}",
                                                                           "extraInfo": extra}}), "truncated": False}


def test_one_node_finished_while_another_restarts_is_the_root_cause_not_the_peer_gone():
    early = facts("node1", 0, "failed", START + b"rank 0 resuming from epoch 70\n" + FINISHED)
    late = facts("node3", 1, "stopped", START + b"rank 1 resuming from epoch 0\n" + RESTART,
                 errors=[efile("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
                                               "Connection closed by peer [10.0.0.11]:1234")])
    f = F.diagnose([early, late], first_failed="node1")
    assert (f.host, f.kind) == ("node1", "diverged"), f
    head = f.summary.splitlines()[0]
    assert head == ("ranks resumed from different points: node1's ranks finished their work while node3's were "
                    "restarting them"), f.summary
    assert "resumed from different checkpoints, or one node's script finished early" in f.summary
    assert "Connection closed by peer" not in f.summary and f.others[0][0] == "node3"
    rec = SimpleNamespace(nodes=(), failure=f)
    decision = policy.after_failure(rec)  # type: ignore[arg-type]
    assert not decision.carry_on and "did not run the same steps" in decision.why


def test_a_finished_node_is_no_excuse_for_the_jobs_own_exception_nor_for_a_lost_node():
    early = facts("node1", 0, "failed", START + FINISHED)
    own = facts("node2", 1, "failed", START, errors=[efile("ValueError", "bad batch shape")])
    assert F.diagnose([early, own], first_failed="node2").kind == "exception"
    lost = facts("node2", 1, "lost", START)
    assert F.diverged([early, lost], {"node1": [], "node2": []}) is None
    # an earlier attempt's finish, before the last "[clusterddp] node" line, does not count
    assert F.diverged([facts("node1", 0, "failed", FINISHED + START), facts("node2", 1, "stopped", START + RESTART)],
                      {"node1": [], "node2": []}) is None


def _sup(names=("node1", "node3")) -> Supervisor:
    nodes = tuple(SimpleNamespace(host=SimpleNamespace(name=n)) for n in names)
    plan = SimpleNamespace(nodes=nodes, local=False)
    return Supervisor(plan, on_output=lambda h, b: None, fleet=object())  # type: ignore[arg-type]


def test_the_supervisor_ends_the_attempt_when_a_node_restarts_after_another_finished():
    sup = _sup()
    a, b = sup.nodes
    for n in (a, b):
        n.state = NodeState.RUNNING
    sup._scan(b, RESTART[:50])  # torchrun restarted every node together before: not a split
    sup._scan(b, RESTART[50:])
    sup._scan(a, FINISHED[:90])
    sup._scan(a, FINISHED[90:])  # a line cut between two chunks is still seen
    assert a.finished and b.restarted and b.restarted < a.finished
    assert sup._split() is None and a.state is NodeState.RUNNING
    sup._scan(b, b"rank 1 resuming from epoch 0\n" + RESTART)  # restarts after node1 finished
    assert sup._split() == "node1" and a.state is NodeState.FAILED
    assert a.error == "its ranks finished while node3 restarts its ranks: they resumed from different points"
    assert sup._events.qsize() == 3  # each word said (restart, finish, restart) is one event for the main loop


def test_a_node_that_finished_alone_is_not_a_split():
    sup = _sup()
    a, b = sup.nodes
    for n in (a, b):
        n.state = NodeState.RUNNING
    sup._scan(a, FINISHED)
    assert sup._split() is None
