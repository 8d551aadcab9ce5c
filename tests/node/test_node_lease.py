"""The node program ``lease`` run as nodes run it (``python -S -c``), on a local lease folder: real
flocks, real processes. The queue's rule, crashed holders, garbage in the folder, and the reply parser."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from clusterddp import leases, node
from clusterddp.node import lease as node_lease
from helpers import eventually

SRC = node.source("lease")


def run(mode: str, req: dict) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-S", "-c", SRC, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    assert p.stdin is not None
    p.stdin.write(json.dumps(req))
    p.stdin.close()
    return p


def reply(p: subprocess.Popen) -> dict:
    assert p.stdout is not None
    return node_lease.parse_reply(p.stdout.readline())


@pytest.fixture
def base(tmp_path):
    # no nvidia-smi here: a node of 2 slots (the inventory's gpus)
    return {"dir": str(tmp_path / "leases"), "user": "me@laptop", "host": "n1", "since": "2026-11-30 10:00:00+0000",
            "fallback": 2, "port": None, "slots": None, "go": str(tmp_path / "go"), "start": "true"}


def listing(base: dict) -> leases.NodeView:
    r = subprocess.run([sys.executable, "-S", "-c", SRC, "list"], input=json.dumps(base), capture_output=True,
                       text=True, check=True)
    return leases._view("n1", node_lease.parse_reply(r.stdout))


def release(p: subprocess.Popen) -> None:
    """The launcher goes away: its channel (the holder's stdout) closes, and the holder ends."""
    assert p.stdout is not None
    p.stdout.close()
    assert p.wait(timeout=10) == 0


def ticket(n: int) -> str:
    return f"{n:019d}-w{n}"


def test_a_later_small_run_never_takes_the_slots_an_earlier_waiter_needs(base):
    small = run("hold", {**base, "run": "small", "need": 1})
    assert reply(small)["slots"] == [0]
    waiter = run("queue", {**base, "run": "big", "need": 2, "ticket": ticket(5)})
    assert reply(waiter)["queued"]
    # slot 1 is free, but the big run waits for both: a newcomer (no ticket, or a later one) may not take it
    for later in (None, ticket(6)):
        r = reply(run("hold", {**base, "run": "late", "need": 1, "ticket": later}))
        assert r["ok"] is False and [w["run"] for w in r["waiting"]] == ["big"], r
        assert [(h["run"], h["slots"], h["user"]) for h in r["holders"]] == [("small", [0], "me@laptop")]
    # a waiter that came before the big one may
    early = run("hold", {**base, "run": "early", "need": 1, "ticket": ticket(4)})
    assert reply(early)["slots"] == [1]
    assert reply(run("hold", {**base, "run": "big", "need": 2, "ticket": ticket(5)}))["ok"] is False
    release(small)
    release(early)
    big = run("hold", {**base, "run": "big", "need": 2, "ticket": ticket(5)})
    assert reply(big)["slots"] == [0, 1]
    release(big)
    waiter.kill()


def test_killed_holders_and_waiters_hold_nothing_and_leave_no_record(base):
    held = run("hold", {**base, "run": "r1", "need": 2})
    assert reply(held)["ok"]
    waiter = run("queue", {**base, "run": "r2", "need": 2, "ticket": ticket(1)})
    assert reply(waiter)["queued"]
    v = listing(base)
    assert [h.run for h in v.holders] == ["r1"] and [w.run for w in v.waiting] == ["r2"] and v.free == set()
    for p in (held, waiter):
        p.send_signal(signal.SIGKILL)
        p.wait()
    v = listing(base)
    assert (v.holders, v.waiting, v.free) == ((), (), {0, 1})
    assert not list(Path(base["dir"]).glob("*.json")), "stale records are removed by the next reader"


def test_go_hands_the_locks_to_the_job_and_a_removed_record_releases_before_it(base, tmp_path):
    job = tmp_path / "job.pid"
    p = run("hold", {**base, "run": "r1", "need": 1,
                     "start": f"setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {job}"})
    assert reply(p)["slots"] == [0]
    Path(base["go"]).touch()
    assert p.wait(timeout=10) == 0
    pid = int(job.read_text())
    try:
        (h,) = listing(base).holders  # the holder is gone; the job holds the lease now
        assert (h.run, h.state, h.slots) == ("r1", "running", (0,))
    finally:
        os.kill(pid, signal.SIGKILL)
    other = run("hold", {**base, "run": "r2", "need": 2, "go": str(tmp_path / "go2")})
    assert reply(other)["ok"]
    Path(base["dir"], "lease-r2.json").unlink()  # lease_release_command: the holder ends, the job never starts
    assert other.wait(timeout=10) == 0
    assert listing(base).free == {0, 1}


def test_two_masters_choosing_at_once_never_get_the_same_port(base, tmp_path):
    """The port's lock is what keeps them apart: neither has bound it yet (torchrun binds it later)."""
    first = 20000 + os.getpid() % 20000
    a = run("hold", {**base, "run": "a", "need": 1, "port": {"from": first, "span": 50}})
    b = run("hold", {**base, "run": "b", "need": 1, "port": {"from": first, "span": 50}, "go": base["go"] + "b"})
    pa, pb = reply(a)["port"], reply(b)["port"]
    assert pa and pb and pa != pb
    (h,) = [h for h in listing(base).holders if h.run == "a"]
    assert h.port == pa
    release(a)
    release(b)


def test_a_fixed_choice_and_runs_that_can_never_fit(base):
    r = reply(run("hold", {**base, "run": "r1", "slots": [2]}))
    assert r["never"] and "slot 2 asked for, but the node has 2" in r["why"]
    r = reply(run("hold", {**base, "run": "r1", "need": 3}))
    assert r["never"] and "needs 3 slots, but the node has 2" in r["why"]
    p = run("hold", {**base, "run": "r1", "slots": [1]})
    assert reply(p)["slots"] == [1]
    assert reply(run("hold", {**base, "run": "r2", "slots": [1]}))["ok"] is False
    q = run("hold", {**base, "run": "r3", "need": 1, "go": base["go"] + "3"})
    assert reply(q)["slots"] == [0]
    release(p)
    release(q)


def test_garbage_in_the_lease_folder_is_counted_not_trusted(base):
    folder = Path(base["dir"])
    folder.mkdir()
    (folder / "lease-junk.json").write_text("{not json")  # nobody holds it: stale, removed
    held = folder / "lease-held.json"
    held.write_text(json.dumps({"run": "x\x1b[2J", "slots": [0]}))
    locker = subprocess.Popen(["flock", "-x", str(held), "sleep", "60"])
    try:
        assert eventually(lambda: listing(base).garbled, 10)  # once flock(1) holds it
        v = listing(base)
        assert v.garbled == 1 and v.holders == ()
        assert not (folder / "lease-junk.json").exists()
    finally:
        locker.kill()
        locker.wait()


@pytest.mark.parametrize("text, why", [
    ("", "not JSON"), ("[1]", "not a JSON object"), ('{"ok": 1, "capacity": 2}', "ok: not true or false"),
    ('{"ok": true, "capacity": 0}', "capacity"), ('{"ok": true, "capacity": 2, "slots": [-1]}', "slots"),
    ('{"ok": true, "capacity": 2, "slots": [0], "port": 70000}', "port"),
    ('{"capacity": 2, "holders": {}}', "holders: not a list"), ('{"error": "OSError: disk full"}', "disk full"),
    ("x" * (node_lease.MAX_REPLY + 1), "over"),
])
def test_the_reply_parser_refuses_what_no_node_program_says(text, why):
    with pytest.raises(ValueError, match=why):
        node_lease.parse_reply(node_lease.MARK + text if len(text) <= node_lease.MAX_REPLY else text)


def test_the_reply_is_the_marked_line_whatever_a_login_shell_printed_first():
    """A node whose ~/.bashrc prints a banner: its lines came first and every hold failed."""
    assert node_lease.parse_reply("Welcome to gpu-01\n\n" + node_lease.MARK + '{"capacity": 2}\r\n')["capacity"] == 2
    with pytest.raises(ValueError, match="no reply line: 'Welcome"):
        node_lease.parse_reply('Welcome\n{"capacity": 2}\n')


def test_the_reply_parser_cleans_each_entry():
    r = node_lease.parse_reply(node_lease.MARK + json.dumps({"capacity": 4, "holders": [
        {"run": "r1", "user": "eve\x1b]0;pwn\x07", "since": 5, "slots": [1, 0], "port": "x", "state": "odd"},
        {"run": "../etc", "slots": [0]}, "nope", {"run": "r2", "slots": [99999]}],
        "waiting": [{"ticket": "1", "run": "w"}, {"ticket": ticket(3), "run": "w3", "need": True,
                                                 "name": "bert\x1b[2J"}]}))
    assert r["holders"][0] == {"garbled": False, "run": "r1", "name": None, "user": "?", "since": "?", "host": "?",
                               "slots": [0, 1], "port": None, "state": "?"}
    assert [h["garbled"] for h in r["holders"]] == [False, True, True, True]
    assert [w["garbled"] for w in r["waiting"]] == [True, False] and r["waiting"][1]["need"] is None
    assert r["waiting"][1]["name"] == "?"  # a run's --name is node text too: printable or not shown


def test_a_fifo_or_a_folder_named_as_a_record_never_hangs_list_or_hold(base):
    """A FIFO named lease-x.json hung `list`, and `hold` with the mutex held; a folder of that name
    made every list and hold fail. Neither is read; each is counted."""
    folder = Path(base["dir"])
    folder.mkdir()
    os.mkfifo(folder / "lease-fifo.json")
    (folder / "lease-dir.json").mkdir()
    os.mkfifo(folder / "queue-0000000000000000001-w.json")
    r = subprocess.run([sys.executable, "-S", "-c", SRC, "list"], input=json.dumps(base), capture_output=True,
                       text=True, timeout=30)
    v = leases._view("n1", node_lease.parse_reply(r.stdout))
    assert v.garbled == 3 and v.holders == () and v.free == {0, 1}, r.stdout
    p = run("hold", {**base, "run": "r1", "need": 2})
    try:
        assert reply(p)["ok"] is True  # within the test's timeout: nothing blocked under the mutex
    finally:
        release(p)


def test_lock_files_get_fixed_modes_whatever_the_umask(base):
    old = os.umask(0o077)
    try:
        p = run("hold", {**base, "run": "r1", "need": 1, "port": {"from": 29731, "span": 5}})
        assert reply(p)["ok"] is True
    finally:
        os.umask(old)
    try:
        folder = Path(base["dir"])
        modes = {f.name: f.stat().st_mode & 0o777 for f in folder.iterdir() if f.name.endswith(".lock") or
                 f.name == ".mutex"}
        assert modes and set(modes.values()) == {0o644}, modes
        assert not [f for f in folder.iterdir() if f.name.endswith(".new")]  # nothing left aside
    finally:
        release(p)


def test_lock_files_planted_as_fifos_make_a_slot_unavailable_never_a_hang(base):
    folder = Path(base["dir"])
    folder.mkdir()
    os.mkfifo(folder / "slot-0.lock")
    p = run("hold", {**base, "run": "r1", "need": 1})
    try:
        assert reply(p)["slots"] == [1]
    finally:
        release(p)
    os.mkfifo(folder / ".mutex.x")
    (folder / ".mutex").unlink()
    os.mkfifo(folder / ".mutex")
    r = subprocess.run([sys.executable, "-S", "-c", SRC, "hold"], input=json.dumps({**base, "run": "r2", "need": 1}),
                       capture_output=True, text=True, timeout=30)
    with pytest.raises(ValueError, match="not a regular file"):
        node_lease.parse_reply(r.stdout)


def test_a_deeply_nested_reply_is_refused_not_a_recursion_error():
    with pytest.raises(ValueError, match="nested too deep"):
        node_lease.parse_reply(node_lease.MARK + "[" * 50_000 + "]" * 50_000)


def test_the_hold_channel_keeps_only_the_reply_lines_whatever_the_node_sends():
    """40 MB of short lines were all queued (759 MiB in the launcher), the buffer split once per line."""
    class Node:
        def stream(self, command, on_data, stdin=None, stderr_to=None):
            on_data(b"Welcome to n1\n" + node_lease.MARK.encode() + b'{"ok": false, "capacity": 2, "why": "busy"}\n')
            line = (node_lease.MARK + "x\n").encode() * 200_000
            for _ in range(40):
                on_data(line)
            on_data(b"y" * 1000)
            return 0
    ch = leases._Channel("n1", Node(), "hold", b"{}")
    ch.thread.join(60)
    assert not ch.thread.is_alive()
    assert ch._lines.qsize() <= leases._Channel.MAX_LINES + 1  # + the end-of-stream mark
    assert ch.reply()["why"] == "busy"


def test_the_hold_channel_refuses_a_line_over_the_reply_limit_once():
    class Node:
        def stream(self, command, on_data, stdin=None, stderr_to=None):
            for _ in range(node_lease.MAX_REPLY // 65536 + 2):
                on_data(b"z" * 65536)
            on_data(b"\n{}\n")
            return 0
    ch = leases._Channel("n1", Node(), "hold", b"{}")
    ch.thread.join(60)
    from clusterddp.errors import HostError
    with pytest.raises(HostError, match="over"):
        ch.reply()
    assert ch._partial == [] and ch._lines.qsize() == 1  # then only the end


def test_the_hold_channel_stops_believing_a_node_that_prints_endless_lines_that_are_no_reply():
    class Node:
        def stream(self, command, on_data, stdin=None, stderr_to=None):
            for _ in range(40):
                on_data(b"x\n" * 500_000)
            return 0
    ch = leases._Channel("n1", Node(), "hold", b"{}")
    ch.thread.join(60)
    from clusterddp.errors import HostError
    with pytest.raises(HostError, match="no reply"):
        ch.reply()


def test_a_holder_and_a_waiter_are_listed_with_their_runs_name(base):
    """Lease and queue messages name the run's --name beside user@machine: the node keeps it."""
    held = run("hold", {**base, "run": "r1", "name": "bert-base", "need": 1})
    assert reply(held)["slots"] == [0]
    waiter = run("queue", {**base, "run": "r2", "name": "sweep 3", "need": 2, "ticket": ticket(5)})
    assert reply(waiter)["queued"]
    v = listing(base)
    assert [(h.run, h.name, h.who) for h in v.holders] == [("r1", "bert-base", "run r1 (bert-base) of me@laptop")]
    assert [(w.run, w.who) for w in v.waiting] == [("r2", "run r2 (sweep 3) of me@laptop")]
    release(held)
    waiter.kill()
    waiter.wait(timeout=10)


def test_capacity_is_what_nvidia_smi_lists_and_the_fallback_without_one_on_path(base, tmp_path):
    # Looked up on PATH first (a node without nvidia-smi starts no process for it); a GPU node's count is
    # its "GPU n:" lines (MIG lines and the like are not GPUs); one that fails counts as none.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def capacity() -> int:
        r = subprocess.run([sys.executable, "-S", "-c", SRC, "list"], input=json.dumps(base), capture_output=True,
                           text=True, check=True, env=env)
        return node_lease.parse_reply(r.stdout)["capacity"]

    assert capacity() == 2  # none on PATH: the inventory's gpus
    smi.write_text("#!/bin/sh\nfor i in 0 1 2; do echo \"GPU $i: NVIDIA H200 (UUID: GPU-$i)\"; done\n"
                   "echo '  MIG 1g.18gb Device 0: (UUID: MIG-x)'\n")
    smi.chmod(0o755)
    assert capacity() == 3
    smi.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2; exit 9\n")
    assert capacity() == 2


def test_taking_a_lease_imports_neither_subprocess_nor_socket_before_its_reply(base, tmp_path):
    # Every run's start waits for the grant: the holder answers first and imports what the job's start
    # needs while the launcher stages the run (a third of its imports, ~10 ms on a node). The master's
    # port is tried by binding it, so there socket comes first.
    probe = (
        "import sys, json\n"
        "ns = {'__name__': 'lease'}\n"
        f"exec(compile({SRC!r}, 'lease', 'exec'), ns)\n"
        "seen, real = [], ns['_emit']\n"
        "def emit(obj):\n"
        "    seen.append([sorted(obj), sorted(m for m in ('subprocess', 'socket') if m in sys.modules)])\n"
        "    real(obj)\n"
        "ns['_emit'] = emit\n"
        "ns['_hold'](json.loads(sys.argv[1]))\n"
        "print('SEEN ' + json.dumps(seen))\n")
    (tmp_path / "go").touch()  # told to start at once: the start's reply is seen too
    for run_id, port, first in (("r1", None, []), ("r2", {"from": 29700, "span": 50}, ["socket"])):
        r = subprocess.run([sys.executable, "-S", "-c", probe, json.dumps({**base, "run": run_id, "port": port})],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        seen = json.loads(r.stdout.splitlines()[-1].removeprefix("SEEN "))
        assert seen == [[["capacity", "ok", "port", "slots"], first], [["started"], sorted(first + ["subprocess"])]]
