"""Collect on this machine: the real node-side program (plan.collect_command) run by the local transport.

The SSH path is covered on the test bed (test_control_ssh.py); these check the protocol and the
verification rules quickly, including output cut into arbitrary pieces.
"""

from __future__ import annotations

import hashlib
import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest

from clusterddp import inventory, nodeops
from clusterddp import plan as ssh_plan
from clusterddp.artifacts import CollectResult, collect_node, collect_nodes, matched_nowhere
from clusterddp.fleet import Fleet
from clusterddp.runspec import RunSpec
from clusterddp.store import RunStore
from clusterddp.transport.local import LocalTransport
from helpers import cddp, make_record, resolved

RUN_ID = "20261129-120000-abcd"


@pytest.fixture
def node_dir(tmp_path) -> Path:
    d = tmp_path / "node"
    (d / ".clusterddp").mkdir(parents=True)
    (d / ".clusterddp" / "node.log").write_bytes(b"rank 0 says hi\n")
    (d / "ckpt" / "deep").mkdir(parents=True)
    (d / "ckpt" / "a.bin").write_bytes(os.urandom(3 << 20))
    (d / "ckpt" / "deep" / "b.txt").write_text("{\"json\": \"lookalike\"}\n" * 50)
    (d / "ckpt" / "empty").write_bytes(b"")
    (d / "ckpt" / "link").symlink_to(d / "ckpt" / "a.bin")
    return d


@pytest.fixture
def setup(tmp_path, node_dir):
    inv = inventory.local(gpus=1, python=sys.executable)
    node = ssh_plan.build_plan(inv, resolved(RunSpec("t.py"), inv), RUN_ID, local_run_dir=str(node_dir),
                        local_control_dir=str(node_dir / ".clusterddp")).nodes[0]
    store = RunStore(tmp_path / "runs")
    store.create(make_record(RUN_ID, ()))
    return node, store


class Rechunking(LocalTransport):
    """The local transport, with its output handed on in random small pieces (as a network might)."""

    def stream(self, command, on_data, **kw):
        rnd = random.Random(7)

        def split(b: bytes) -> None:
            i = 0
            while i < len(b):
                n = rnd.choice((1, 2, 3, 17, 4096, 65537))
                on_data(b[i:i + n])
                i += n
        return super().stream(command, split, **kw)


def artifacts(store: RunStore) -> Path:
    return store.artifacts_dir(RUN_ID, "local")


@pytest.mark.parametrize("transport", [LocalTransport, Rechunking])
def test_collect_fetches_verifies_and_skips_whole_files(setup, node_dir, transport):
    node, store = setup
    t = transport("local")
    r = collect_node(t, node, store, RUN_ID, ("ckpt/**",))
    assert r.error is None
    assert sorted(r.fetched) == ["ckpt/a.bin", "ckpt/deep/b.txt", "ckpt/empty"]  # no link, no control folder
    for rel in r.fetched:
        assert (artifacts(store) / rel).read_bytes() == (node_dir / rel).read_bytes()
    assert r.bytes == (3 << 20) + len((node_dir / "ckpt/deep/b.txt").read_bytes())
    assert store.log_path(RUN_ID, "local").read_bytes() == b"rank 0 says hi\n"

    again = collect_node(t, node, store, RUN_ID, ("ckpt/**",))
    assert again.fetched == () and sorted(again.whole) == sorted(r.fetched) and again.error is None
    assert not list(artifacts(store).rglob("*.part"))


def test_many_small_files_resolve_the_hosts_folder_once_not_per_file(setup, node_dir, monkeypatch):
    # bench/collect_speed.py, 1,000 files of 64 KiB: resolving the artifacts folder twice a file was a
    # third of the receiver's CPU besides its writes
    node, store = setup
    (node_dir / "shards").mkdir()
    for i in range(50):
        (node_dir / "shards" / f"s{i:03d}").write_bytes(os.urandom(100))
    calls = []
    real = RunStore.artifacts_dir
    monkeypatch.setattr(RunStore, "artifacts_dir", lambda self, *a: calls.append(a) or real(self, *a))
    r = collect_node(LocalTransport("local"), node, store, RUN_ID, ("shards/**",))
    assert r.error is None and len(r.fetched) == 50
    assert len(calls) <= 3, f"the artifacts folder resolved {len(calls)} times for 50 files"


def test_damaged_copies_are_fetched_again(setup, node_dir):
    node, store = setup
    t = LocalTransport("local")
    collect_node(t, node, store, RUN_ID, ("ckpt/**",))
    a, b = artifacts(store) / "ckpt/a.bin", artifacts(store) / "ckpt/deep/b.txt"
    with open(a, "r+b") as f:
        f.truncate(1000)
    with open(b, "r+b") as f:  # same size, one byte changed: only the hash tells
        f.write(b"X")
    r = collect_node(t, node, store, RUN_ID, ("ckpt/**",))
    assert sorted(r.fetched) == ["ckpt/a.bin", "ckpt/deep/b.txt"] and r.whole == ("ckpt/empty",)
    assert a.read_bytes() == (node_dir / "ckpt/a.bin").read_bytes()
    assert b.read_bytes() == (node_dir / "ckpt/deep/b.txt").read_bytes()


def test_a_file_being_written_is_skipped_not_taken_half_written(setup, node_dir):
    node, store = setup
    live = node_dir / "ckpt" / "live.bin"
    live.write_bytes(os.urandom(16 << 20))
    stop = threading.Event()

    def writer() -> None:
        with open(live, "ab") as f:
            while not stop.is_set():
                f.write(b"x" * 4096)
                f.flush()
                time.sleep(0.0005)
    th = threading.Thread(target=writer)
    th.start()
    try:
        r = collect_node(LocalTransport("local"), node, store, RUN_ID, ("ckpt/live.bin",))
    finally:
        stop.set()
        th.join()
    assert r.skipped == ("ckpt/live.bin",) and r.fetched == () and r.error is None
    assert not (artifacts(store) / "ckpt/live.bin").exists()
    assert not list(artifacts(store).rglob("*.part"))


def test_a_missing_run_folder_is_an_error_naming_the_host(setup, node_dir, tmp_path):
    node, store = setup
    gone = ssh_plan.NodeLaunch(**{**node.__dict__, "run_dir": str(tmp_path / "nope")})
    r = collect_node(LocalTransport("local"), gone, store, RUN_ID, ("ckpt/**",))
    assert r.error and r.error.startswith("local: collect failed on the node: FileNotFoundError")
    assert r.fetched == ()


def test_a_file_that_shrinks_while_sent_is_skipped_and_the_files_after_it_still_arrive(setup, node_dir):
    node, store = setup
    big, after = node_dir / "ckpt" / "a.bin", node_dir / "ckpt" / "z.txt"
    big.write_bytes(os.urandom(32 << 20))
    after.write_text("still framed right\n")

    class TruncateOnFirstData(LocalTransport):
        def stream(self, command, on_data, **kw):
            def first(b: bytes) -> None:
                if b"\"send\"" in b and big.stat().st_size:
                    os.truncate(big, 1000)  # the node has read a few MiB of 32 at most
                on_data(b)
            return super().stream(command, first, **kw)
    r = collect_node(TruncateOnFirstData("local"), node, store, RUN_ID, ("ckpt/a.bin", "ckpt/z.txt"))
    assert r.skipped == ("ckpt/a.bin",) and r.fetched == ("ckpt/z.txt",) and r.error is None
    assert (artifacts(store) / "ckpt/z.txt").read_text() == "still framed right\n"
    assert not (artifacts(store) / "ckpt/a.bin").exists()


def test_no_link_anywhere_in_a_path_is_followed(setup, node_dir, tmp_path):
    """`checkpoints/dataset -> /` must not expose the node's disk: links to folders inside or outside
    the run folder are not walked into, named through, or sent, whatever the globs say."""
    node, store = setup
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "id_rsa").write_text("PRIVATE KEY\n")
    (node_dir / "ckpt" / "dataset").symlink_to(secret)           # a folder outside
    (node_dir / "ckpt" / "again").symlink_to(node_dir / "ckpt" / "deep")  # a folder inside
    (node_dir / "outside").symlink_to(tmp_path)                  # at the top of the run folder
    r = collect_node(LocalTransport("local"), node, store, RUN_ID,
                     ("ckpt/**", "ckpt/dataset/*", "ckpt/dataset/id_rsa", "ckpt/again/b.txt", "outside/**",
                      "*/id_rsa", "**/id_rsa", "**/b.txt"))
    assert r.error is None and r.missing == ()
    assert sorted(r.fetched) == ["ckpt/a.bin", "ckpt/deep/b.txt", "ckpt/empty"]
    got = [p.relative_to(artifacts(store)).as_posix() for p in artifacts(store).rglob("*")]
    assert sorted(got) == ["ckpt", "ckpt/a.bin", "ckpt/deep", "ckpt/deep/b.txt", "ckpt/empty"]


def test_the_node_refuses_a_path_through_a_link_or_out_of_the_run_folder(node_dir, tmp_path, monkeypatch):
    """The second request names paths (files whose copy differs): the node checks them too, and
    opens each one folder at a time without following links, so a link swapped in after the
    listing is refused; a FIFO swapped in is refused without blocking."""
    import io
    import json

    from clusterddp.node import collect
    monkeypatch.chdir(tmp_path)
    (tmp_path / "secret").write_text("PRIVATE\n")
    (node_dir / "ckpt" / "dataset").symlink_to(tmp_path)
    out = io.BytesIO()
    collect.main([str(node_dir), str(node_dir / ".clusterddp" / "node.log")],
                 stdin=io.StringIO(json.dumps({"paths": ["ckpt/dataset/secret", "../secret", "/etc/passwd",
                                                          ".clusterddp/node.log", "ckpt/link", "ckpt/empty"],
                                               "have": {}})), stdout=out)
    recs = [json.loads(line) for line in out.getvalue().split(b"\n") if line.startswith(b"{")]
    assert [r for r in recs if "file" in r] == [{"file": "ckpt/empty", "size": 0}]
    assert [r["error"] for r in recs if set(r) == {"error"}] == [
        "path '../secret' refused: goes up with ..", "path '/etc/passwd' refused: absolute",
        "path '.clusterddp/node.log' refused: in the control folder .clusterddp"]
    root = os.open(node_dir, os.O_RDONLY)
    try:
        with pytest.raises(OSError):
            collect._open_beneath(root, "ckpt/dataset/secret")  # a link in the middle
        with pytest.raises(OSError):
            collect._open_beneath(root, "ckpt/link")  # a link at the end
        os.mkfifo(node_dir / "ckpt" / "fifo")
        with pytest.raises(OSError, match="not a regular file"):
            collect._open_beneath(root, "ckpt/fifo")
        with collect._open_beneath(root, "ckpt/deep/b.txt") as f:
            assert f.read(9) == b'{"json": '
    finally:
        os.close(root)


# ---- a node whose collect program answers with hostile bytes (a fake node program, the real rest) ----

def hostile_node(tmp_path: Path, node_dir: Path, answer: bytes, code: int = 0) -> ssh_plan.NodeLaunch:
    """The local node, its `python` a script that prints ``answer`` instead of running collect."""
    (tmp_path / "answer.bin").write_bytes(answer)
    fake = tmp_path / "fake-python"
    fake.write_text(f"#!/bin/sh\ncat {tmp_path / 'answer.bin'}\nexit {code}\n")
    fake.chmod(0o755)
    inv = inventory.local(gpus=1, python=str(fake))
    return ssh_plan.build_plan(inv, resolved(RunSpec("t.py"), inv), RUN_ID, local_run_dir=str(node_dir),
                        local_control_dir=str(node_dir / ".clusterddp")).nodes[0]


def lines(*recs: object) -> bytes:
    import json
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in recs)


def sent(path: str, body: bytes) -> bytes:
    return (lines({"path": path, "send": len(body)}) + body
            + lines({"path": path, "sha256": hashlib.sha256(body).hexdigest(), "stable": True}))


def collected(node, store) -> tuple:
    """collect_node on a thread that must end: a bad size once made it spin for ever."""
    out: list = []
    th = threading.Thread(target=lambda: out.append(collect_node(LocalTransport("local"), node, store, RUN_ID,
                                                                 ("**",))), daemon=True)
    th.start()
    th.join(60)
    assert not th.is_alive(), "collect is still busy with a short, bad answer"
    return out[0]


def test_a_negative_size_is_an_error_naming_the_host_not_a_hang(setup, node_dir, tmp_path):
    _, store = setup
    node = hostile_node(tmp_path, node_dir, lines({"log": 3}) + b"hi\n" + lines({"file": "a.txt", "size": 3},
                        {"file": "b.txt", "size": 3}, {"files": 2}) + sent("a.txt", b"abc")
                        + lines({"path": "b.txt", "send": -3}) + b"x" * 1000)
    r = collected(node, store)
    assert r.error == "local: its collect answer was refused: send: -3 is not a size (0 to 1125899906842624)"
    assert r.fetched == ("a.txt",) and (artifacts(store) / "a.txt").read_bytes() == b"abc"
    assert r.missing == (("b.txt", f"not received: {r.error}"),)
    assert store.log_path(RUN_ID, "local").read_bytes() == b"hi\n"  # the whole log it did send is kept


def test_a_refused_path_is_skipped_and_the_files_after_it_still_arrive(setup, node_dir, tmp_path):
    _, store = setup
    escape = tmp_path / "runs" / "escaped.txt"
    node = hostile_node(tmp_path, node_dir, lines(
        {"file": "../../escaped.txt", "size": 4}, {"file": str(escape), "size": 4}, {"file": "ok.txt", "size": 2},
        {"files": 3}) + sent("../../escaped.txt", b"evil") + sent(str(escape), b"evil") + sent("ok.txt", b"ok"))
    r = collected(node, store)
    assert r.error is None and r.fetched == ("ok.txt",)
    assert r.missing == (("../../escaped.txt", "refused: goes up with .."), (str(escape), "refused: absolute"))
    assert not escape.exists() and (artifacts(store) / "ok.txt").read_bytes() == b"ok"


def test_an_answer_cut_short_with_exit_0_names_the_file_it_lost(setup, node_dir, tmp_path):
    _, store = setup
    node = hostile_node(tmp_path, node_dir, lines({"file": "big.bin", "size": 1 << 20}, {"files": 1},
                                                  {"path": "big.bin", "send": 1 << 20}) + b"abc")
    r = collected(node, store)
    assert r.missing == (("big.bin", "received 3 of 1048576 bytes; the node's answer ended early"),)
    assert r.fetched == () and not list(artifacts(store).rglob("*"))
    node = hostile_node(tmp_path, node_dir, lines({"file": "big.bin", "size": 10}, {"files": 1}), code=3)
    r = collected(node, store)
    assert r.error == "local: collect failed on the node: exit 3"
    assert r.missing == (("big.bin", f"not received: {r.error}"),)


def test_the_collect_command_reports_the_host_and_each_lost_file_escaped_and_ends(setup, node_dir, tmp_path):
    """`clusterddp collect` against a hostile node: it ends (it used to spin at 100% CPU for
    ever), exit 1, no traceback; the host's error and each lost file are named, and the node's
    text reaches the terminal with its control characters escaped."""
    from dataclasses import replace

    _, store = setup
    node = hostile_node(tmp_path, node_dir, lines(
        {"file": "a.txt", "size": 3}, {"file": "b\x1b[2J.txt", "size": 3}, {"file": "c.txt", "size": 3}, {"files": 3})
        + sent("a.txt", b"abc") + lines({"path": "b\x1b[2J.txt", "error": "denied \x1b]0;pwned\x07"},
                                        {"path": "c.txt", "send": -1}))
    rec = make_record(RUN_ID, ("local",))
    n = replace(rec.nodes[0], settings=node.host, run_dir=node.run_dir, control_dir=node.control_dir)
    store.update(RUN_ID, lambda _: replace(rec, nodes=(n,), collect=("**",)))
    r = cddp("collect", RUN_ID, "--runs-dir", str(store.root), timeout=60)
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert "  local: 1 fetched (0.0 MB), 0 already whole, 2 not brought back" in r.stdout
    assert r.stderr.splitlines() == [
        "  local: error: local: its collect answer was refused: send: -1 is not a size (0 to 1125899906842624)",
        "  local: not brought back: b\\x1b[2J.txt: cannot read it on the node: denied \\x1b]0;pwned\\x07",
        "  local: not brought back: c.txt: not received: local: its collect answer was refused: send: -1 is not "
        "a size (0 to 1125899906842624)"]


def test_the_globs_that_matched_nothing_are_known_per_host_and_across_hosts(setup, node_dir):
    node, store = setup
    # ckpt/link is a symlink: never collected, so that glob brings nothing back either
    r = collect_node(LocalTransport("local"), node, store, RUN_ID, ("ckpt/**", "nothing/*.pt", "ckpt/link"))
    assert r.error is None and r.unmatched == ("nothing/*.pt", "ckpt/link")
    other = CollectResult("b", unmatched=("ckpt/link",))
    down = CollectResult("c", error="c: cannot connect")  # its file list never came: nothing known of it
    assert matched_nowhere([r, other]) == (("ckpt/link",), True)
    assert matched_nowhere([r, other, down]) == (("ckpt/link",), False)
    assert matched_nowhere([down]) == ((), False)
    again = collect_node(LocalTransport("local"), node, store, RUN_ID, ("ckpt/**",))  # every file already whole
    assert again.unmatched == ()


def test_collect_glob_brings_back_other_files_after_the_fact_and_says_what_matched_nothing(setup, node_dir):
    from dataclasses import replace

    node, store = setup
    rec = make_record(RUN_ID, ("local",))
    n = replace(rec.nodes[0], settings=node.host, run_dir=node.run_dir, control_dir=node.control_dir)
    store.update(RUN_ID, lambda _: replace(rec, nodes=(n,), collect=("ckpt/a.bin",)))
    r = cddp("collect", RUN_ID[-4:], "--runs-dir", str(store.root), "--glob", "ckpt/deep/*", "--glob", "nothing/*",
             timeout=60)
    assert r.returncode == 0 and "local: 1 fetched" in r.stdout, r.stdout + r.stderr
    assert sorted(p.relative_to(artifacts(store)).as_posix() for p in artifacts(store).rglob("*")
                  if p.is_file()) == ["ckpt/deep/b.txt"]  # --glob instead of the run's own globs
    assert r.stderr.splitlines() == ["warning: collect glob 'nothing/*' matched no file on any node; collect globs "
                                     "are relative to each node's run folder, where the script runs "
                                     "(e.g. 'checkpoints/**')"]
    r = cddp("collect", RUN_ID, "--runs-dir", str(store.root), "--glob", "../up", timeout=60)
    assert r.returncode == 2 and "--glob '../up': must be relative to the run folder" in r.stderr, r.stderr


class Counting(LocalTransport):
    """The local transport, counting the commands sent through it."""

    sent: list = []

    def stream(self, command, on_data, **kw):
        Counting.sent.append(command)
        return super().stream(command, on_data, **kw)


def test_a_log_its_follower_sent_whole_is_not_fetched_again_unless_the_copy_differs(setup, node_dir):
    # The end of a run without globs: the real follower (plan.follow_status_command) streams the log and
    # says it sent it whole; the local copy it wrote is that, so no collect command goes to the node. A
    # local copy damaged since (same size, one byte) is fetched again, and globs always ask the node.
    node, store = setup
    (node_dir / ".clusterddp" / "pid").write_text("0\n")
    (node_dir / ".clusterddp" / "exit_code").write_text("0\n")
    followed = nodeops.follow(LocalTransport("local"), node, lambda b: store.append_log(RUN_ID, "local", b))
    store.close_logs()
    log = store.log_path(RUN_ID, "local")
    assert followed.status.exit_code == 0 and log.read_bytes() == b"rank 0 says hi\n"
    assert followed.whole == nodeops.Whole(15, hashlib.sha256(b"rank 0 says hi\n").hexdigest())
    streamed = {"local": followed.whole}

    def collects() -> list:  # the collect commands (the metrics sampler's files are fetched by one of their own)
        return [c for c in Counting.sent if "CLUSTERDDP_SAMPLES" not in c]
    Counting.sent = []
    with Fleet([node.host], connect=lambda h: Counting(h.name)) as fleet:
        [r] = collect_nodes(fleet, [node], store, RUN_ID, (), streamed=streamed)
        assert r == CollectResult("local", unmatched=()) and collects() == []
        assert matched_nowhere([r]) == ((), True)
        log.write_bytes(b"rank 0 says HI\n")
        [r] = collect_nodes(fleet, [node], store, RUN_ID, (), streamed=streamed)
        assert r.ok and len(collects()) == 1 and log.read_bytes() == b"rank 0 says hi\n"
        [r] = collect_nodes(fleet, [node], store, RUN_ID, ("ckpt/deep/*",), streamed=streamed)
        assert r.fetched == ("ckpt/deep/b.txt",) and len(collects()) == 2
        log.unlink()  # no local copy at all: fetched
        [r] = collect_nodes(fleet, [node], store, RUN_ID, (), streamed=streamed)
        assert r.ok and len(collects()) == 3 and log.read_bytes() == b"rank 0 says hi\n"
        # what the follower's shell said on stderr (a login shell's complaint), passed on after the log:
        # cut off, as the node's copy would have replaced it; a copy shorter than the log is fetched
        log.write_bytes(b"rank 0 says hi\nbash: warning: setlocale: LC_ALL: cannot change locale\n")
        [r] = collect_nodes(fleet, [node], store, RUN_ID, (), streamed=streamed)
        assert r.ok and len(collects()) == 3 and log.read_bytes() == b"rank 0 says hi\n"
        log.write_bytes(b"rank 0 says")
        [r] = collect_nodes(fleet, [node], store, RUN_ID, (), streamed=streamed)
        assert r.ok and len(collects()) == 4 and log.read_bytes() == b"rank 0 says hi\n"
