"""Collect on this machine: the real node-side program (plan.collect_command) run by the local transport.

The SSH path is covered on the test bed (test_control_ssh.py); these check the protocol and the
verification rules quickly, including output cut into arbitrary pieces.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

import pytest

from clusterddp import inventory
from clusterddp import plan as P
from clusterddp.artifacts import collect_node
from clusterddp.store import RunStore
from clusterddp.transport.local import LocalTransport
from helpers import make_record

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
    node = P.build_plan(inv, P.RunSpec("t.py"), RUN_ID, local_run_dir=str(node_dir),
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
    gone = P.NodeLaunch(**{**node.__dict__, "run_dir": str(tmp_path / "nope")})
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
