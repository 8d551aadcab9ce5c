"""Ranks that resumed from different points (issue 39 section 1): one node's torchrun finished its
ranks and waits in its exit barrier while another's restarts them (or its ranks lose their peers). The
supervisor ends the attempt as soon as it sees that (:meth:`Supervisor._split`), and the root cause says
what happened (:func:`clusterddp.failure.diverged`), not `Connection closed by peer`."""

from __future__ import annotations

import json
from types import SimpleNamespace

from clusterddp import failure as failures
from clusterddp import policy
from clusterddp.backends.ssh.supervisor import Supervisor
from clusterddp.record import NodeState

START = b"[clusterddp] node 0/2 on node1: torchrun\n"
AGENT = b"I1206 04:30:01.123000 4242 site-packages/torch/distributed/elastic/agent/server/api.py:900] "
FINISHED = b"[clusterddp] torchrun: this node's ranks finished; it waits for the other nodes (its exit barrier)\n"
RESTART = b"[clusterddp] torchrun restarts this node's ranks\n"


def facts(host, rank, state, log, errors=()):
    report = {"joined": True, "reach": None, "errors": list(errors), "kernel_lines": [], "kernel_error": None,
              "nvidia_smi": None, "log": None}
    return failures.NodeFacts(host, rank, 1, state, None if state == "stopped" else 1, None, log, report)


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
    f = failures.diagnose([early, late], first_failed="node1")
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
    assert failures.diagnose([early, own], first_failed="node2").kind == "exception"
    lost = facts("node2", 1, "lost", START)
    assert failures.diverged([early, lost], {"node1": [], "node2": []}) is None
    # an earlier attempt's finish, before the last "[clusterddp] node" line, does not count
    assert (
        failures.diverged(
            [facts("node1", 0, "failed", FINISHED + START), facts("node2", 1, "stopped", START + RESTART)],
            {"node1": [], "node2": []},
        )
        is None
    )


def _sup(names=("node1", "node3")) -> Supervisor:
    nodes = tuple(SimpleNamespace(host=SimpleNamespace(name=n)) for n in names)
    plan = SimpleNamespace(nodes=nodes, local=False)
    return Supervisor(plan, on_output=lambda h, b: None, fleet=object())  # type: ignore[arg-type]


def test_the_supervisor_ends_the_attempt_when_a_node_restarts_after_another_finished():
    sup = _sup()
    a, b = sup.nodes
    for n in (a, b):
        n.state = NodeState.RUNNING
    sup._scan(a, RESTART)
    sup._scan(b, RESTART[:20])  # a line cut between two chunks is seen once, whole
    sup._scan(b, RESTART[20:])
    sup._scan(a, b"rank 0 resuming training from snapshot at epoch 0\n" + FINISHED[:30])
    sup._scan(a, FINISHED[30:])
    assert a.finished and (a.restarts, b.restarts) == (1, 1)
    assert sup._split() is None and a.state is NodeState.RUNNING  # torchrun restarted every node: its own
    sup._scan(b, b"rank 1 resuming training from snapshot at epoch 0\n" + RESTART)  # node3 alone restarts
    assert sup._split() == "node1" and a.state is NodeState.FAILED
    assert a.error == "its ranks finished while node3 restarts its ranks: they resumed from different points"
    assert sup._events.qsize() == 4  # each word said (restart, restart, finish, restart) is one event


def test_torchrun_started_by_clusterddp_says_when_it_restarts_its_ranks_and_not_a_finish_that_did_not_wait(tmp_path):
    import os
    import subprocess
    import sys

    from clusterddp.nodescript import FINISHED_MARK, RESTART_MARK, TORCHRUN
    job = tmp_path / "once.py"
    job.write_text("import os, sys\nsys.exit(1 if os.environ['TORCHELASTIC_RESTART_COUNT'] == '0' else 0)\n")
    r = subprocess.run([sys.executable, "-c", TORCHRUN, "torch.distributed.run", "--standalone",
                        "--nproc-per-node", "1", "--max-restarts", "1", "--monitor-interval", "0.1", str(job)],
                       capture_output=True, text=True, timeout=240, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    assert r.stderr.count(RESTART_MARK) == 1 and FINISHED_MARK not in r.stderr, r.stderr
    assert "INFO" not in r.stderr and "will restart worker group" not in r.stderr  # torch's INFO lines stay hidden
    assert failures.finished(("[clusterddp] node 0/1\n" + FINISHED_MARK + "\n").encode())
    assert failures.finished(
        START + AGENT + b"Local worker group finished (WorkerState.SUCCEEDED). Waiting 300 seconds\n"
    )


def test_a_node_that_finished_alone_is_not_a_split():
    sup = _sup()
    a, b = sup.nodes
    for n in (a, b):
        n.state = NodeState.RUNNING
    sup._scan(a, FINISHED)
    assert sup._split() is None
