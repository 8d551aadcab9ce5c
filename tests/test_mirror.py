"""The checkpoint mirror's pure parts (clusterddp.mirror): which listed files make the newest complete
checkpoint of each series, mirror.json read back as untrusted, the interval knob, the line a detached
run says; and its failures, one warning line each, never the run's (a fake transport at the seam)."""

from __future__ import annotations

import json
import threading
from dataclasses import replace

import pytest

from clusterddp import mirror
from clusterddp import plan as P
from clusterddp.errors import HostError, MirrorError
from clusterddp.inventory import Host
from clusterddp.node import collect
from clusterddp.plan import LaunchPlan, NodeLaunch, RunSpec
from clusterddp.store import RunStore

G = mirror.DEFAULT_GLOBS


def newest(listing: dict, globs=G, before=None) -> list[str]:
    return [c.name for c in mirror.choose(listing, globs, before)]


def test_the_highest_step_of_each_series_is_the_newest():
    listing = {"checkpoints/step-8.pt": (10, 1), "checkpoints/step-12.pt": (10, 2), "checkpoints/step-4.pt": (10, 3),
               "checkpoints/best-3.pt": (5, 1), "checkpoints/best-11.pt": (5, 0), "checkpoints/latest.pt": (7, 9),
               "checkpoints/.step-13.123.ab.tmp": (3, 9),  # save_checkpoint's temp file: hidden, never taken
               "elsewhere/step-99.pt": (1, 1)}  # not under the globs
    assert newest(listing) == ["checkpoints/best-11.pt", "checkpoints/latest.pt", "checkpoints/step-12.pt"]


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


def test_complete_means_listed_alike_twice_and_a_newer_one_being_written_waits():
    before = {"checkpoints/step-4.pt": (10, 1), "checkpoints/step-8.pt": (3, 2), "checkpoints/s-9/a.pt": (1, 1)}
    now = {"checkpoints/step-4.pt": (10, 1), "checkpoints/step-8.pt": (6, 3),  # growing: step-4 is the newest whole
           "checkpoints/s-9/a.pt": (1, 1), "checkpoints/s-9/b.pt": (1, 1)}  # a folder still filling up
    assert newest(now, before=before) == ["checkpoints/step-4.pt"]
    assert newest(now, before=now) == ["checkpoints/s-9/", "checkpoints/step-8.pt"]
    assert newest(now, before={}) == []


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
        "only, and lost with it (an attached `up` mirrors them: docs/failures.md, \"When a machine dies\")")


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
    assert fleet.asked[1] == {"globs": ["checkpoints/**"], "have": {}, "list": True}


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
    r = subprocess.run(["bash", "-c", P.seed_command(node, "checkpoints/step-8.pt", bad)], input=data,
                       capture_output=True)
    assert r.returncode == P.SEED_MISMATCH and b"not the mirror's" in r.stderr
    assert list((tmp_path / "run 1" / "checkpoints").iterdir()) == []  # no temp file, no checkpoint
    r = subprocess.run(["bash", "-c", P.seed_command(node, "checkpoints/step-8.pt", good)], input=data)
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
