"""The supervisor's state machine on real processes: local transport, a stand-in `python`.

These tests use the same rendered launch.sh, start/follow/status/teardown commands as a real
run; only torchrun is replaced by a tiny shell script so each case takes about a second.
The real thing (sshd hosts, real torchrun) is covered in test_up_ssh.py.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import inventory, nodeops, plan
from clusterddp.backends.ssh.supervisor import NodeState, Supervisor
from clusterddp.errors import HostError
from clusterddp.node.follow import WHOLE_MARK
from clusterddp.node.reply import STATUS_MARK
from clusterddp.nodeops import parse_status
from clusterddp.nodescript import MARKER
from clusterddp.runspec import RunSpec
from clusterddp.store import new_run_id
from clusterddp.transport import CommandResult, connect
from helpers import eventually, resolved

FAKE_PY = """#!/bin/bash
# Stand-in for torchrun (`python -c "$cddp_torchrun" torch.distributed.run ...`): behaves as $MODE says.
# `python -S -c` and any other `python -c` (clusterddp's own helpers on the node, e.g. the log follower,
# and launch.sh's question which clusterddp.train a script would import) run the real one.
case "$1" in -S) exec PYTHON "$@" ;; -c) [ "$3" = torch.distributed.run ] || exec PYTHON "$@" ;; esac
echo "hello from $CLUSTERDDP_HOST rank $CLUSTERDDP_NODE_RANK"
case "$MODE" in
  ok) exit 0 ;;
  slow) sleep 1.5; exit 0 ;;
  fail) sleep 0.5; echo "boom" >&2; exit 3 ;;
  hang) sleep 300 & wait ;;
esac
"""


def make_plan(tmp_path: Path, modes: dict[str, str]) -> plan.LaunchPlan:
    py = tmp_path / "fakepy"
    py.write_text(FAKE_PY.replace("PYTHON", sys.executable))
    py.chmod(0o755)
    hosts = tuple(
        replace(inventory.local(python=str(py)).hosts[0], name=name, workdir=str(tmp_path / name),
                env=(("MODE", mode),))
        for name, mode in modes.items())
    inv = inventory.Inventory("t", "t", hosts, inventory.Master(hosts[0].name, "127.0.0.1", 29500))
    # A fresh run id: teardown ends processes by their run marker machine-wide, so a fixed id
    # would let another test session on this machine end this one's jobs (and the reverse).
    return plan.build_plan(inv, resolved(RunSpec("t.py"), inv), new_run_id())


def job_pids(p: plan.LaunchPlan) -> list[str]:
    out = []
    for n in p.nodes:
        r = subprocess.run(["bash", "-c", f"grep -lzxF {MARKER}={n.marker} /proc/[0-9]*/environ"],
                           capture_output=True, text=True)
        out += r.stdout.split()
    return out


def run(p, **kw):
    lines: list[tuple[str, bytes]] = []
    sup = Supervisor(p, on_output=lambda h, b: lines.append((h, b)), grace_s=2, **kw)
    sup.start()
    return sup, lines


def test_all_nodes_succeed(tmp_path):
    p = make_plan(tmp_path, {"a": "ok", "b": "ok"})
    sup, lines = run(p)
    out = sup.follow()
    assert out.status == "succeeded" and out.exit_code == 0
    assert [n.exit_code for n in out.nodes] == [0, 0]
    text = b"".join(b for h, b in lines if h == "b").decode()
    assert "hello from b rank 1" in text
    assert (tmp_path / f"b/runs/{p.run_id}/.clusterddp/b/exit_code").read_text().strip() == "0"


def test_first_failure_ends_every_other_node(tmp_path):
    p = make_plan(tmp_path, {"a": "hang", "b": "fail"})
    sup, lines = run(p)
    t0 = time.monotonic()
    out = sup.follow()
    assert out.status == "failed" and out.first_failed == "b"
    assert time.monotonic() - t0 < 10
    a, b = sup.nodes
    assert (b.state, b.exit_code) == (NodeState.FAILED, 3)
    assert a.state == NodeState.STOPPED
    assert job_pids(p) == []  # nothing of the run remains, the backgrounded sleep included
    assert b"boom" in b"".join(x for h, x in lines if h == "b")


def test_ctrl_c_ends_every_node(tmp_path):
    p = make_plan(tmp_path, {"a": "hang", "b": "hang"})
    sup, _ = run(p)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # even if started with SIGINT ignored
    try:
        threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
        with pytest.raises(KeyboardInterrupt):
            sup.follow()
    finally:
        signal.signal(signal.SIGINT, old)
    assert sup.outcome.status == "stopped"
    assert {n.state for n in sup.nodes} == {NodeState.STOPPED}
    assert job_pids(p) == []


class _Wrapped:
    """A transport passed through, for a test to watch or break its `run`."""

    def __init__(self, inner) -> None:
        self.inner, self.name = inner, inner.name

    def run(self, command, **kw):
        return self.inner.run(command, **kw)

    def stream(self, command, on_data, **kw):
        return self.inner.stream(command, on_data, **kw)

    def ping(self):
        self.inner.ping()

    def close(self):
        self.inner.close()


class _Flaky(_Wrapped):
    """Wraps a transport; after ``fail_after`` commands every further `run`, and every ping, fails
    like a dead host."""

    def __init__(self, inner, fail_after: int) -> None:
        super().__init__(inner)
        self.calls, self.fail_after = 0, fail_after

    def run(self, command, **kw):
        self.calls += 1
        if self.calls > self.fail_after:
            raise HostError(self.name, "timed out")
        return self.inner.run(command, **kw)

    def ping(self):
        if self.calls >= self.fail_after:
            raise HostError(self.name, "timed out")


def test_a_host_that_stops_answering_is_lost_and_the_run_fails(tmp_path):
    p = make_plan(tmp_path, {"a": "hang", "b": "hang"})
    flaky = {}

    def conn(host):
        t = connect(host)
        if host.name == "b":
            t = flaky.setdefault("b", _Flaky(t, fail_after=1))  # the start command succeeds
        return t
    sup, _ = run(p, connect=conn, heartbeat_s=0.2)
    out = sup.follow()
    assert out.status == "failed" and out.first_failed == "b"
    assert sup.nodes[1].state == NodeState.LOST and "stopped answering" in sup.nodes[1].error
    subprocess.run(["bash", "-c", plan.teardown_command(p.nodes[1], 1)], check=True)  # what a later `stop` does
    assert job_pids(p) == []


class _Counting(_Wrapped):
    """Wraps a transport; counts the status commands it is asked to run."""

    def __init__(self, inner, node: plan.NodeLaunch) -> None:
        super().__init__(inner)
        self.status, self.statuses = plan.status_command(node), 0

    def run(self, command, **kw):
        self.statuses += command == self.status
        return self.inner.run(command, **kw)


def test_up_local_runs_without_heartbeats_and_is_never_lost_for_lack_of_them(tmp_path):
    # `up local` has no link to lose; its heartbeats only took the CPUs from the job. Beats every
    # 0.05 s would ask the status some 30 times during this 1.5 s job; without them, a node silent
    # for lost_after_s must not be called lost either.
    py = tmp_path / "fakepy"
    py.write_text(FAKE_PY.replace("PYTHON", sys.executable))
    py.chmod(0o755)
    host = replace(inventory.local(python=str(py)).hosts[0], env=(("MODE", "slow"),))
    inv = inventory.Inventory("local", "local", (host,), inventory.Master(host.name, "127.0.0.1", 29500))
    p = plan.build_plan(inv, resolved(RunSpec("t.py"), inv), new_run_id(), local_run_dir=str(tmp_path),
                        local_control_dir=str(tmp_path / "ctl"))
    assert p.local
    counted: list[_Counting] = []

    def conn(host):
        counted.append(_Counting(connect(host), p.nodes[0]))
        return counted[-1]
    sup = Supervisor(p, on_output=lambda h, b: None, connect=conn, heartbeat_s=0.05, lost_after_s=0.5, grace_s=2)
    sup.start()
    out = sup.follow()
    sup.close()
    assert out.status == "succeeded" and sup.nodes[0].exit_code == 0, sup.nodes[0].error
    assert [c.statuses for c in counted] == [0]  # the exit code came on the log stream's stderr, after the log


class Scripted:
    """A node at the seam, for the supervisor's event loop alone: the start commands succeed; the log
    stream lasts until ``ended`` is set, then the status says ``exit <code>``; while ``hang`` is set a
    status call hangs for its whole timeout, like a host that stopped answering; teardown ends the job."""

    def __init__(self, node: plan.NodeLaunch, grace: float) -> None:
        self.node, self.name, self.grace = node, node.host.name, grace
        self.code = 0
        self.delay = 0.0  # how long every status takes (a slow but alive node)
        self.ended, self.hang, self.hanging, self.closed = (threading.Event() for _ in range(4))
        self.torn_down_at: float | None = None
        self.pings, self.commands = 0, []

    def run(self, command, *, timeout=None, stdin=None):
        self.commands.append(command)
        if command == plan.status_command(self.node):
            if self.hang.is_set():
                self.hanging.set()
                self.closed.wait(timeout)
                raise HostError(self.name, f"no answer within {timeout:g}s")
            if timeout is not None and self.delay > timeout:
                time.sleep(timeout)
                raise HostError(self.name, f"no answer within {timeout:g}s")
            time.sleep(self.delay)
            said = f"exit {self.code}" if self.ended.is_set() else "running"
            return CommandResult(0, f"{STATUS_MARK}{said}\n".encode(), b"")
        if command == plan.teardown_command(self.node, self.grace):
            self.torn_down_at = time.monotonic()
            self.hang.clear()  # it answers again
            if not self.ended.is_set():
                self.code = 143
                self.ended.set()
                return CommandResult(0, b"terminated\n", b"")
            return CommandResult(0, b"clean\n", b"")
        return CommandResult(0, b"", b"")

    def stream(self, command, on_data, **kw):
        assert command == plan.follow_status_command(self.node)
        while not (self.ended.wait(0.01) or self.closed.is_set()):
            pass
        if self.ended.is_set():  # as the node's status command answers after the follower: on stderr
            kw["stderr_to"] += f"{STATUS_MARK}exit {self.code}\n".encode()
        return 0

    def ping(self):
        self.pings += 1
        if self.hang.is_set():
            self.hanging.set()
            self.closed.wait()
            raise HostError(self.name, "connection lost")
        time.sleep(self.delay)

    def close(self):
        self.closed.set()


def test_a_host_hanging_on_a_heartbeat_does_not_delay_another_nodes_failure(tmp_path):
    # a's heartbeat hangs for its connect_timeout (60 s) while b fails. Heartbeats run beside the event
    # loop, so b's failure starts the teardown at once; were they run inside it, only after the hang.
    hang_s, bound_s = 60.0, 10.0
    p = make_plan(tmp_path, {"a": "hang", "b": "fail"})
    p = replace(p, nodes=tuple(replace(n, host=replace(n.host, connect_timeout=hang_s)) for n in p.nodes))
    fakes = {n.host.name: Scripted(n, grace=1.0) for n in p.nodes}
    a, b = fakes["a"], fakes["b"]
    a.hang.set()
    sup = Supervisor(p, on_output=lambda h, d: None, connect=lambda h: fakes[h.name], heartbeat_s=0.05, grace_s=1.0)
    sup.start()
    failed_at = []

    def fail_b() -> None:
        assert a.hanging.wait(30), "no heartbeat reached a"
        b.code = 3
        failed_at.append(time.monotonic())
        b.ended.set()
    threading.Thread(target=fail_b, daemon=True).start()
    try:
        out = sup.follow()
    finally:
        for f in fakes.values():
            f.close()  # ends a heartbeat still hanging on a
    assert a.torn_down_at is not None and failed_at
    took = a.torn_down_at - failed_at[0]
    assert took < bound_s, f"a's teardown began {took:.1f}s after b failed; a's heartbeat hangs {hang_s:g}s"
    assert (out.status, out.first_failed) == ("failed", "b")
    assert [(n.state, n.exit_code) for n in sup.nodes] == [(NodeState.STOPPED, 143), (NodeState.FAILED, 3)]


def test_heartbeats_ping_the_connection_and_run_no_command_on_the_node(tmp_path):
    # A status command per beat started a shell and scanned /proc on the node every 2 s, beside the
    # job it watches; a ping is answered by the node's sshd. What runs there: the two start commands
    # (and the log's stream, which brings the exit code once the log ended: no status command of its own).
    p = make_plan(tmp_path, {"a": "hang", "b": "hang"})
    fakes = {n.host.name: Scripted(n, grace=1.0) for n in p.nodes}
    sup = Supervisor(p, on_output=lambda h, d: None, connect=lambda h: fakes[h.name], heartbeat_s=0.02, grace_s=1.0)
    sup.start()

    def end_after_some_beats() -> None:
        eventually(lambda: min(f.pings for f in fakes.values()) >= 5, 30)
        for f in fakes.values():
            f.ended.set()
    threading.Thread(target=end_after_some_beats, daemon=True).start()
    try:
        out = sup.follow()
    finally:
        for f in fakes.values():
            f.close()
    assert out.status == "succeeded", [(n.state, n.error) for n in sup.nodes]
    for n in p.nodes:
        f = fakes[n.host.name]
        assert f.pings >= 5
        assert f.commands == [plan.start_node_command(n, False, False, len(n.launch_script.encode()))[0]]


def test_a_start_step_that_fails_is_named(tmp_path):
    # the run folder, the upload and the unpack are one command: its exit code says which step failed
    p = make_plan(tmp_path, {"a": "ok"})
    tar = tmp_path / "source.tar.gz"
    tar.write_bytes(b"not a tarball")

    sup = Supervisor(p, on_output=lambda h, b: None, grace_s=1, source_tar=tar)
    with pytest.raises(HostError) as e:
        sup.start()
    assert e.value.host == "a" and "cannot unpack the script folder" in str(e.value), e.value
    assert job_pids(p) == []


def test_one_start_command_splits_its_stdin_into_launch_sh_and_the_tarball(tmp_path):
    """launch.sh is the first bytes of the start command's stdin, exactly (the tarball follows it); a
    stdin cut short inside launch.sh is refused as "cannot write launch.sh", and nothing starts."""
    import io
    import tarfile
    p = make_plan(tmp_path, {"a": "ok"})
    n = p.nodes[0]
    script = n.launch_script.encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        info = tarfile.TarInfo("data.txt")
        info.size = 3
        tf.addfile(info, io.BytesIO(b"abc"))
    tar = tmp_path / "src.tar.gz"
    tar.write_bytes(buf.getvalue())
    command, _ = plan.start_node_command(n, True, False, len(script))
    t = connect(n.host)
    r = t.run(command, stdin=(script, tar), timeout=60)
    assert r.exit_code == 0, r.stderr
    assert Path(n.control_dir, "launch.sh").read_bytes() == script
    assert Path(n.run_dir, "data.txt").read_bytes() == b"abc"
    eventually(lambda: Path(n.control_dir, "exit_code").exists(), 30)

    q = make_plan(tmp_path, {"b": "ok"})
    m = q.nodes[0]
    command, steps = plan.start_node_command(m, False, False, len(m.launch_script.encode()))
    r = t.run(command, stdin=m.launch_script.encode()[:-1], timeout=60)
    assert plan.failed_step(steps, r.exit_code) == "cannot write launch.sh", (r.exit_code, r.stderr)
    assert job_pids(q) == [] and not Path(m.control_dir, "pid").exists()


def test_start_failure_names_the_host_and_starts_nothing(tmp_path):
    p = make_plan(tmp_path, {"a": "hang", "b": "ok"})
    (tmp_path / "b").write_text("a file where the workdir should be")
    sup = Supervisor(p, on_output=lambda h, b: None, grace_s=1)
    with pytest.raises(HostError) as e:
        sup.start()
    assert e.value.host == "b" and "cannot create the run folder" in str(e.value)
    assert job_pids(p) == []


def test_a_silent_node_is_lost_after_lost_after_s_its_teardown_is_skipped_and_the_others_stopped(tmp_path):
    lost_after = 1.5
    p = make_plan(tmp_path, {"a": "hang", "b": "hang"})
    fakes = {n.host.name: Scripted(n, grace=1.0) for n in p.nodes}
    a, b = fakes["a"], fakes["b"]
    states: dict[str, float] = {}
    sup = Supervisor(p, on_output=lambda h, d: None, connect=lambda h: fakes[h.name], heartbeat_s=0.05,
                     lost_after_s=lost_after, grace_s=1.0,
                     on_state=lambda h, st, n: states.setdefault(f"{h}:{st}", time.monotonic()))
    sup.start()
    b.hang.set()  # b's link dies: its heartbeats hang until its connection is closed
    cut = time.monotonic()
    try:
        out = sup.follow()
    finally:
        for f in fakes.values():
            f.close()
    took = states["b:lost"] - cut
    assert lost_after - 0.2 <= took < lost_after + 3.0, took
    assert (out.status, out.first_failed) == ("failed", "b")
    assert "stopped answering" in sup.nodes[1].error
    assert b.torn_down_at is None, "the teardown waited on the lost node"
    assert b.closed.is_set(), "the lost node's connection stays open"
    assert a.torn_down_at is not None and a.torn_down_at - states["b:lost"] < 3.0
    assert [(n.state, n.exit_code) for n in sup.nodes] == [(NodeState.STOPPED, 143), (NodeState.LOST, None)]


def test_a_slow_but_alive_node_is_not_lost(tmp_path):
    # every status takes a third of lost_after_s: slow, but it answers; the run ends as the jobs do
    lost_after = 1.5
    p = make_plan(tmp_path, {"a": "hang", "b": "hang"})
    fakes = {n.host.name: Scripted(n, grace=1.0) for n in p.nodes}
    fakes["b"].delay = lost_after / 3
    sup = Supervisor(p, on_output=lambda h, d: None, connect=lambda h: fakes[h.name], heartbeat_s=0.05,
                     lost_after_s=lost_after, grace_s=1.0)
    sup.start()
    threading.Timer(3 * lost_after, lambda: [f.ended.set() for f in fakes.values()]).start()
    try:
        out = sup.follow()
    finally:
        for f in fakes.values():
            f.close()
    assert out.status == "succeeded", [(n.state, n.error) for n in sup.nodes]


@pytest.mark.parametrize("text, parsed", [
    ("running\n", ("running", None)), ("exit 0\n", ("exited", 0)), ("exit 143", ("exited", 143)),
    ("exit 255\r\n", ("exited", 255)), ("lost", ("lost", None)), ("missing", ("missing", None)),
    ("garbage", ("garbled", None)), ("", ("garbled", None)), ("exit", ("garbled", None)),
    ("exit 256", ("exited", None)), ("exit -1", ("exited", None)), ("exit +3", ("exited", None)),
    ("exit \u0663", ("exited", None)), ("exit 1_0", ("exited", None)), ("exit 0003", ("exited", None)),
    ("exit " + "9" * 5000, ("garbled", None)), ("exit 3\nexit 4", ("garbled", None)),
    ("running" + " " * 100, ("garbled", None)), ("\x1b]0;pwned\x07running", ("garbled", None)),
])
def test_parse_status(text, parsed):
    assert parse_status("".join(STATUS_MARK + line for line in text.splitlines(True)) or text) == parsed


def test_an_unreadable_status_reply_is_a_lost_node_with_the_reply_escaped(tmp_path):
    p = make_plan(tmp_path, {"a": "ok"})

    class Replies:
        def run(self, command, **kw):
            return CommandResult(0, b"\x1b[31mwhat\xff", b"")
    st = nodeops.status(Replies(), p.nodes[0], 1.0)
    assert st.state is NodeState.LOST and st.exit_code is None
    assert "unreadable status reply" in st.why and "\x1b" not in st.why and "\\x1b" in st.why


def test_the_exit_code_comes_with_the_log_and_is_asked_for_only_when_it_did_not(tmp_path):
    # plan.follow_status_command: the status answer follows the log on the follower's stderr. When it is
    # not there (the channel cut after the log), nodeops.follow asks with a status command of its own;
    # whatever else the follower said on stderr is passed on after the log, not dropped.
    p = make_plan(tmp_path, {"a": "ok"})
    node = p.nodes[0]

    class Node:
        def __init__(self, stderr: bytes) -> None:
            self.stderr, self.runs, self.out = stderr, [], bytearray()

        def stream(self, command, on_data, *, stderr_to=None, **kw):
            assert command == plan.follow_status_command(node) and stderr_to is not None
            on_data(b"the log\n")
            stderr_to += self.stderr
            return 0

        def run(self, command, **kw):
            self.runs.append(command)
            return CommandResult(0, f"{STATUS_MARK}exit 7 1700000000\n".encode(), b"")

    sha = "ab" * 32
    with_status = Node(f"follow: a complaint\n{WHOLE_MARK}8 {sha}\n{STATUS_MARK}exit 3 1700000001\n".encode())
    followed = nodeops.follow(with_status, node, with_status.out.extend)
    status = followed.status
    assert (status.state, status.exit_code, status.ended, with_status.runs) == (NodeState.FAILED, 3, 1700000001, [])
    assert bytes(with_status.out) == b"the log\nfollow: a complaint\n"  # the follower's own lines are not passed on
    assert followed.whole == nodeops.Whole(8, sha)
    cut = Node(b"")
    followed = nodeops.follow(cut, node, cut.out.extend)
    assert (followed.status.exit_code, cut.runs, followed.whole) == (7, [plan.status_command(node)], None)
    assert bytes(cut.out) == b"the log\n"


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300), st.integers(min_value=0, max_value=(1 << 64)),
       st.text("0123456789abcdef", min_size=64, max_size=64) | st.text("0123456789abcdefABCDEF -", max_size=70))
def test_the_followers_whole_line_is_read_exactly_or_not_at_all(noise, size, digest):
    # A node's stderr is untrusted: a whole-log claim is a size and a lowercase sha256, nothing else,
    # never raising; a wrong claim only costs a collect (the local copy is checked against it).
    line = f"{WHOLE_MARK}{size} {digest}"
    got = nodeops.read_whole(f"{noise}\n{line}\n")
    good = size < 10 ** 19 and len(digest) == 64 and all(c in "0123456789abcdef" for c in digest)
    if WHOLE_MARK in noise:
        return  # several marked lines (or one inside the noise): None or the one read, never a crash
    assert got == (nodeops.Whole(size, digest) if good else None)
    assert nodeops.read_whole(noise) is None


class _SlowStart(_Wrapped):
    """Wraps a transport; its first command (the node's start) waits ``delay`` seconds after Ctrl-C
    was pressed (``on_start``), then runs: a start already sent when the launcher is interrupted."""

    def __init__(self, inner, on_start, delay: float) -> None:
        super().__init__(inner)
        self.on_start, self.delay, self.calls = on_start, delay, 0

    def run(self, command, **kw):
        self.calls += 1
        if self.calls == 1:
            self.on_start()
            time.sleep(self.delay)
        return self.inner.run(command, **kw)


def test_ctrl_c_while_a_start_is_in_flight_ends_the_job_it_starts(tmp_path):
    # Ctrl-C after node b's start command left: the teardown must wait for it, or b's job starts after
    # the teardown, unwatched, while the record says stopped (issue 40).
    p = make_plan(tmp_path, {"a": "hang", "b": "hang"})

    def conn(host):
        t = connect(host)
        return _SlowStart(t, lambda: os.kill(os.getpid(), signal.SIGINT), 1.5) if host.name == "b" else t
    notes: list[str] = []
    sup = Supervisor(p, on_output=lambda h, b: None, connect=conn, grace_s=2, on_note=notes.append)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            sup.start()
    finally:
        signal.signal(signal.SIGINT, old)
    [note] = notes  # a's start may still be on its way too
    assert re.fullmatch(r"\[clusterddp\] interrupted: waiting \(up to 60 s\) for the starts already sent to (a, )?b, "
                        r"to end the jobs they start; Ctrl-C again stops waiting", note), note
    try:
        assert eventually(lambda: job_pids(p) == [], timeout=1.0), "a job started after the Ctrl-C runs on"
        time.sleep(2.0)  # b's start would have come back by now
        assert job_pids(p) == [], "a job started after the Ctrl-C runs on"
        assert [n.state for n in sup.nodes] == [NodeState.STOPPED, NodeState.STOPPED]
    finally:
        sup.close()
        subprocess.run(["bash", "-c", "; ".join(plan.teardown_command(n, 1) for n in p.nodes)])


def test_ctrl_c_with_a_start_that_does_not_come_back_names_it_and_ends_the_rest(tmp_path):
    p = make_plan(tmp_path, {"a": "hang", "b": "hang"})

    def conn(host):
        t = connect(host)
        return _SlowStart(t, lambda: os.kill(os.getpid(), signal.SIGINT), 5.0) if host.name == "b" else t
    sup = Supervisor(p, on_output=lambda h, b: None, connect=conn, grace_s=2)
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    drain = sup._interrupt_start
    sup._interrupt_start = lambda: drain(drain_s=0.5)  # type: ignore[method-assign]
    try:
        with pytest.raises(KeyboardInterrupt):
            sup.start()
    finally:
        signal.signal(signal.SIGINT, old)
        sup.close()
    a, b = sup.nodes
    assert a.state == NodeState.STOPPED
    assert b.state == NodeState.LOST and "still on its way" in b.error and "clusterddp stop" in b.error
    subprocess.run(["bash", "-c", "; ".join(plan.teardown_command(n, 1) for n in p.nodes)])
