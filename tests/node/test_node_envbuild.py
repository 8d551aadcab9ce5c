"""The node program envbuild in-process: the wheel store takes only what its sha256 says, a build cut short
is never listed as an environment and is removed by the next build, a full disk is answered with the bytes
needed; and the launcher's push sends a damaged wheel once more, then names the host."""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

from clusterddp.envs import nodes as env_nodes
from clusterddp.envs import wheels as wheels_module
from clusterddp.envs.lock import parse
from clusterddp.errors import HostError
from clusterddp.inventory.loader import local
from clusterddp.node import envbuild
from helpers import eventually
from tinywheel import make_wheel, sha256

ID = "0123456789abcdef01234567"


def answer(capsys) -> dict:
    out = capsys.readouterr().out
    return json.loads(out.split(envbuild.MARK)[-1])


def stream(*items: tuple[str, bytes, str]) -> io.BytesIO:
    return io.BytesIO(b"".join(f"{sha} {len(data)} {name}\n".encode() + data for sha, data, name in items))


def test_the_store_takes_a_wheel_whose_sha256_matches_and_refuses_a_damaged_one(tmp_path, capsys):
    w = make_wheel(tmp_path / "src")
    data = w.read_bytes()
    good, bad = sha256(w), "f" * 64
    code = envbuild.receive({"root": str(tmp_path / "envs")},
                            stream((good, data, w.name), (bad, data, "x-1-py3-none-any.whl")))
    assert code == 0 and answer(capsys) == {"ok": [good], "bad": [bad]}
    assert (tmp_path / "envs" / "wheels" / good / w.name).read_bytes() == data
    assert sorted(os.listdir(tmp_path / "envs" / "wheels")) == [good]  # nothing of the damaged one is left
    assert envbuild.store_wheels(str(tmp_path / "envs")) == {good: w.name}


@pytest.mark.parametrize("head", [b"nope\n", b"../../etc 3 x.whl\n", ("a" * 64 + " 3 ../x.whl\n").encode(),
                                  ("a" * 64 + " 3 x.tar.gz\n").encode()])
def test_a_malformed_header_stops_the_receiver(tmp_path, capsys, head):
    assert envbuild.receive({"root": str(tmp_path)}, io.BytesIO(head + b"abc")) == 2
    assert answer(capsys)["error"] == "a malformed wheel header"
    assert envbuild.store_wheels(str(tmp_path)) == {}


def test_a_stream_cut_inside_a_wheel_keeps_nothing_of_it(tmp_path, capsys):
    head = ("a" * 64 + " 1000 x-1-py3-none-any.whl\n").encode()
    assert envbuild.receive({"root": str(tmp_path)}, io.BytesIO(head + b"only part")) == 2
    assert answer(capsys)["error"] == "the stream ended inside x-1-py3-none-any.whl"
    assert os.listdir(tmp_path / "wheels") == []


def test_only_a_complete_environment_is_listed_and_the_next_build_removes_what_a_cut_build_left(tmp_path, capsys):
    root = tmp_path / "envs"
    (root / f".tmp-{ID}-4242" / "lib").mkdir(parents=True)   # a build killed mid-way
    (root / ID[::-1] / "bin").mkdir(parents=True)             # a folder of an id, but never completed
    done = root / ("a" * 24)
    done.mkdir()
    (done / envbuild.COMPLETE).write_text("{}")
    envbuild.look({"root": str(root)})
    got = answer(capsys)
    assert got["envs"] == ["a" * 24] and got["root"] == str(root)
    assert got["python"].count(".") == 2 and got["platform"]
    code = envbuild.build({"root": str(root), "id": ID, "wheels": [["b" * 64, "x-1-py3-none-any.whl"]],
                           "uv": ["c" * 64, "uv-1-py3-none-any.whl"], "expect": [], "imports": []})
    assert code == 1 and "the wheel store lacks x-1-py3-none-any.whl" in answer(capsys)["error"]
    assert not (root / f".tmp-{ID}-4242").exists() and done.exists()


def test_a_node_without_room_answers_with_the_bytes_needed(tmp_path, capsys, monkeypatch):
    root = tmp_path / "envs"
    w = make_wheel(tmp_path / "src")
    uv = make_wheel(tmp_path / "src", name="uvfake")
    for x in (w, uv):
        (root / "wheels" / sha256(x)).mkdir(parents=True)
        (root / "wheels" / sha256(x) / x.name).write_bytes(x.read_bytes())
    monkeypatch.setattr(envbuild, "free_bytes", lambda path: 1000)
    code = envbuild.build({"root": str(root), "id": ID, "wheels": [[sha256(w), w.name]],
                           "uv": [sha256(uv), uv.name], "expect": [], "imports": []})
    got = answer(capsys)
    assert code == 3 and got["error"] == "disk" and got["free"] == 1000 and got["needed"] > (64 << 20)
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())


@dataclass
class Res:
    exit_code: int
    stdout: bytes
    stderr: bytes = b""


class FakeFleet:
    """The launcher's side of a push, with a node whose receiver answers from ``answers`` in turn."""

    def __init__(self, answers: list[dict]) -> None:
        self.answers, self.sent = answers, []

    def transport(self, host):
        return self

    def run(self, command, timeout=None, stdin=None):
        self.sent.append([Path(p).name for p in stdin if isinstance(p, Path)])
        return Res(0, (envbuild.MARK + json.dumps(self.answers.pop(0)) + "\n").encode())


def _plan(tmp_path) -> tuple[env_nodes.Plan, Path]:
    cache = tmp_path / "cache"
    w = make_wheel(tmp_path / "src")
    wheel = wheels_module.Wheel(sha256(w), w.name, w.stat().st_size)
    wheel.path(cache).parent.mkdir(parents=True)
    wheel.path(cache).write_bytes(w.read_bytes())
    host = local().hosts[0]
    lk = parse(b"cddptiny==1.0\n", "req.txt")
    return env_nodes.Plan(host, lk, ID, "/x/envs", "/x/envs/id/bin/python", False, (wheel,), (wheel,), wheel), cache


def test_a_wheel_that_arrives_damaged_is_sent_once_more(tmp_path):
    plan, cache = _plan(tmp_path)
    sha = plan.missing[0].sha256
    fleet = FakeFleet([{"ok": [], "bad": [sha]}, {"ok": [sha], "bad": []}])
    assert env_nodes.push(fleet, plan, cache) == 2 * plan.missing[0].size  # type: ignore[arg-type]
    assert fleet.sent == [[plan.missing[0].name]] * 2


def test_a_wheel_damaged_twice_names_the_host(tmp_path):
    plan, cache = _plan(tmp_path)
    sha = plan.missing[0].sha256
    fleet = FakeFleet([{"ok": [], "bad": [sha]}, {"ok": [], "bad": [sha]}])
    with pytest.raises(HostError, match=r"local: cddptiny-1.0-py3-none-any.whl arrived damaged twice"):
        env_nodes.push(fleet, plan, cache)  # type: ignore[arg-type]


class NoStdin(FakeFleet):
    def run(self, command, timeout=None, stdin=None):
        return Res(0, (envbuild.MARK + json.dumps(self.answers.pop(0)) + "\n").encode())


@pytest.mark.parametrize("state, then", [("ready", "found it ready"), ("built", "built it")])
def test_a_build_that_waited_for_another_run_says_so(tmp_path, state, then):
    plan, _ = _plan(tmp_path)
    said: list[str] = []
    env_nodes.build(NoStdin([{"state": state, "waited": 12.5}]), plan, said.append)  # type: ignore[arg-type]
    assert said == [f"local: waited 12.5 s for another run building environment {ID}, then {then}"]
    env_nodes.build(NoStdin([{"state": state, "waited": None}]), plan, said.append)  # type: ignore[arg-type]
    assert len(said) == 1  # it did not wait: nothing said


def test_a_full_disk_while_receiving_is_that_hosts_error_with_the_bytes(tmp_path):
    plan, cache = _plan(tmp_path)
    fleet = FakeFleet([{"ok": [], "bad": [], "error": "cannot store x: No space left on device",
                        "needed": 5 << 20, "free": 1 << 20}])
    with pytest.raises(HostError, match=r"local: wheels not stored: .*No space.* \(5.0 MiB needed, 1.0 MiB free\)"):
        env_nodes.push(fleet, plan, cache)  # type: ignore[arg-type]


def test_a_second_build_of_one_id_waits_for_the_first_and_then_takes_what_it_built(tmp_path, capsys):
    import fcntl
    import threading
    root = tmp_path / "envs"
    (root / ".locks").mkdir(parents=True)
    fd = os.open(root / ".locks" / ID, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # the first build, still going
    got: list[int] = []
    second = threading.Thread(target=lambda: got.append(envbuild.build(
        {"root": str(root), "id": ID, "wheels": [], "uv": ["c" * 64, "uv-1-py3-none-any.whl"], "expect": [],
         "imports": []})))
    second.start()
    assert eventually(lambda: "another run builds this environment: waiting" in capsys.readouterr().err)
    assert second.is_alive() and not got
    (root / ID).mkdir()  # the first build's rename, then its lock let go
    (root / ID / envbuild.COMPLETE).write_text("{}")
    fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)
    second.join(timeout=30)
    assert got == [0]
    said = answer(capsys)
    assert said["state"] == "ready" and isinstance(said["waited"], float)  # the launcher says it waited
