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
import threading
from pathlib import Path

import pytest

from clusterddp.node import collect
from clusterddp.node.collect import Receiver
from clusterddp.nodescript import CONTROL


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
    rx = Receiver(lambda rel: dest / rel, on_total=totals.append, on_bytes=got.append, log_to=io.BytesIO())
    rnd, i = random.Random(seed), 0
    while i < len(data):  # as a network might cut it
        n = rnd.choice((1, 2, 3, 17, 4096, 65537))
        rx.feed(data[i:i + n])
        i += n
    rx.finish()
    return rx, totals, got


def test_fetch_then_verify_whole_copies_then_refetch_a_damaged_one(run_dir, tmp_path):
    dest = tmp_path / "artifacts"
    sizes = {p: (run_dir / p).stat().st_size for p in ("ckpt/a.bin", "ckpt/deep/b.txt", "ckpt/empty")}
    data = answer(run_dir, {"log": True, "globs": ["ckpt/**", ".clusterddp/*", "./.clusterddp/*"], "have": {}})
    listing = [json.loads(line) for line in data[data.index(b"rank 0 says hi\n") + 15:].split(b"\n")[:4]]
    assert listing == [{"file": p, "size": s} for p, s in sizes.items()] + [{"files": 3}]  # no link, no control folder

    rx, totals, got = receive(data, dest)
    assert rx.log_to.getvalue() == b"rank 0 says hi\n" and rx.log == 15 and totals == [sum(sizes.values())]  # type: ignore[union-attr]
    assert rx.fetched == list(sizes) and rx.errors == rx.missing == [] and rx.bytes == sum(sizes.values()) == sum(got)
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
    assert rx.fetched == [] and rx.skipped == ["ckpt/a.bin"] and rx.errors == []
    assert rx.missing == [("ckpt/deep/b.txt", "the copy received does not match the node's sha256 (1100 bytes)")]
    assert not [p for p in dest.rglob("*") if p.is_file()]  # nothing kept, no .part left


def test_an_unreadable_file_is_named_and_a_changing_one_is_not_called_whole(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "live").write_bytes(b"abc")
    same = hashlib.sha256(b"abc").hexdigest()
    rx = Receiver(lambda rel: tmp_path / rel)
    rx.feed(b'{"file": "ckpt/x", "size": 9}\n{"file": "ckpt/live", "size": 3}\n{"files": 2}\n'
            b'{"path": "ckpt/x", "error": "[Errno 13] Permission denied"}\n{"tick": 1}\n'
            + json.dumps({"path": "ckpt/live", "sha256": same, "stable": False}).encode() + b"\n")
    rx.finish()
    assert rx.missing == [("ckpt/x", "cannot read it on the node: [Errno 13] Permission denied")]
    assert rx.skipped == ["ckpt/live"] and rx.whole == [] and rx.errors == []  # its hash matched a moment, not the file


def test_the_control_folder_name_is_the_plans():
    assert collect.CONTROL == CONTROL


# ---- hostile answers: every byte from a node is untrusted ----

def lines(*recs: object) -> bytes:
    return b"".join((r if isinstance(r, bytes) else json.dumps(r).encode()) + b"\n" for r in recs)


ABC = hashlib.sha256(b"abc").hexdigest()
LISTED = lines({"file": "a.txt", "size": 3}, {"file": "b.txt", "size": 3}, {"files": 2})
A_SENT = lines({"path": "a.txt", "send": 3})[:-1] + b"\nabc" + lines({"path": "a.txt", "sha256": ABC, "stable": True})


def fed(rx: Receiver, data: bytes, seconds: float = 20) -> BaseException | None:
    """Feed ``data`` in pieces on a thread; fail unless it is done within ``seconds`` (a
    negative size once made the receiver loop for ever). Returns what it raised."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            for i in range(0, len(data), 7):
                rx.feed(data[i:i + 7])
            raised.append(None)
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            raised.append(e)
    th = threading.Thread(target=run, daemon=True)
    th.start()
    th.join(seconds)
    assert not th.is_alive(), "the receiver is still busy with a short answer"
    return raised[0]


@pytest.mark.parametrize("bad, words", [
    ({"path": "b.txt", "send": -5}, "send: -5 is not a size"),
    ({"path": "b.txt", "send": -31}, "send: -31 is not a size"),  # its own line's length: read it again, for ever
    ({"path": "b.txt", "send": "3"}, "send: '3' is not a size"),
    ({"path": "b.txt", "send": True}, "send: True is not a size"),
    ({"path": "b.txt", "send": 3.0}, "send: 3.0 is not a size"),
    ({"path": "b.txt", "send": 1 << 60}, "is not a size"),
    ({"path": "b.txt", "send": 4}, "b.txt: sends 4 bytes but was listed with 3"),
    ({"path": "c.txt", "send": 3}, "c.txt is not in the file list"),
    ({"path": ["b.txt"], "send": 3}, "['b.txt'] is not in the file list"),
    ({"path": "a.txt", "send": 3}, "a.txt sent twice"),
    ({"path": "b.txt", "sha256": "XYZ", "stable": True}, "sha256: not 64 lowercase hex digits"),
    ({"path": "b.txt", "sha256": ABC.upper(), "stable": True}, "sha256: not 64 lowercase hex digits"),
    ({"path": "b.txt", "sha256": ABC, "stable": "yes"}, "stable: not true or false"),
    ({"path": "b.txt", "error": ["denied"]}, "error: not a string"),
    ({"path": "b.txt", "send": 3, "mode": "0644"}, "unexpected header with keys ['mode', 'path', 'send']"),
    ({"log": 5}, "unexpected header with keys ['log'] after the file list"),
    ({"file": "c.txt", "size": 1}, "unexpected header with keys ['file', 'size'] after the file list"),
    ({"files": 2}, "unexpected header"),
    (b"[1, 2]", "not a JSON object"),
    (b"{not json", "not a JSON header line (JSONDecodeError)"),
    (b'{"tick": NaN}', "not a JSON header line (ValueError)"),
    (b'{"path": "b.txt", "send": 1' + b"0" * 5000 + b"}", "not a JSON header line (ValueError)"),
    (b"[" * 100_000, "a header line longer than 65536 bytes"),
    (b"[" * 60_000, "not a JSON header line (RecursionError)"),
    (b'\xff\xfe{"tick": 1}', "not a JSON header line (UnicodeDecodeError)"),
    (b"x" * (collect.MAX_LINE + 1), "a header line longer than 65536 bytes"),
    (lines(*[{"tick": 1}] * 12)[:-1], "more keep-alive lines than time has passed"),
    ({"tick": 2}, "more keep-alive lines"),
    (lines(*[{"error": "no"}] * 101)[:-1], "more than 100 error lines"),
])
def test_a_bad_header_ends_the_answer_in_bounded_time_and_keeps_what_came_before(tmp_path, bad, words):
    dest = tmp_path / "artifacts"
    rx = Receiver(lambda rel: dest / rel)
    raised = fed(rx, LISTED + A_SENT + lines(bad) + lines({"path": "b.txt", "send": 3})[:-1] + b"\nxyz")
    assert isinstance(raised, collect.StreamError) and words in str(raised), raised
    with pytest.raises(collect.StreamError):  # once broken, nothing more is read
        rx.feed(lines({"path": "b.txt", "sha256": ABC, "stable": True}))
    rx.finish()
    assert rx.fetched == ["a.txt"] and (dest / "a.txt").read_bytes() == b"abc"
    assert rx.missing == [("b.txt", f"not received: {raised}")]
    assert sorted(p.name for p in dest.rglob("*")) == ["a.txt"]  # no .part left


@pytest.mark.parametrize("answer, words", [
    (lines({"log": -1}) + b"x" * 100, "log: -1 is not a size"),
    (lines({"log": 2}) + b"ab" + lines({"log": 2}) + b"cd", "unexpected header with keys ['log'] at the start"),
    (lines({"file": "a.txt", "size": -3}), "size: -3 is not a size"),
    (lines({"file": "a.txt", "size": 3}, {"file": "a.txt", "size": 3}), "a.txt listed twice"),
    (lines({"file": "a.txt", "size": 3}, {"files": 3}), "the file list ends with a count of 3, after 1 files"),
    (lines({"files": -1}), "files: -1 is not a size"),
    (lines({"path": "a.txt", "send": 3}), "unexpected header with keys ['path', 'send'] at the start"),
])
def test_a_bad_log_or_file_list_ends_the_answer(tmp_path, answer, words):
    rx = Receiver(lambda rel: tmp_path / rel, log_to=io.BytesIO())
    raised = fed(rx, answer)
    assert isinstance(raised, collect.StreamError) and words in str(raised), raised
    rx.finish()
    whole = answer.startswith(b'{"log": 2}')  # a whole log is kept
    assert rx.fetched == [] and rx.log == (2 if whole else None)
    assert rx.log_to.getvalue() == (b"ab" if whole else b"")  # type: ignore[union-attr]


def test_too_many_files_or_too_long_a_list_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(collect, "MAX_FILES", 5)
    raised = fed(Receiver(lambda rel: tmp_path / rel), lines(*[{"file": f"f{i}", "size": 1} for i in range(6)]))
    assert isinstance(raised, collect.StreamError) and "more than 5 files listed" in str(raised)
    monkeypatch.setattr(collect, "MAX_LISTED", 100)
    raised = fed(Receiver(lambda rel: tmp_path / rel), lines(*[{"file": f"{i}" * 40, "size": 1} for i in range(3)]))
    assert isinstance(raised, collect.StreamError) and "the file list is longer than 100 characters" in str(raised)


BAD_PATHS = [
    ("../escape.txt", "refused: goes up with .."),
    ("ok/../../escape.txt", "refused: goes up with .."),
    ("/tmp/abs.txt", "refused: absolute"),
    (".clusterddp/launch.sh", "refused: in the control folder .clusterddp"),
    ("a//b", "refused: not normalised"),
    ("./a", "refused: not normalised"),
    ("a/", "refused: not normalised"),
    ("a\0b", "refused: contains NUL"),
    ("\ud800", "refused: not a file name"),
    ("", "refused: empty"),
]


def test_a_refused_path_is_skipped_and_the_files_after_it_still_arrive(tmp_path):
    dest = tmp_path / "runs" / "artifacts"
    asked: list[str] = []

    def where(rel: str) -> Path:
        asked.append(rel)
        return dest / rel
    rx = Receiver(where)
    bad = [p for p, _ in BAD_PATHS]
    answer = lines(*[{"file": p, "size": 3} for p in bad], {"file": "x" * 5000, "size": 3}, {"file": 7, "size": 1},
                   {"file": "good/ok.txt", "size": 3}, {"files": len(bad) + 3})
    for p in bad:
        answer += lines({"path": p, "send": 3})[:-1] + b"\nEVL" + lines({"path": p, "sha256": ABC, "stable": True})
    answer += lines({"path": "good/ok.txt", "send": 3})[:-1] + b"\nabc"
    answer += lines({"path": "good/ok.txt", "sha256": ABC, "stable": True})
    assert fed(rx, answer) is None
    rx.finish()
    assert rx.fetched == ["good/ok.txt"] and (dest / "good/ok.txt").read_bytes() == b"abc"
    assert rx.missing == BAD_PATHS + [("x" * 200 + "...", "refused: longer than 4096 bytes"),
                                      ("7", "refused: not a string")]
    assert rx.errors == [] and asked == ["good/ok.txt"] * 2  # no refused path ever reached dest()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [dest / "good/ok.txt"]


def test_files_not_asked_for_are_refused(tmp_path):
    rx = Receiver(lambda rel: tmp_path / rel, request={"globs": ["ckpt/**", "*.log"], "have": {}})
    assert fed(rx, lines({"file": "ckpt/a/b.pt", "size": 0}, {"file": "train.log", "size": 0},
                         {"file": "etc/passwd", "size": 0}, {"file": "ckpt/.hidden", "size": 0}, {"files": 4})) is None
    rx.finish()
    why = "refused: not asked for (matches no collect glob)"
    assert rx.missing == [("etc/passwd", why), ("ckpt/.hidden", why),
                          ("ckpt/a/b.pt", "not received: the node's answer ended early"),
                          ("train.log", "not received: the node's answer ended early")]
    rx = Receiver(lambda rel: tmp_path / rel, request={"paths": ["ckpt/a.pt"], "have": {}})
    assert fed(rx, lines({"file": "ckpt/b.pt", "size": 0}, {"files": 1})) is None
    rx.finish()
    assert rx.missing == [("ckpt/b.pt", "refused: not asked for (matches no collect glob)")]


def test_a_local_write_that_fails_skips_that_file_only(tmp_path):
    dest = tmp_path / "artifacts"
    dest.mkdir()
    (dest / "blocker").write_text("a file where a folder should be")

    def where(rel: str) -> Path:
        if rel == "refused.txt":
            raise ValueError("refusing artifact path outside the run folder")
        return dest / rel
    rx = Receiver(where)
    answer = lines(*[{"file": p, "size": 3} for p in ("blocker/x.txt", "refused.txt", "a.txt")], {"files": 3})
    for p, body in (("blocker/x.txt", b"xyz"), ("refused.txt", b"xyz"), ("a.txt", b"abc")):
        answer += lines({"path": p, "send": 3})[:-1] + b"\n" + body
        answer += lines({"path": p, "sha256": hashlib.sha256(body).hexdigest(), "stable": True})
    assert fed(rx, answer) is None
    rx.finish()
    assert rx.fetched == ["a.txt"] and [p for p, _ in rx.missing] == ["blocker/x.txt", "refused.txt"]
    assert all(why.startswith("cannot write it here: ") for _, why in rx.missing), rx.missing


def test_an_answer_cut_short_reports_each_file_it_did_not_bring(tmp_path):
    dest = tmp_path / "artifacts"
    rx = Receiver(lambda rel: dest / rel)
    fed(rx, lines({"log": 10})[:-1] + b"\nonly 4" + b"")
    rx.finish()
    assert rx.log is None and rx.errors == [
        "the log was cut short (6 bytes received); the node's answer ended early",
        "the node's answer ended before its file list did"]

    rx = Receiver(lambda rel: dest / rel)
    fed(rx, lines({"file": "big.bin", "size": 1 << 20}, {"file": "next.bin", "size": 1}, {"files": 2},
                  {"path": "big.bin", "send": 1 << 20})[:-1] + b"\nabc")
    rx.finish()  # the node exited 0 after 3 bytes of 1 MiB
    assert rx.missing == [("big.bin", "received 3 of 1048576 bytes; the node's answer ended early"),
                          ("next.bin", "not received: the node's answer ended early")]
    assert not list(dest.rglob("*.part")) and rx.fetched == []

    rx = Receiver(lambda rel: dest / rel)
    fed(rx, lines({"file": "a.txt", "size": 3}, {"files": 1}, {"path": "a.txt", "send": 3})[:-1] + b"\nabc")
    rx.finish("a: connection lost")
    assert rx.missing == [("a.txt", "its sha256 line never came; a: connection lost")]


def test_a_hash_only_answer_for_a_file_not_here_asks_for_it_again(tmp_path):
    rx = Receiver(lambda rel: tmp_path / rel)
    assert fed(rx, lines({"file": "gone.txt", "size": 3}, {"files": 1},
                         {"path": "gone.txt", "sha256": ABC, "stable": True})) is None
    rx.finish()
    assert rx.differ == ["gone.txt"] and rx.whole == [] and rx.missing == []


PATTERNS = ["**", "ckpt/**", "ckpt/*", "ckpt/**/*.pt", "**/*.pt", "*/deep/*", "ckpt/*/x.pt", "ckpt/[ab]*",
            "ckpt/?.pt", ".hidden/*", "ckpt/.h*", "ckpt/**/**/y.pt", "**/.h*", "ckpt/deep", "ckpt/a.pt",
            "./ckpt/a.pt", "ckpt//a.pt", "ckpt/deep/**", "*.log", "nope/**"]


def test_the_node_matches_globs_as_glob_does_without_links(tmp_path, monkeypatch):
    """Without links, the node's own walk lists what glob(recursive=True) lists (regular files),
    and the receiver's check of a listed path against the globs agrees with both."""
    import glob
    for p in ("ckpt/a.pt", "ckpt/b.pt", "ckpt/.h.pt", "ckpt/deep/x.pt", "ckpt/deep/y.pt", "ckpt/deep/more/y.pt",
              "ckpt/.hdir/z.pt", "ckpt/d2/x.pt", ".hidden/s.pt", "top.log", "ckpt/c.txt"):
        (tmp_path / p).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / p).write_text(p)
    monkeypatch.chdir(tmp_path)
    every = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    for pat in PATTERNS:
        want = sorted({os.path.normpath(p) for p in glob.glob(pat, recursive=True) if os.path.isfile(p)})
        found: dict = {}
        collect._walk(collect.glob_parts(pat), found, lambda: None)
        assert sorted(found) == want, pat
        assert [p for p in every if collect.matches(collect.glob_parts(pat), p.split("/"))] == want, pat
    assert collect.glob_parts("/etc/*") is None and collect.glob_parts("a/../b") is None
    deep = "/".join(["d"] * 2000)  # far deeper than the recursion limit
    assert collect.matches(["**", "x"], (deep + "/x").split("/"))


def test_a_deep_folder_tree_is_walked_without_recursion(tmp_path, monkeypatch):
    import sys
    monkeypatch.chdir(tmp_path)
    deep = "/".join(["d"] * 300)
    os.makedirs(deep)
    Path(deep, "x.pt").write_text("deep")
    found: dict = {}
    depth, frame = 0, sys._getframe()
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 100)  # far less than the tree is deep (glob would fail here)
    try:
        collect._walk(["**", "x.pt"], found, lambda: None)
    finally:
        sys.setrecursionlimit(limit)
    assert list(found) == [deep + "/x.pt"]


def test_the_node_sends_at_most_max_files_and_says_so(run_dir, monkeypatch):
    monkeypatch.setattr(collect, "MAX_FILES", 2)
    data = answer(run_dir, {"globs": ["ckpt/**", "/etc/*", "../*"], "have": {}})
    headers = data[:data.index(b'{"path"')]  # the lines before the first file's bytes
    recs = [json.loads(line) for line in headers.split(b"\n") if line]
    assert len([r for r in recs if "file" in r]) == 2 and {"files": 2} in recs
    assert [r["error"] for r in recs if set(r) == {"error"}] == [
        "collect glob '/etc/*' refused: it must be relative to the run folder, without ..",
        "collect glob '../*' refused: it must be relative to the run folder, without ..",
        "more than 2 files match the collect globs; only 2 are sent: narrow the globs"]


def test_two_collects_of_one_run_at_once_each_write_a_file_of_their_own(run_dir, tmp_path):
    """Both wrote <file>.part: one truncated the other's, the result was half of each, reported
    fetched and verified. Each collect's bytes now go to a file of its own until renamed whole."""
    dest = tmp_path / "artifacts"
    data = answer(run_dir, {"globs": ["ckpt/**"], "have": {}})
    rxs = [Receiver(lambda rel: dest / rel) for _ in range(2)]
    cut = data.index(b'"send"') + (1 << 19)  # the first receiver is in the middle of ckpt/a.bin
    rxs[0].feed(data[:cut])
    for i in range(0, len(data), 4096):  # the second, all of it meanwhile, in pieces
        rxs[1].feed(data[i:i + 4096])
        if i == 65536:
            assert len(list(dest.rglob("a.bin.*.part"))) == 2  # each its own
    rxs[1].finish()
    rxs[0].feed(data[cut:])
    rxs[0].finish()
    for rx in rxs:
        assert rx.fetched == ["ckpt/a.bin", "ckpt/deep/b.txt", "ckpt/empty"] and rx.errors == rx.missing == []
    for p in ("ckpt/a.bin", "ckpt/deep/b.txt", "ckpt/empty"):
        assert hashlib.sha256((dest / p).read_bytes()).digest() == hashlib.sha256((run_dir / p).read_bytes()).digest()
    assert not list(dest.rglob("*.part"))


def test_sha256_file_hashes_the_whole_file_or_its_first_bytes(tmp_path):
    # The launcher's check of a streamed log (artifacts.keep_streamed) hashes what precedes a suffix.
    data = os.urandom((1 << 20) + 7)  # past one read buffer
    f = tmp_path / "f"
    f.write_bytes(data)
    assert collect.sha256_file(f) == hashlib.sha256(data).hexdigest()
    for n in (0, 1, 1 << 20, (1 << 20) + 1, len(data), len(data) + 5):
        assert collect.sha256_file(f, n) == hashlib.sha256(data[:n]).hexdigest(), n


# ---- the samplers' files, in the same answer ----

def test_the_samplers_files_come_with_the_log_and_files_in_one_answer(run_dir, tmp_path, monkeypatch):
    # the log's folder's metrics.jsonl, its earlier attempts' (beside it, newest first), its where.jsonl;
    # a link and a FIFO where a file should be are not followed or read
    ctl = run_dir / CONTROL
    (ctl / "metrics.jsonl").write_bytes(b"last\n")
    (ctl / "where.jsonl").write_bytes(b"where\n")
    for n, body in ((1, b"first\n"), (12, b"twelfth\n")):
        (run_dir / f"{CONTROL}@attempt-{n}").mkdir()
        (run_dir / f"{CONTROL}@attempt-{n}" / "metrics.jsonl").write_bytes(body)
    (run_dir / f"{CONTROL}@attempt-3").mkdir()
    (run_dir / f"{CONTROL}@attempt-3" / "metrics.jsonl").symlink_to(ctl / "node.log")
    (run_dir / f"{CONTROL}@attempt-4").mkdir()
    os.mkfifo(run_dir / f"{CONTROL}@attempt-4" / "metrics.jsonl")
    (run_dir / f"{CONTROL}@attempt-x").mkdir()
    request = {"log": True, "globs": ["ckpt/deep/*"], "have": {}, "samples": ["."]}
    data = answer(run_dir, request)
    assert [json.loads(h)["attempt"] for h in data.split(b"\n") if h.startswith(b'{"samples"')] == [None, 12, 1]
    dest = tmp_path / "artifacts"
    rx = Receiver(lambda rel: dest / rel, request=request, log_to=io.BytesIO())
    rx.feed(data)
    rx.finish()
    assert rx.samples == {".": {None: b"last\n", 12: b"twelfth\n", 1: b"first\n"}} and rx.where == {".": b"where\n"}
    assert rx.log == 15 and rx.fetched == ["ckpt/deep/b.txt"] and not rx.errors and not rx.missing
    # bounded as the node's readers bound them: a file at SAMPLES_MOST, the folder's files within the budget
    monkeypatch.setattr(collect, "SAMPLES_MOST", 4)
    monkeypatch.setattr(collect, "SAMPLES_BUDGET", 6)
    rx = Receiver(lambda rel: dest / rel, request=request, log_to=io.BytesIO())
    rx.feed(answer(run_dir, request))
    rx.finish()
    assert rx.samples == {".": {None: b"last", 12: b"tw"}} and not rx.errors
    # not asked: not sent
    assert b'"samples"' not in answer(run_dir, {"log": True, "globs": [], "have": {}})


def test_the_bounds_are_the_readers():
    from clusterddp import nodescript
    from clusterddp.metrics import samples
    from clusterddp.node import where
    assert (collect.SAMPLES_FILE, collect.WHERE_FILE) == (nodescript.SAMPLES, nodescript.WHERE_SAMPLES)
    assert collect.SAMPLES_MOST == samples.MOST and collect.WHERE_MOST == where.PARSE_MOST
    assert samples.ATTEMPT.match(f"attempt-{collect.MAX_ATTEMPT}.jsonl")
    assert not samples.ATTEMPT.match(f"attempt-{collect.MAX_ATTEMPT + 1}.jsonl")


def sample(folder: str, size: int, attempt: object = None) -> dict:
    return {"samples": folder, "attempt": attempt, "size": size}


@pytest.mark.parametrize("answer, words", [
    (lines(sample("..", 1)) + b"x", "samples of a folder not asked for: .."),
    (lines(sample("other", 1)) + b"x", "samples of a folder not asked for: other"),
    (lines({"where": "/etc", "size": 1}) + b"x", "samples of a folder not asked for: /etc"),
    (lines(sample(".", collect.SAMPLES_MOST + 1)), "over 8388608 bytes a file"),
    (lines({"where": ".", "size": collect.WHERE_MOST + 1}), "where.jsonl of .: 8388609 bytes, over 8388608"),
    (lines(sample(".", -1)), "size: -1 is not a size"),
    (lines(sample(".", 1, True)) + b"x", "attempt: True is not an attempt"),
    (lines(sample(".", 1, 0)) + b"x", "attempt: 0 is not an attempt"),
    (lines(sample(".", 1, 10000)) + b"x", "attempt: 10000 is not an attempt"),
    (lines(sample(".", 1, "1")) + b"x", "attempt: '1' is not an attempt"),
    (lines(sample(".", 1, 2)) + b"x" + lines(sample(".", 1, 2)) + b"y", "the samples of . (attempt 2) sent twice"),
    (lines({"where": ".", "size": 0}, {"where": ".", "size": 0}), "where.jsonl of . sent twice"),
    (b"".join(lines(sample(".", collect.SAMPLES_MOST, n + 1)) + bytes(collect.SAMPLES_MOST) for n in range(5)),
     "together"),
    (lines(sample(".", 1)) + b"x" + lines({"log": 1}) + b"x", "unexpected header with keys ['log'] at the start"),
    (lines({"file": "a.txt", "size": 3}, sample(".", 1)) + b"x", "unexpected header with keys"),
])
def test_a_bad_samples_header_ends_the_answer_and_keeps_nothing_of_it(tmp_path, answer, words):
    rx = Receiver(lambda rel: tmp_path / rel, request={"globs": [], "samples": ["."]}, log_to=io.BytesIO())
    raised = fed(rx, answer)
    assert isinstance(raised, collect.StreamError) and words in str(raised), raised
    rx.finish()
    assert all(len(b) <= collect.SAMPLES_MOST for f in rx.samples.values() for b in f.values())


def test_samples_not_asked_for_are_refused_and_one_cut_short_is_not_kept(tmp_path):
    raised = fed(Receiver(lambda rel: tmp_path / rel, request={"globs": []}), lines(sample(".", 1)) + b"x")
    assert isinstance(raised, collect.StreamError) and "unexpected header with keys" in str(raised)
    rx = Receiver(lambda rel: tmp_path / rel, request={"globs": [], "samples": ["."]})
    cut = lines(sample(".", 3)) + b"abc" + lines({"where": ".", "size": 0}, sample(".", 10, 1)) + b"12345"
    assert fed(rx, cut) is None
    rx.finish()  # the answer ended in attempt 1's file: the whole ones are kept, that one is not
    assert rx.samples == {".": {None: b"abc"}} and rx.where == {".": b""}
