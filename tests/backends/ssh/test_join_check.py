"""`up`'s join check (issue 24, section 3): under load it once named the master itself ("node1: never
joined ...: cannot reach the master 10.100.0.11 from it (timed out)") while node2 was the one blocked.
A host is never unreachable from itself, and the probe retries a connection that timed out: a master
too busy to accept drops a connection (its accept queue full) and takes the next."""

from __future__ import annotations

import socket
from contextlib import contextmanager
from dataclasses import replace

from clusterddp.backends.ssh.supervisor import NodeState, Supervisor
from clusterddp.failure import not_joined
from clusterddp.node import diagnose as diagnose_module
from test_supervisor import job_pids, make_plan

M = ("10.0.0.11", 29511)
HEAD = "never joined the rendezvous within 15s"


def test_the_master_is_never_unreachable_from_itself():
    # the report of issue 24: both late, both probes timed out (the master's under load)
    assert not_joined({"node1": "timed out", "node2": "timed out"}, "node1", M, 15) == [
        ("node2", f"{HEAD}: cannot reach the master 10.0.0.11:29511 from it (timed out)")]
    # nothing listening on the master's own port is certain: that is why the others are refused
    assert not_joined({"node1": "refused", "node2": "refused"}, "node1", M, 15) == [
        ("node1", f"{HEAD}: nothing listens on the master port 10.0.0.11:29511 there (its torchrun has not "
                  "opened it)"),
        ("node2", f"{HEAD}: cannot reach the master 10.0.0.11:29511 from it (refused)")]
    # the master alone late, its own probe timed out: named, but not as cut off from itself
    assert not_joined({"node1": "timed out"}, "node1", M, 15) == [
        ("node1", f"{HEAD} (it is the master; its torchrun is still starting or waits for the others)")]
    assert not_joined({"node1": "ok", "node2": "ok"}, "node1", M, 15)[1] == (
        "node2", f"{HEAD} (it reaches the master 10.0.0.11:29511; its torchrun is still starting or waits for "
                 "the others)")


@contextmanager
def busy_master():
    """A listening port whose accept queue is full (a master too busy to accept): the kernel drops every
    new connection's SYN until ``free()`` accepts the one queued."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    queued = socket.create_connection(server.getsockname(), timeout=5)  # fills the queue of 1
    held: list[socket.socket] = []

    def free() -> None:
        conn, _ = server.accept()
        held.append(conn)
    try:
        yield server.getsockname()[1], free
    finally:
        for s in (queued, server, *held):
            s.close()


def test_the_probe_retries_a_connection_a_busy_master_dropped(monkeypatch):
    real = diagnose_module.connect_once
    tries: list[str] = []
    with busy_master() as (port, free):
        def once(addr, p):
            tries.append(real(addr, p))
            if len(tries) == 1:
                free()  # the master catches up after the first try gave up
            return tries[-1]
        monkeypatch.setattr(diagnose_module, "connect_once", once)
        assert diagnose_module.reach("127.0.0.1", port) == "ok"
    assert tries == ["timed out", "ok"]
    with socket.socket() as s:  # nothing listens: refused at once, no retry
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    assert diagnose_module.reach("127.0.0.1", closed) == "refused"


def test_the_join_check_names_the_blocked_node_not_the_master_whose_own_probe_timed_out(tmp_path):
    """Real supervisor, node programs and probes (local transport, a stand-in torchrun that never joins):
    both nodes' probes of a master that accepts nothing time out; the other node is named, the master
    stopped. Mutation: the master's own probe counted (the old rule) names the master "a"."""
    with busy_master() as (port, _):
        p = make_plan(tmp_path, {"a": "hang", "b": "hang"})
        p = replace(p, master_addr="127.0.0.1", master_port=port)
        sup = Supervisor(p, on_output=lambda h, b: None, grace_s=2, join_timeout_s=1)
        sup.start()
        out = sup.follow()
    a, b = sup.nodes
    assert out.status == "failed" and out.first_failed == "b", (a.error, b.error)
    assert b.state is NodeState.FAILED and b.error == (
        f"never joined the rendezvous within 1s: cannot reach the master 127.0.0.1:{port} from it (timed out)")
    assert a.state is NodeState.STOPPED and a.error is None
    assert job_pids(p) == []
