"""The checkpoint mirror's pure parts (clusterddp.mirror): which listed files make the newest complete
checkpoint of each series, mirror.json read back as untrusted, the interval knob, the line a detached
run says; and its failures, one warning line each, never the run's (a fake transport at the seam)."""

from __future__ import annotations

import json
import os
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from clusterddp import mirror
from clusterddp import plan as ssh_plan
from clusterddp.errors import HostError, MirrorError
from clusterddp.inventory import Host
from clusterddp.mirror import SEED_MISMATCH, seed_command
from clusterddp.node import collect
from clusterddp.plan import LaunchPlan, NodeLaunch
from clusterddp.runspec import RunSpec
from clusterddp.store import RunStore
from helpers import eventually

G = mirror.DEFAULT_GLOBS


def newest(listing: dict, globs=G, before=None) -> list[str]:
    return [c.name for c in mirror.choose(listing, globs, before)]


def test_the_highest_step_of_each_series_is_the_newest():
    listing = {"checkpoints/step-8.pt": (10, 1), "checkpoints/step-12.pt": (10, 2), "checkpoints/step-4.pt": (10, 3),
               "checkpoints/best-3.pt": (5, 1), "checkpoints/best-11.pt": (5, 0), "checkpoints/latest.pt": (7, 9),
               "checkpoints/.step-13.123.ab.tmp": (3, 9),  # save_checkpoint's temp file: hidden, never taken
               "elsewhere/step-99.pt": (1, 1)}  # not under the globs
    assert newest(listing, globs=("checkpoints/**",)) == [
        "checkpoints/best-11.pt", "checkpoints/latest.pt", "checkpoints/step-12.pt"]


def test_by_default_a_checkpoint_is_a_file_that_looks_like_one_anywhere_in_the_run_folder():
    listing = {"snapshot.pt": (10, 1), "out/model.pth": (1, 1), "lightning/last.ckpt": (1, 1),
               "hf/checkpoint-500/model.safetensors": (1, 1), "hf/checkpoint-500/trainer_state.json": (1, 1),
               "checkpoints/step-3.bin": (1, 1), "snapshots/snapshot_7": (1, 1),
               "train.py": (1, 1), "data/train.csv": (1, 1), "logs/events.txt": (1, 1), ".cache/x.pt": (1, 1)}
    assert newest(listing) == ["checkpoints/step-3.bin", "hf/checkpoint-500/", "lightning/last.ckpt",
                               "out/model.pth", "snapshot.pt", "snapshots/snapshot_7"]
    assert "**/*.pt" in mirror.DEFAULT_GLOBS and "**/snapshot*" in mirror.DEFAULT_GLOBS


def test_checkpoints_globs_from_up_win_over_the_inventory_over_the_default():
    p = plan()
    assert mirror.checkpoint_globs(p) == mirror.DEFAULT_GLOBS
    from clusterddp import inventory
    from clusterddp.runspec import RunSpec, resolve  # the rule is resolve's; the mirror reads the spec
    inv = inventory.parse("hosts: [{name: a, address: 10.0.0.1}]\ncheckpoints: [inv/*.pt]\n", "inv.yaml")
    asked = RunSpec(p.spec.script)
    assert mirror.checkpoint_globs(replace(p, spec=resolve(asked, inv))) == ("inv/*.pt",)
    flag = replace(asked, checkpoints=("flag/*.pt",))
    assert mirror.checkpoint_globs(replace(p, spec=resolve(flag, inv))) == ("flag/*.pt",)


def test_a_folder_per_step_is_one_checkpoint_of_all_its_files():
    listing = {"checkpoints/checkpoint-500/model_0.pt": (1, 1), "checkpoints/checkpoint-500/optim.pt": (1, 1),
               "checkpoints/checkpoint-1000/model_0.pt": (1, 2), "checkpoints/checkpoint-1000/optim.pt": (1, 2)}
    [chk] = mirror.choose(listing, G)
    assert chk.name == "checkpoints/checkpoint-1000/" and chk.step == (1000,) and len(chk.files) == 2
    # the glob's own folders do not count: run3 is not a step, iter_0001000 is (not mp_rank_00 below it)
    assert mirror.series_of("run3/ckpt/iter_0001000/mp_rank_00/model.pt", ["run3/ckpt/**"]) == (
        "run3/ckpt/iter_#/*", (1000,), "run3/ckpt/iter_0001000")
    latest = "run3/ckpt/latest.pt"
    assert mirror.series_of(latest, ["run3/ckpt/*.pt"]) == (latest, (), latest)
    assert mirror.series_of("notes.txt", ["run3/ckpt/*.pt"]) is None


def test_one_step_twice_the_one_written_last_wins():
    assert newest({"checkpoints/step-08.pt": (1, 5), "checkpoints/step-8.pt": (1, 4)}) == ["checkpoints/step-08.pt"]


def test_a_folder_is_complete_once_listed_alike_twice_a_single_file_at_once():
    before = {"checkpoints/step-4.pt": (10, 1), "checkpoints/step-8.pt": (3, 2), "checkpoints/s-9/a.pt": (1, 1)}
    now = {"checkpoints/step-4.pt": (10, 1), "checkpoints/step-8.pt": (6, 3),
           "checkpoints/s-9/a.pt": (1, 1), "checkpoints/s-9/b.pt": (1, 1)}  # a folder still filling up
    # a single file that changes is taken once a copy of it is consistent (Mirror._fetch), not after 2 looks
    assert newest(now, before=before) == ["checkpoints/step-8.pt"]
    assert newest(now, before=now) == ["checkpoints/s-9/", "checkpoints/step-8.pt"]
    assert newest(now, before={}) == ["checkpoints/step-8.pt"]


def held(**kw) -> dict:
    return {"series": "checkpoints/step-#.pt", "step": [8], "host": "node1", "at": "2026-12-02T08:00:00+00:00",
            "files": [{"path": "checkpoints/step-8.pt", "size": 3, "sha256": "a" * 64}], "mtimes": [1], **kw}


@pytest.mark.parametrize("bad, why", [
    ({"files": [{"path": "../x", "size": 3, "sha256": "a" * 64}]}, "files[0].path: '../x' is refused: goes up with .."),
    ({"files": [{"path": "/etc/x", "size": 3, "sha256": "a" * 64}]}, "files[0].path: '/etc/x' is refused: absolute"),
    ({"files": [{"path": "a", "size": True, "sha256": "a" * 64}]}, "files[0].size: not a number of bytes"),
    ({"files": [{"path": "a", "size": 3, "sha256": "A" * 64}]}, "files[0].sha256: not 64 lowercase hex digits"),
    ({"host": "../node1"}, "host: not a host name"),
    ({"step": ["8"]}, "step: not a list of numbers"),
])
def test_a_damaged_mirror_json_is_a_located_error(tmp_path, bad, why):
    store = RunStore(tmp_path)
    store.run_dir("r1").mkdir(parents=True)
    store.write_mirror_index("r1", json.dumps({"version": 1, "checkpoints": [held(**bad)]}).encode())
    with pytest.raises(MirrorError) as e:
        mirror.read_index(store, "r1")
    assert e.value.message == f"{store.mirror_index_path('r1')}: checkpoints[0].{why}"
    assert "remove the file" in str(e.value)
    store.write_mirror_index("r1", b"[1]")
    with pytest.raises(MirrorError, match="not a mirror index of version 1"):
        mirror.read_index(store, "r1")
    store.write_mirror_index("r1", b"[" * 200_000)  # deeper than json goes (found by the fuzz campaign)
    with pytest.raises(MirrorError, match="nested too deep"):
        mirror.read_index(store, "r1")
    store.mirror_index_path("r1").unlink()
    assert mirror.read_index(store, "r1") == []


def test_the_interval_knob():
    assert mirror.interval_from({}) == (10.0, None)
    assert mirror.interval_from({"CLUSTERDDP_MIRROR_INTERVAL": "0"}) == (0.0, None)  # off
    assert mirror.interval_from({"CLUSTERDDP_MIRROR_INTERVAL": "2.5"}) == (2.5, None)
    value, problem = mirror.interval_from({"CLUSTERDDP_MIRROR_INTERVAL": "0.01"})
    assert value == 10.0 and problem == ("mirror: CLUSTERDDP_MIRROR_INTERVAL='0.01' is not 0 (off) or a number of "
                                         "seconds from 1 to 3600: every 10s instead")


def host(name: str) -> Host:
    return Host(name=name, address="10.0.0.1", user="me", port=None, identity_file=None, known_hosts="~/.ssh/kh",
                host_key_policy="strict", gpus=1, python="python3", workdir="/w", env=(), setup=(),
                connect_timeout=10.0)


def plan(max_restarts: int = 0, local: bool = False) -> LaunchPlan:
    nodes = tuple(NodeLaunch(host(f"node{i + 1}"), i, 1, "/w/runs/r1", f"/w/runs/r1/.clusterddp/node{i + 1}", "m",
                             (), (), "") for i in range(2))
    return LaunchPlan("r1", None, RunSpec("t.py", max_restarts=max_restarts), nodes, "10.0.0.1", 29500, (),  # type: ignore[arg-type]
                      upload=True, local=local)


def test_a_detached_run_that_asked_for_restarts_says_its_checkpoints_are_not_mirrored():
    assert mirror.unprotected(plan()) is None
    assert mirror.unprotected(plan(max_restarts=1, local=True)) is None
    assert mirror.unprotected(plan(max_restarts=1)) == (
        "detached: nothing mirrors this run's checkpoints while no launcher watches it: they are on node1's disk "
        "only, and lost with it (an attached `up` mirrors them: docs/machine-dies.md, "
        "\"Checkpoints that survive any one machine\")")


class _Fleet:
    """The seam: a transport whose collect command fails, or answers a listing."""

    def __init__(self, answers: list) -> None:
        self.answers, self.asked = answers, []

    def transport(self, h: Host) -> _Fleet:
        return self

    def stream(self, command, on_data, *, timeout=None, stderr_to=None, stdin=None) -> int:
        self.asked.append(json.loads(stdin))
        a = self.answers.pop(0) if self.answers else HostError("node1", "the connection closed")
        if isinstance(a, Exception):
            raise a
        on_data(a)
        return 0


def listing(*files: tuple[str, int, int]) -> bytes:
    lines = [{"file": p, "size": s, "mtime": m} for p, s, m in files] + [{"files": len(files)}]
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def test_a_failing_mirror_says_so_once_and_only_when_it_persists(tmp_path):
    said: list[str] = []
    fleet = _Fleet([HostError("node1", "no data for 60s"), listing(), HostError("node1", "cannot connect"),
                    HostError("node1", "cannot connect"), HostError("node1", "cannot connect")])
    m = mirror.Mirror(fleet, plan(), RunStore(tmp_path), warn=said.append, interval_s=1)  # type: ignore[arg-type]
    for _ in range(5):
        m._stop = threading.Event()
        try:
            m.look()
            m._failing = None
        except HostError as e:  # what _loop does with it
            if m._failing == str(e):
                m._say(f"mirror: {e}")
            m._failing = str(e)
    assert said == ["mirror: node1: cannot connect"]  # a passing hiccup unsaid; the same problem said once
    assert fleet.asked[1] == {"globs": list(mirror.DEFAULT_GLOBS), "have": {}, "list": True, "written": True}


def test_the_mirror_loop_ends_on_stop_and_a_local_run_has_none(tmp_path):
    m = mirror.Mirror(_Fleet([]), plan(), RunStore(tmp_path), interval_s=3600)  # type: ignore[arg-type]
    m.start()
    m.stop()
    assert m._thread is not None and not m._thread.is_alive()
    local = mirror.Mirror(_Fleet([]), plan(local=True), RunStore(tmp_path))  # type: ignore[arg-type]
    local.start()
    assert local._thread is None and not mirror.Mirror(_Fleet([]), replace(plan(), nodes=()), RunStore(tmp_path)).active  # type: ignore[arg-type]


@pytest.mark.parametrize("line, why", [
    ({"file": "a", "size": 1, "mtime": "1"}, "mtime: '1' is not a time in ns"),
    ({"file": "a", "size": 1}, "unexpected header with keys ['file', 'size'] at the start"),
])
def test_a_list_answer_is_checked_like_any_other(tmp_path, line, why):
    rx = collect.Receiver(lambda rel: tmp_path / rel, request={"globs": ["*"], "list": True})
    with pytest.raises(collect.StreamError, match=why.replace("[", r"\[").replace("]", r"\]")):
        rx.feed(json.dumps(line).encode() + b"\n")
    ok = collect.Receiver(lambda rel: tmp_path / rel, request={"globs": ["*"], "list": True})
    ok.feed(listing(("a", 1, 5)))
    with pytest.raises(collect.StreamError, match="unexpected header"):  # a list answer sends no file
        ok.feed(json.dumps({"path": "a", "send": 1}).encode() + b"\n")


def test_a_seeded_file_takes_its_place_only_with_the_mirror_sha256(tmp_path):
    import hashlib
    import subprocess
    node = replace(plan().nodes[0], run_dir=str(tmp_path / "run 1"))
    data = b"checkpoint bytes"
    good, bad = hashlib.sha256(data).hexdigest(), hashlib.sha256(b"other").hexdigest()
    r = subprocess.run(["bash", "-c", seed_command(node, "checkpoints/step-8.pt", bad)], input=data,
                       capture_output=True)
    assert r.returncode == SEED_MISMATCH and b"not the mirror's" in r.stderr
    assert list((tmp_path / "run 1" / "checkpoints").iterdir()) == []  # no temp file, no checkpoint
    r = subprocess.run(["bash", "-c", seed_command(node, "checkpoints/step-8.pt", good)], input=data)
    assert r.returncode == 0 and (tmp_path / "run 1" / "checkpoints" / "step-8.pt").read_bytes() == data
    assert [f.name for f in (tmp_path / "run 1" / "checkpoints").iterdir()] == ["step-8.pt"]


def test_a_list_cut_short_is_a_failed_look_never_a_smaller_checkpoint(tmp_path):
    whole = listing(("checkpoints/step-9/a.pt", 1, 1), ("checkpoints/step-9/b.pt", 1, 1))
    cut = whole[:whole.index(b'{"file": "checkpoints/step-9/b.pt"')]
    fleet = _Fleet([cut, cut])
    m = mirror.Mirror(fleet, plan(), RunStore(tmp_path), interval_s=1)  # type: ignore[arg-type]
    for _ in range(2):
        with pytest.raises(HostError, match="its list of checkpoint files was cut short"):
            m.look()
    assert m._before is None and not m._held


# ---- a consistent copy of a file rewritten in place (the node program itself, run in-process) ----

class _Node:
    """The seam, with the real node program behind it: each collect command runs ``collect.main`` on
    ``run`` here; ``before_fetch(n)`` runs before the n-th fetch (a job rewriting its snapshot)."""

    def __init__(self, run, before_fetch=lambda n: None) -> None:
        self.run, self.before_fetch, self.fetches = run, before_fetch, 0

    def transport(self, h: Host) -> _Node:
        return self

    def stream(self, command, on_data, *, timeout=None, stderr_to=None, stdin=None) -> int:
        import io
        req = json.loads(stdin)
        if req.get("paths"):
            self.fetches += 1
            self.before_fetch(self.fetches)
        out = io.BytesIO()
        cwd = os.getcwd()
        try:
            rc = collect.main([str(self.run), str(self.run / "node.log")], io.BytesIO(stdin), out)
        finally:
            os.chdir(cwd)
        on_data(out.getvalue())
        return rc


def _zip(path, payload: bytes, *, cut: int | None = None, age_s: float = 60) -> None:
    """A torch.save-like file (a zip), optionally cut off after ``cut`` bytes, modified ``age_s`` ago."""
    import io
    import time
    import zipfile
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w") as z:
        z.writestr("archive/data.pkl", payload)
    data = b.getvalue()
    path.write_bytes(data if cut is None else data[:cut])
    t = time.time() - age_s
    os.utime(path, (t, t))


def _mirror(tmp_path, node, monkeypatch) -> tuple[mirror.Mirror, RunStore]:
    monkeypatch.setattr(mirror, "QUIET_S", 0.2)
    store = RunStore(tmp_path / "runs")
    store.run_dir("r1").mkdir(parents=True)
    return mirror.Mirror(node, plan(), store, interval_s=1), store  # type: ignore[arg-type]


def test_a_snapshot_rewritten_in_place_is_taken_at_the_first_look(tmp_path, monkeypatch):
    run = tmp_path / "node"
    run.mkdir()
    _zip(run / "snapshot.pt", b"epoch 10")
    m, store = _mirror(tmp_path, _Node(run), monkeypatch)
    [h] = m.look()
    assert h.files[0][0] == "snapshot.pt" and store.artifact_path("r1", "node1", "snapshot.pt").read_bytes() == (
        run / "snapshot.pt").read_bytes()
    assert m.look() == []  # unchanged: not fetched again
    _zip(run / "snapshot.pt", b"epoch 20, longer")  # rewritten in place between two looks
    [h2] = m.look()
    assert h2.size == (run / "snapshot.pt").stat().st_size and h2.files[0][2] != h.files[0][2]
    assert [x.files for x in mirror.read_index(store, "r1")] == [h2.files]


def test_a_snapshot_being_written_is_not_taken_until_a_copy_is_consistent(tmp_path, monkeypatch):
    run = tmp_path / "node"
    run.mkdir()
    _zip(run / "snapshot.pt", b"epoch 10" * 100, age_s=0)  # modified just now: its writer may only pause
    node = _Node(run, before_fetch=lambda n: n == 2 and _zip(run / "snapshot.pt", b"epoch 10" * 100))
    m, store = _mirror(tmp_path, node, monkeypatch)
    [h] = m.look()  # the first copy was refused (too fresh), the second one taken in the same look
    assert node.fetches == 2 and h.files[0][1] == (run / "snapshot.pt").stat().st_size
    # a copy cut off while written (no zip end record), however still, is never taken; the held one stays
    _zip(run / "snapshot.pt", b"epoch 20" * 100, cut=300)
    assert m.look() == [] and node.fetches == 2 + mirror.FETCH_TRIES
    assert [x.files for x in mirror.read_index(store, "r1")] == [h.files]
    assert store.artifact_path("r1", "node1", "snapshot.pt").stat().st_size == h.files[0][1]
    assert not (store.run_dir("r1") / mirror.INCOMING).exists()


def test_the_newest_of_a_series_being_written_gives_way_to_the_next_newest_whole_one(tmp_path, monkeypatch):
    run = tmp_path / "node"
    (run / "checkpoints").mkdir(parents=True)
    _zip(run / "checkpoints" / "ckpt-3.pt", b"step 3")
    _zip(run / "checkpoints" / "ckpt-7.pt", b"step 7" * 100, cut=200)  # still being written: never whole
    _zip(run / "checkpoints" / "step-5.pt", b"step 5")
    assert [c.name for c in mirror.ranked({  # newest first within a series
        "checkpoints/ckpt-3.pt": (1, 1), "checkpoints/ckpt-7.pt": (1, 2)}, mirror.DEFAULT_GLOBS)[
        "checkpoints/ckpt-#.pt"]] == ["checkpoints/ckpt-7.pt", "checkpoints/ckpt-3.pt"]
    node = _Node(run)
    m, store = _mirror(tmp_path, node, monkeypatch)
    got = m.look()
    assert sorted(h.files[0][0] for h in got) == ["checkpoints/ckpt-3.pt", "checkpoints/step-5.pt"]
    assert store.artifact_path("r1", "node1", "checkpoints/ckpt-3.pt").read_bytes() == (
        run / "checkpoints" / "ckpt-3.pt").read_bytes()
    # the next look tries the newest again, then stops at the one it holds: nothing fetched twice
    fetches = node.fetches
    assert m.look() == [] and node.fetches == fetches + mirror.FETCH_TRIES


def test_a_snapshot_rewritten_between_the_look_and_the_fetch_is_held_as_fetched(tmp_path, monkeypatch):
    run = tmp_path / "node"
    run.mkdir()
    _zip(run / "snapshot.pt", b"short")
    node = _Node(run, before_fetch=lambda n: _zip(run / "snapshot.pt", b"a longer epoch-20 snapshot" * 50))
    m, store = _mirror(tmp_path, node, monkeypatch)
    [h] = m.look()
    local = store.artifact_path("r1", "node1", "snapshot.pt")
    # size, sha256 and time are the copy's, never the look's: seed would refuse a mismatch
    assert h.files[0][1] == local.stat().st_size == (run / "snapshot.pt").stat().st_size
    assert h.files[0][2] == collect.sha256_file(local)
    assert h.mtimes == ((run / "snapshot.pt").stat().st_mtime_ns,)


def test_a_fetch_larger_than_the_free_disk_is_refused_when_the_node_lists_it(tmp_path, monkeypatch):
    run = tmp_path / "node"
    run.mkdir()
    _zip(run / "snapshot.pt", b"small")
    said: list[str] = []
    node = _Node(run, before_fetch=lambda n: _zip(run / "snapshot.pt", b"x" * 5000))
    m, store = _mirror(tmp_path, node, monkeypatch)
    m.warn = said.append
    free = collect.os.statvfs(tmp_path)
    monkeypatch.setattr(mirror, "DISK_MARGIN", free.f_bavail * free.f_frsize - 3000)  # the look's size fits
    assert m.look() == []
    assert len(said) == 1 and "is not brought back" in said[0] and "free here" in said[0]
    assert not store.artifact_path("r1", "node1", "snapshot.pt").exists()


def test_only_files_the_job_wrote_are_listed_not_the_ones_it_was_sent(tmp_path):
    import io
    import time
    run = tmp_path / "node"
    (run / ".clusterddp" / "unpack").mkdir(parents=True)
    (run / "pretrained.pt").write_bytes(b"sent with the script")
    old = time.time() - 100
    os.utime(run / "pretrained.pt", (old, old))
    (run / ".clusterddp" / "unpack" / "done").touch()
    os.utime(run / ".clusterddp" / "unpack" / "done", (old + 10, old + 10))
    (run / "snapshot.pt").write_bytes(b"written by the job")
    req = {"globs": ["**/*.pt"], "have": {}, "list": True, "written": True}
    out = io.BytesIO()
    cwd = os.getcwd()
    try:
        collect.main([str(run), str(run / "log")], io.BytesIO(json.dumps(req).encode()), out)
    finally:
        os.chdir(cwd)
    rx = collect.Receiver(lambda rel: tmp_path / rel, request=req)
    rx.feed(out.getvalue())
    assert list(rx.listing) == ["snapshot.pt"]


def test_whole_problem_knows_a_cut_zip_and_a_cut_safetensors(tmp_path):
    _zip(tmp_path / "a.pt", b"x" * 100)
    assert mirror.whole_problem(tmp_path / "a.pt") is None
    _zip(tmp_path / "b.pt", b"x" * 100, cut=80)
    assert "without its end record" in (mirror.whole_problem(tmp_path / "b.pt") or "")
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    st = len(header).to_bytes(8, "little") + header + bytes(8)
    (tmp_path / "m.safetensors").write_bytes(st)
    assert mirror.whole_problem(tmp_path / "m.safetensors") is None
    (tmp_path / "c.safetensors").write_bytes(st[:-3])
    assert "not the" in (mirror.whole_problem(tmp_path / "c.safetensors") or "")
    (tmp_path / "plain.bin").write_bytes(b"anything")
    assert mirror.whole_problem(tmp_path / "plain.bin") is None


def test_a_seeded_checkpoint_is_not_replaced_by_the_script_folders_own_copy_when_it_is_unpacked(tmp_path):
    import subprocess
    import tarfile
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('hi')\n")
    (src / "snapshot.pt").write_bytes(b"stale, from a test run on the laptop")
    run = tmp_path / "run"
    node = replace(plan().nodes[0], run_dir=str(run), control_dir=str(run / ".clusterddp" / "n1"))
    os.makedirs(node.control_dir)
    with tarfile.open(os.path.join(node.control_dir, "source.tar.gz"), "w:gz") as t:
        for f in ("train.py", "snapshot.pt"):
            t.add(src / f, f)
    (tmp_path / "run" / "snapshot.pt").write_bytes(b"seeded by the mirror")  # a new attempt's spare, seeded
    r = subprocess.run(["bash", "-c", ssh_plan.unpack_command(node)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "snapshot.pt").read_bytes() == b"seeded by the mirror"
    assert (tmp_path / "run" / "train.py").read_text() == "print('hi')\n"


# ---- every node of a new attempt seeded alike (the real node commands, run here by bash) ----

class _Local:
    """The seam: each node's commands run here with bash; ``down`` names a host that cannot be reached."""

    def __init__(self, down: str = "") -> None:
        self.down, self.sent = down, []

    def transport(self, h: Host) -> _Local:
        if h.name == self.down:
            raise HostError(h.name, "cannot connect")
        self._host = h.name
        return self

    def run(self, command, *, timeout=None, stdin=None):
        import subprocess

        from clusterddp.transport.base import CommandResult
        data = stdin.read_bytes() if hasattr(stdin, "read_bytes") else (stdin or b"")
        if stdin is not None:
            self.sent.append(self._host)
        r = subprocess.run(["bash", "-c", command], input=data, capture_output=True, timeout=60)
        return CommandResult(r.returncode, r.stdout, r.stderr)

    def each(self, fn, hosts):
        from clusterddp.fleet import GroupResult
        out: GroupResult = GroupResult()
        for h in hosts:
            try:
                out[h.name] = fn(h, self.transport(h))
            except Exception as e:  # noqa: BLE001 - as Fleet.each: the host's failure, by name
                out[h.name] = e
        return out


def _held_snapshot(store: RunStore, data: bytes) -> None:
    import hashlib
    local = store.artifact_path("r1", "node1", "snapshot.pt")
    local.parent.mkdir(parents=True, exist_ok=True)
    local.write_bytes(data)
    held = mirror.Held("snapshot.pt", (), "node1", "2026-12-06T04:00:00+00:00",
                       (("snapshot.pt", len(data), hashlib.sha256(data).hexdigest()),), (1,))
    mirror._write_index(store, "r1", [held])


def test_every_node_of_a_new_attempt_gets_the_mirrored_snapshot_staying_or_coming_in(tmp_path):
    store = RunStore(tmp_path / "runs")
    store.run_dir("r1").mkdir(parents=True)
    _held_snapshot(store, b"epoch 70")
    base = plan().nodes[0]
    nodes = [replace(base, host=replace(base.host, name=n), run_dir=str(tmp_path / n / "run"))
             for n in ("node1", "node3", "node4")]
    (tmp_path / "node1" / "run").mkdir(parents=True)
    (tmp_path / "node1" / "run" / "snapshot.pt").write_bytes(b"epoch 70")  # rank 0's own, the same: kept
    (tmp_path / "node3" / "run").mkdir(parents=True)
    (tmp_path / "node3" / "run" / "snapshot.pt").write_bytes(b"epoch 75, newer, never mirrored")  # replaced
    fleet = _Local()                                                                      # node4: a new spare
    said, warned = mirror.seed_all(fleet, nodes, store, "r1")  # type: ignore[arg-type]
    assert warned == []
    for n in ("node1", "node3", "node4"):
        assert (tmp_path / n / "run" / "snapshot.pt").read_bytes() == b"epoch 70", n
    assert sorted(fleet.sent) == ["node3", "node4"]  # node1 had it already (same sha256): not sent again
    assert said[0].startswith("node1 seeded with the mirrored checkpoint snapshot.pt, 8 B from node1 at ")
    assert said[0].endswith("(sha256 checked there; 1 file already there)") and len(said) == 3


def test_a_node_that_cannot_be_seeded_is_a_warning_naming_it_and_a_damaged_mirror_seeds_none(tmp_path):
    store = RunStore(tmp_path / "runs")
    store.run_dir("r1").mkdir(parents=True)
    base = plan().nodes[0]
    nodes = [replace(base, host=replace(base.host, name=n), run_dir=str(tmp_path / n / "run")) for n in ("a", "b")]
    assert mirror.seed_all(_Local(), nodes, store, "r1") == ([], [])  # nothing mirrored: nothing to do
    _held_snapshot(store, b"epoch 70")
    said, warned = mirror.seed_all(_Local(down="b"), nodes, store, "r1")  # type: ignore[arg-type]
    assert [s.split()[0] for s in said] == ["a"]
    assert warned == ["mirror: the newest checkpoint was not sent to b: b: cannot connect; that host starts from "
                      "what it holds"]
    store.artifact_path("r1", "node1", "snapshot.pt").write_bytes(b"epoch 71")  # no longer its sha256
    said, warned = mirror.seed_all(_Local(), [replace(nodes[0], run_dir=str(tmp_path / "c"))], store, "r1")  # type: ignore[arg-type]
    assert said == [] and "no longer has the sha256 it was brought back with" in warned[0]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=400), st.sampled_from(["x.pt", "x.safetensors", "x.bin"]))
def test_whole_problem_never_raises_on_any_bytes(data, name):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / name
        p.write_bytes(data)
        assert mirror.whole_problem(p) is None or isinstance(mirror.whole_problem(p), str)
    p2 = b"PK\x03\x04" + data
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "y.pt").write_bytes(p2)
        mirror.whole_problem(Path(d) / "y.pt")


def test_the_mirrors_own_loop_says_a_failure_once_and_only_when_it_comes_twice_in_a_row(tmp_path):
    """Through the real loop (start/stop), not a copy of it: a problem one look has and the next does
    not is never said; one that keeps coming is said once, however many looks it lasts."""
    said: list[str] = []
    hiccup = HostError("node1", "no data for 60s")  # twice, but never twice in a row: a look between went well
    fleet = _Fleet([hiccup, listing(), hiccup, listing(), *[HostError("node1", "cannot connect")] * 6])
    store = RunStore(tmp_path)
    store.run_dir("r1").mkdir(parents=True)
    m = mirror.Mirror(fleet, plan(), store, warn=said.append, interval_s=0.01)  # type: ignore[arg-type]
    m.start()
    try:
        assert eventually(lambda: len(fleet.asked) >= 10, timeout=60), fleet.asked
    finally:
        m.stop()
    assert not any("no data for 60s" in s for s in said), said
    assert sum("cannot connect" in s for s in said) == 1, said
    assert len(said) == len(set(said)), said  # the same line never twice


def test_the_mirrors_first_look_at_a_folder_checkpoint_only_lists_it(tmp_path):
    """A checkpoint of several files is taken only once two looks in a row list it alike: the first look
    of a run (no look before it) lists, and fetches nothing, whatever the listing holds."""
    folder = listing(("ckpt/step-9/a.pt", 5, 1), ("ckpt/step-9/b.pt", 5, 1))
    fleet = _Fleet([folder, folder])
    store = RunStore(tmp_path)
    store.run_dir("r1").mkdir(parents=True)
    p = replace(plan(), spec=RunSpec("t.py", checkpoints=("ckpt/step-*/*",)))
    m = mirror.Mirror(fleet, p, store, interval_s=1)  # type: ignore[arg-type]
    assert m.look() == [] and [sorted(a) for a in fleet.asked] == [["globs", "have", "list", "written"]]
    with pytest.raises(HostError):  # the second look, listing it alike, asks for its files (answered: cut off)
        m.look()
    assert fleet.asked[-1]["paths"] == ["ckpt/step-9/a.pt", "ckpt/step-9/b.pt"], fleet.asked


def test_the_step_comes_from_the_first_numbered_part_after_the_globs_literal_folders():
    """The rule as the module states it, at the cases mutation testing found unpinned (scripts/mutate.sh):
    a glob's literal folders are skipped (their numbers are no step), the first numbered part after them
    makes the step, a folder checkpoint's series ends in ``/*``, and a literal glob of a numbered file
    still makes a series of it."""
    assert mirror.series_of("run/exp2/step-8.pt", ["run/exp2/step-*.pt"]) == (
        "run/exp2/step-#.pt", (8,), "run/exp2/step-8.pt")
    assert mirror.series_of("exp3/step-8.pt", ["**/*.pt"]) == ("exp#/*", (3,), "exp3")  # the folder: checkpoint-500/
    assert mirror.series_of("ckpt/step-9/a.pt", ["ckpt/step-*/*"]) == ("ckpt/step-#/*", (9,), "ckpt/step-9")
    assert mirror.series_of("ckpt/step-8.pt", ["ckpt/step-8.pt"]) == ("ckpt/step-#.pt", (8,), "ckpt/step-8.pt")
    assert mirror.series_of("ckpt/last.pt", ["ckpt/last.pt"]) == ("ckpt/last.pt", (), "ckpt/last.pt")
    assert mirror.series_of("other/x.pt", ["ckpt/*.pt"]) is None


@pytest.mark.parametrize("given, value", [("1", 1.0), ("3600", 3600.0), ("0.99", None), ("3600.5", None),
                                          ("-1", None), ("ten", None), ("nan", None)])
def test_the_interval_is_0_or_1_to_3600_seconds_both_ends_taken(given, value):
    got, problem = mirror.interval_from({"CLUSTERDDP_MIRROR_INTERVAL": given})
    want = (value, True) if value is not None else (mirror.INTERVAL_S, False)
    assert (got, problem is None) == want, (got, problem)
