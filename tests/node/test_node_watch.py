"""The watcher (node program ``watch``) on a real node.log that a real process floods: it keeps up or
says it is behind, judges progress by when a line was written, never ends a healthy job for its own
lag, and still ends a job that stops printing once the flood is over. Its line scanner's cost per line
is bounded whatever the user's regex (a leading ``.*``, a very long line), and a regex that can take
exponential time is refused where the run is planned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterddp import inventory, noise
from clusterddp.errors import InventoryError, UsageError
from clusterddp.failure import AGENT_LINE
from clusterddp.node import watch as node_watch
from helpers import eventually

WATCH = Path(node_watch.__file__)

# 16 MiB of debug lines between two progress lines, a step a second: 8 times what the watcher read
# per second before (1 MiB a look); then silence, which is a real stall.
FLOOD = r'''
import os, sys, time
log, done, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
junk = b"".join(b"NCCL INFO rank 3 debug dump %09d: channel 02/32 ring 0 -> 1 via P2P/IPC\n" % i
                for i in range(16 * 1048576 // 80))
with open(log, "ab", buffering=0) as f:
    for i in range(rounds):
        t = time.monotonic()
        f.write(junk)
        f.write(b"step %d\n" % i)
        if i < rounds - 1:
            time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))
    with open(done, "w") as d:
        d.write("%f" % time.time())  # just after the last step was written
    time.sleep(120)  # the stall: nothing printed; the watcher ends this process
'''


def lines(regex=None) -> node_watch.Lines:
    return node_watch.Lines(regex, [p for p, tail in noise.LINES if not tail] + ["^" + AGENT_LINE.pattern],
                   [p for p, tail in noise.LINES if tail])


def _watch(tmp_path: Path, timeout: float, regex: str | None):
    ctl = tmp_path / "ctl"
    (ctl / "watch").mkdir(parents=True)
    log = ctl / "node.log"
    log.write_bytes(b"")
    env = {**os.environ, "CLUSTERDDP_JOB": f"test-flood-{os.getpid()}", "CLUSTERDDP_HOST": "n1"}
    args = {"timeout": timeout, "regex": regex, "skip": [p for p, t in noise.LINES if not t],
            "tails": [p for p, t in noise.LINES if t], "nnodes": 1, "store": None}
    out = open(log, "ab")  # noqa: SIM115 - the watcher's stdout is node.log, as launch.sh starts it
    watcher = subprocess.Popen([sys.executable, "-S", str(WATCH), str(ctl), json.dumps(args)], env=env,
                               stdout=out, stderr=open(ctl / "watch.log", "wb"))  # noqa: SIM115
    out.close()
    assert eventually(lambda: (ctl / "watch.json").exists(), timeout=60), "the watcher never started"
    return ctl, log, env, watcher


def test_a_flood_of_output_between_progress_lines_is_no_hang_and_silence_after_it_is(tmp_path):
    ctl, log, env, watcher = _watch(tmp_path, timeout=3.0, regex=r"step (\d+)")
    done = tmp_path / "flood.done"
    job = subprocess.Popen([sys.executable, "-c", FLOOD, str(log), str(done), "5"], env=env)
    try:
        # the job is ended by the watcher only after its flood is over and it has stopped printing
        assert job.wait(timeout=240) != 0
        hang = json.loads((ctl / "hang.json").read_text())
        assert done.exists(), f"a job still printing progress was ended as a hang: {hang}"
        last_step = float(done.read_text())
        assert hang["time"] - last_step >= 3.0 - 0.1, hang  # the timeout counted from the last step
        assert last_step - 0.1 <= hang["last_progress"] <= last_step + 1.5, hang  # ... as it was written
        assert eventually(lambda: (ctl / "watch.done").exists(), timeout=60)
    finally:
        for p in (job, watcher):
            if p.poll() is None:
                p.kill()
                p.wait()


def test_a_watcher_behind_its_log_says_so_and_never_declares_a_stall(tmp_path):
    log = tmp_path / "node.log"
    log.write_bytes(b"step 1\n")
    clock = iter(range(10**6)).__next__  # every reading of the clock a second later: the budget ends at once
    with open(log, "rb") as f:
        r = node_watch.Reader(f, lines(r"step (\d+)"), budget=0.5)
        assert r.look(now=10.0, clock=clock) == (1, 10.0) and r.behind == 0
        with open(log, "ab") as w:
            w.write(b"debug\n" * (3 * node_watch.READ_MOST // 6) + b"step 2\n")
        assert r.look(now=20.0, clock=clock) == (0, None)  # one chunk read, then out of time
        assert r.behind > 0
        d = node_watch.Decider(5.0, now=0.0)
        d.local(1, 10.0)
        d.behind = True
        assert not d.stalled(1000.0)  # its own lag is no sign of a hang
        for now in (30.0, 40.0, 50.0):
            n, at = r.look(now=now, clock=clock)
            if n:
                break
        assert (n, at) == (1, 20.0)  # counted at the time the look first found the log holding it
        assert r.behind == 0
        d.behind = False
        d.local(n, at)
        assert d.stalled(1000.0) and not d.stalled(24.9)
    d = node_watch.Decider(5.0, now=0.0, nnodes=2)
    d.shared(3, watchers=2, now=1.0)
    d.others_behind = 1  # another node's watcher is behind: its lines may be progress
    assert not d.stalled(1000.0)
    d.others_behind = 0
    assert d.stalled(1000.0)


def test_a_look_reads_all_there_is_not_one_chunk(tmp_path):
    log = tmp_path / "node.log"
    log.write_bytes(b"debug line of a flood, nothing of progress\n" * (8 * node_watch.READ_MOST // 43) + b"step 7\n")
    with open(log, "rb") as f:
        r = node_watch.Reader(f, lines(r"step (\d+)"), budget=120.0)
        assert r.look(now=5.0) == (1, 5.0) and r.behind == 0


def test_the_regex_cost_per_line_is_bounded(tmp_path):
    long = b"x" * 65536 + b"\n"
    ls = lines(r".*step (\d+)")
    t = time.process_time()
    assert ls.feed(long * 4) == 0 and ls.feed(b"y" * 70000 + b" step 3\n") == 0  # past MATCH_MOST: not seen
    assert time.process_time() - t < 0.5  # 9.4 s of CPU a line before, on a slow node
    assert ls.feed(b"x" * 1000 + b" step 3\n") == 1
    ls = lines(r"\d+x")
    t = time.process_time()
    assert ls.feed(b"1" * 65536 + b"\n") == 0
    assert time.process_time() - t < 2.0  # the square of 4 KiB, not of 64 KiB


@pytest.mark.parametrize("regex,same", [(r".*step (\d+)", r"step (\d+)"), (r".*?.*x", "x"), (r".*+x", r".*+x"),
                                        (r"a.*b", r"a.*b"), (r".*a|b", r"a|b")])
def test_a_leading_any_is_dropped_only_where_the_search_is_the_same(regex, same):
    assert node_watch.bounded_regex(regex) == same


INV = "hosts:\n  - name: a\n    address: 10.0.0.1\n"


def test_a_regex_that_can_take_exponential_time_is_refused_where_it_is_given():
    from clusterddp.top import check_progress_regex
    for bad in (r"(a+)+$", r"(?:x|\d*)*y", r"(?:(?:step )+)+(\d+)"):
        with pytest.raises(UsageError, match="exponential"):
            check_progress_regex(bad)
        with pytest.raises(InventoryError, match="exponential") as e:
            inventory.parse(INV + f"progress_regex: '{bad}'\n", "inv.yaml")
        assert "progress_regex" in str(e.value)
    deep = "(?:" * 900 + "a" + ")" * 900  # past the parser's own depth: refused, not an internal error
    with pytest.raises(UsageError, match="not a regular expression"):
        check_progress_regex(deep)
    with pytest.raises(InventoryError, match="not a regular expression"):
        inventory.parse(INV + f"progress_regex: '{deep}'\n", "inv.yaml")
    for good in (r"step (\d+)", r"(?:\d{1,3},)*\d+ samples", r"(?i)step(?:\s*[:=#])?\s*(\d+)", r"(x{2,5})*y"):
        assert check_progress_regex(good) == good


def test_no_node_declares_a_stall_while_another_nodes_watcher_is_behind(tmp_path):
    # Two nodes: this node's watcher (a real one) and the other node played by the test through the run's
    # real store: its watcher there, then behind its log (its lines not read yet may be progress).
    from datetime import timedelta

    from torch.distributed import TCPStore
    port = _free_port()
    store = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    store.add("clusterddp/watchers", 1)
    store.add("clusterddp/behind", 1)
    ctl = tmp_path / "ctl"
    (ctl / "watch").mkdir(parents=True)
    log = ctl / "node.log"
    log.write_bytes(b"")
    env = {**os.environ, "CLUSTERDDP_JOB": f"test-behind-{os.getpid()}", "CLUSTERDDP_HOST": "n1"}
    args = {"timeout": 3.0, "regex": None, "skip": [], "tails": [], "nnodes": 2, "store": ["127.0.0.1", port]}
    with open(log, "ab") as out:
        watcher = subprocess.Popen([sys.executable, str(WATCH), str(ctl), json.dumps(args)], env=env, stdout=out,
                                   stderr=open(ctl / "watch.log", "wb"))  # noqa: SIM115
    try:
        def state() -> str:
            try:
                return json.loads((ctl / "watch.json").read_text())["state"]
            except (OSError, ValueError, KeyError):
                return ""
        assert eventually(lambda: state() != "", timeout=120), (ctl / "watch.log").read_text()
        with open(log, "ab") as f:
            f.write(b"step 1\n")
        assert eventually(lambda: state() == "watching", timeout=60), state()
        time.sleep(3.0 * 2 + 1)  # twice the stall timeout, silent everywhere: no stall while the other is behind
        assert not (ctl / "hang.json").exists(), "a stall declared while another node's watcher was behind"
        store.add("clusterddp/behind", -1)  # it caught up, and what it read was no progress
        assert eventually(lambda: (ctl / "hang.json").exists(), timeout=60), "a real stall was never declared"
        store.add("clusterddp/dumped", 1)  # the other node's stacks: this one ends its job
        assert eventually(lambda: (ctl / "watch.done").exists(), timeout=60)
    finally:
        if watcher.poll() is None:
            watcher.kill()
        watcher.wait()


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_watcher_behind_says_so_in_the_log_and_tells_how_far(tmp_path, monkeypatch, capsys):
    import threading
    monkeypatch.setattr(node_watch, "READ_BUDGET", 0.0)  # one chunk a look: behind as soon as more than that comes
    ctl = tmp_path / "ctl"
    ctl.mkdir()
    log = ctl / "node.log"
    log.write_bytes(b"")
    args = {"timeout": 3600.0, "regex": r"step (\d+)", "skip": [], "tails": [], "nnodes": 1, "store": None,
            "ctl": str(ctl), "log": str(log), "marker": "none", "host": "n1"}
    t = threading.Thread(target=node_watch.run, args=(args, os.getppid()), daemon=True)
    t.start()
    try:
        assert eventually(lambda: (ctl / "watch.json").exists(), timeout=60)
        with open(log, "ab") as f:
            f.write(b"debug\n" * (4 * node_watch.READ_MOST // 6) + b"step 1\n")
        assert eventually(lambda: "behind node.log" in capsys.readouterr().out, timeout=60)
        assert eventually(lambda: json.loads((ctl / "watch.json").read_text())["behind"] == 0, timeout=60)
    finally:
        (ctl / "exit_code").write_text("0")
        t.join(30)
    assert not t.is_alive()
