"""collect's two ends together, in-process: the node program (clusterddp/node/collect.py ``main``)
writes its answer into memory and the launcher's ``Receiver`` reads it, in arbitrary pieces.

test_artifacts.py runs the same program as a real node command through the local transport;
these see both ends' code in one process (coverage, linters) and pin the wire format.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
from pathlib import Path

import pytest

from clusterddp import plan
from clusterddp.node import collect
from clusterddp.node.collect import Receiver


@pytest.fixture
def run_dir(tmp_path, monkeypatch) -> Path:
    monkeypatch.chdir(tmp_path)  # main() changes into the run folder; this puts the test's back after
    d = tmp_path / "node"
    (d / ".clusterddp").mkdir(parents=True)
    (d / ".clusterddp" / "node.log").write_bytes(b"rank 0 says hi\n")
    (d / ".clusterddp" / "launch.sh").write_text("not an artifact\n")
    (d / "ckpt" / "deep").mkdir(parents=True)
    (d / "ckpt" / "a.bin").write_bytes(os.urandom((1 << 20) + 123))  # spans two of the node's buffers
    (d / "ckpt" / "deep" / "b.txt").write_text("{\"json\": \"lookalike\"}\n" * 50)
    (d / "ckpt" / "empty").write_bytes(b"")
    (d / "ckpt" / "link").symlink_to(d / "ckpt" / "a.bin")
    return d


def answer(run_dir: Path, request: dict) -> bytes:
    out = io.BytesIO()
    rc = collect.main([str(run_dir), str(run_dir / ".clusterddp" / "node.log")],
                      stdin=io.StringIO(json.dumps(request)), stdout=out)
    assert rc == 0
    return out.getvalue()


def receive(data: bytes, dest: Path, seed: int = 7) -> tuple[Receiver, list[int], list[int]]:
    totals: list[int] = []
    got: list[int] = []
    rx = Receiver(lambda rel: dest / rel, on_total=totals.append, on_bytes=got.append)
    rnd, i = random.Random(seed), 0
    while i < len(data):  # as a network might cut it
        n = rnd.choice((1, 2, 3, 17, 4096, 65537))
        rx.feed(data[i:i + n])
        i += n
    rx.discard()
    return rx, totals, got


def test_fetch_then_verify_whole_copies_then_refetch_a_damaged_one(run_dir, tmp_path):
    dest = tmp_path / "artifacts"
    sizes = {p: (run_dir / p).stat().st_size for p in ("ckpt/a.bin", "ckpt/deep/b.txt", "ckpt/empty")}
    data = answer(run_dir, {"log": True, "globs": ["ckpt/**", ".clusterddp/*"], "have": {}})
    first = json.loads(data[data.index(b"rank 0 says hi\n") + 15:].split(b"\n", 1)[0])
    assert first == {"files": [{"path": p, "size": s} for p, s in sizes.items()]}  # no link, no control folder

    rx, totals, got = receive(data, dest)
    assert bytes(rx.log or b"") == b"rank 0 says hi\n" and totals == [sum(sizes.values())]
    assert rx.fetched == list(sizes) and rx.errors == [] and rx.bytes == sum(sizes.values()) == sum(got)
    for p in sizes:
        assert (dest / p).read_bytes() == (run_dir / p).read_bytes()

    (dest / "ckpt/deep/b.txt").write_bytes(b"X" + (dest / "ckpt/deep/b.txt").read_bytes()[1:])  # same size
    again = answer(run_dir, {"globs": ["ckpt/**"], "have": sizes})
    assert b"\"send\"" not in again  # every local copy has the node's size: hashes only
    rx, totals, got = receive(again, dest)
    assert rx.log is None and rx.fetched == [] and rx.whole == ["ckpt/a.bin", "ckpt/empty"]
    assert rx.differ == ["ckpt/deep/b.txt"] and sum(got) == sum(sizes.values())

    rx, _, _ = receive(answer(run_dir, {"paths": rx.differ, "have": {}}), dest, seed=8)
    assert rx.fetched == ["ckpt/deep/b.txt"]
    assert (dest / "ckpt/deep/b.txt").read_bytes() == (run_dir / "ckpt/deep/b.txt").read_bytes()
    assert not list(dest.rglob("*.part"))


def test_a_copy_whose_hash_disagrees_is_refused_and_an_unstable_one_skipped(run_dir, tmp_path):
    dest = tmp_path / "artifacts"
    data = answer(run_dir, {"paths": ["ckpt/deep/b.txt", "ckpt/a.bin"], "have": {}})
    header = b"{\"path\": \"ckpt/deep/b.txt\", \"send\": "
    i = data.index(header) + len(header)
    i = data.index(b"\n", i) + 1  # the first byte of b.txt's content
    damaged = data[:i] + b"X" + data[i + 1:]
    stable = b"{\"path\": \"ckpt/a.bin\", \"sha256\": "
    j = data.index(stable)
    k = data.index(b"\n", j)
    unstable = damaged[:j] + damaged[j:k].replace(b"\"stable\": true", b"\"stable\": false") + damaged[k:]
    rx, _, _ = receive(unstable, dest)
    assert rx.fetched == [] and rx.skipped == ["ckpt/a.bin"]
    assert rx.errors == ["ckpt/deep/b.txt: local copy does not match the node's (1100 bytes)"]
    assert not [p for p in dest.rglob("*") if p.is_file()]  # nothing kept, no .part left


def test_an_unreadable_file_is_named_and_a_changing_one_is_not_called_whole(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "live").write_bytes(b"abc")
    same = hashlib.sha256(b"abc").hexdigest()
    rx = Receiver(lambda rel: tmp_path / rel)
    rx.feed(b'{"files": []}\n{"path": "ckpt/x", "error": "[Errno 13] Permission denied"}\n{"tick": 1}\n'
            + json.dumps({"path": "ckpt/live", "sha256": same, "stable": False}).encode() + b"\n")
    assert rx.errors == ["ckpt/x: cannot read it on the node: [Errno 13] Permission denied"]
    assert rx.skipped == ["ckpt/live"] and rx.whole == []  # its hash matched a moment, not the file


def test_the_control_folder_name_is_the_plans():
    assert collect.CONTROL == plan.CONTROL
