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
                           "uv": {"wheel": ["c" * 64, "uv-1-py3-none-any.whl"]}, "expect": [], "imports": []})
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
                           "uv": {"wheel": [sha256(uv), uv.name]}, "expect": [], "imports": []})
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
        {"root": str(root), "id": ID, "wheels": [], "uv": {"wheel": ["c" * 64, "uv-1-py3-none-any.whl"]}, "expect": [],
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


# ---- wheels: index, a uv the node has already, the wheel store pruned ----

def _fake_uv(folder: Path, version: str = wheels_module.UV_VERSION) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    uv = folder / "uv"
    uv.write_text(f"#!/bin/sh\necho 'uv {version} (fake)'\n")
    uv.chmod(0o755)
    return uv


def test_a_look_with_the_lock_gives_the_launchers_id_and_a_uv_of_our_version_the_node_has(tmp_path, capsys,
                                                                                           monkeypatch):
    root = tmp_path / "envs"
    monkeypatch.setenv("PATH", f"{_fake_uv(tmp_path / 'old', '0.1.0').parent}:{_fake_uv(tmp_path / 'bin').parent}")
    envbuild.look({"root": str(root), "lock": "d" * 64, "uv": wheels_module.UV_VERSION})
    got = answer(capsys)
    assert got["id"] == env_nodes.env_id("d" * 64, got)  # the node's id is the launcher's
    assert got["uv"] == str(tmp_path / "bin" / "uv")       # not the one of another version, first on PATH
    stored = _fake_uv(root / ".uv" / ("e" * 64))           # one unpacked in the store comes first
    envbuild.look({"root": str(root), "lock": "d" * 64, "uv": wheels_module.UV_VERSION})
    assert answer(capsys)["uv"] == str(stored)
    (root / got["id"]).mkdir()
    (root / got["id"] / envbuild.COMPLETE).write_text("{}")
    envbuild.look({"root": str(root), "lock": "d" * 64, "uv": wheels_module.UV_VERSION})
    assert "uv" not in answer(capsys)  # its environment is ready: no uv is looked for


def _served(tmp_path, files: dict[str, bytes]):
    """``files`` served over HTTP on 127.0.0.1; each request's path and Authorization header recorded."""
    import http.server
    import threading
    seen: list[tuple[str, str | None]] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - the http.server API
            seen.append((self.path, self.headers.get("Authorization")))
            body = files.get(self.path)
            self.send_response(200 if body is not None else 404)
            self.end_headers()
            if body is not None:
                self.wfile.write(body)

        def log_message(self, *a):
            pass
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def _uv_wheel(tmp_path: Path) -> bytes:
    import zipfile
    out = tmp_path / "uvwheel.whl"
    with zipfile.ZipFile(out, "w") as z:
        v = wheels_module.UV_VERSION
        z.writestr(f"uv-{v}.data/scripts/uv", f"#!/bin/sh\necho 'uv {v}'\n")
    return out.read_bytes()


@pytest.mark.parametrize("damaged", [False, True])
def test_a_node_without_uv_takes_it_from_its_index_checked_and_the_credentials_go_only_to_the_index(
        tmp_path, damaged):
    import base64
    import hashlib
    data = _uv_wheel(tmp_path)
    sha = hashlib.sha256(b"other" if damaged else data).hexdigest()
    v = wheels_module.UV_VERSION
    name = f"uv-{v}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    page = (f'<a href="../../files/uv-{v}-py3-none-macosx_11_0_arm64.whl#sha256={"1" * 64}">mac</a>'
            f'<a href="../../files/{name}#sha256={sha}">{name}</a>').encode()
    server, seen = _served(tmp_path, {"/simple/uv/": page, f"/files/{name}": data})
    try:
        url = f"http://someone:s%40cret@127.0.0.1:{server.server_address[1]}/simple"
        root = tmp_path / "envs"
        if damaged:
            with pytest.raises(ValueError, match="does not match its sha256"):
                envbuild.uv_from_index(str(root), url, v, wheels_module.platforms("manylinux_2_36_x86_64"))
            assert envbuild.store_wheels(str(root)) == {}
            return
        got = envbuild.uv_from_index(str(root), url, v, wheels_module.platforms("manylinux_2_36_x86_64"))
    finally:
        server.shutdown()
    assert got == (sha, name) and envbuild.store_wheels(str(root)) == {sha: name}
    auth = "Basic " + base64.b64encode(b"someone:s@cret").decode()
    assert seen == [("/simple/uv/", auth), (f"/files/{name}", auth)]
    assert envbuild.uv_version(envbuild.uv_binary(str(root), sha, name)) == v


def test_what_uv_says_of_the_index_never_holds_its_credentials():
    url = "https://me:t%2Fk3n@pypi.example.org/simple"
    said = envbuild.scrub(f"failed to fetch {url}/torch/ as me:t%2Fk3n (t/k3n) from me:t%2Fk3n@pypi.example.org", url)
    assert "k3n" not in said and "pypi.example.org" not in said.split("****")[-1], said
    assert envbuild.scrub("plain words", "https://pypi.example.org/simple") == "plain words"


def _index_plan(tmp_path, uv_path: str | None = None) -> env_nodes.Plan:
    from dataclasses import replace
    host = replace(local().hosts[0], wheels="index", index_url="https://me:s3cret@pypi.example.org/simple")
    lk = parse(b"cddptiny==1.0\nfoo==2.0 ; sys_platform == 'win32'\n", "req.txt")
    return env_nodes.Plan(host, lk, ID, "/x/envs", "/x/envs/id/bin/python", False, uv_path=uv_path,
                          platforms=("manylinux_2_17_x86_64",))


def test_a_build_from_the_nodes_index_gets_its_url_on_stdin_never_on_its_command_line(tmp_path):
    plan = _index_plan(tmp_path)
    args = env_nodes.build_request(plan)
    command = env_nodes._command(plan.host, "build", args)
    assert "s3cret" not in command and "pypi.example.org" not in command
    assert args["uv"] == {"index": ["manylinux_2_17_x86_64"]} and args["wheels"] == [] and args["index"]
    assert args["expect"] == [["cddptiny", "1.0"]] and args["maybe"] == [["foo", "2.0"]]  # a marker's: if installed
    [stdin] = env_nodes.build_stdin(plan)
    assert json.loads(stdin)["index_url"] == plan.host.index_url
    assert "s3cret" not in repr(plan.host)
    assert env_nodes.build_request(_index_plan(tmp_path, "/opt/uv/uv"))["uv"] == {"path": "/opt/uv/uv"}
    assert plan.says() == f"environment {ID} will be built from the node's index (0 B of wheels to send)"


def test_a_build_from_the_index_refuses_a_malformed_stdin(tmp_path, capsys):
    code = envbuild.build({"root": str(tmp_path), "id": ID, "index": True, "wheels": [], "uv": {"index": []},
                           "expect": [], "imports": []}, io.BytesIO(b"not json"))
    assert code == 2 and answer(capsys)["error"] == "a malformed stdin (JSONDecodeError)"


def test_a_push_to_a_node_that_has_our_uv_sends_no_uv_wheel(tmp_path):
    cache = tmp_path / "cache"
    w = make_wheel(tmp_path / "src")
    uvw = make_wheel(tmp_path / "src", name="uv", version=wheels_module.UV_VERSION)
    lk = parse(b"cddptiny==1.0\n", "req.txt")
    target = wheels_module.Target("3.11", "cp311", "manylinux_2_36_x86_64")
    for x, index in ((w, f"{lk.sha256}-{target.key}.json"),
                     (uvw, f"uv-{wheels_module.UV_VERSION}-{target.platform}.json")):
        (cache / "wheels" / sha256(x)).mkdir(parents=True)
        (cache / "wheels" / sha256(x) / x.name).write_bytes(x.read_bytes())
        (cache / "locks").mkdir(exist_ok=True)
        (cache / "locks" / index).write_text(json.dumps([[sha256(x), x.name, x.stat().st_size]]))
    host = local().hosts[0]
    facts = {"python": "3.11.2", "impl": "cpython", "tag": "cp311", "exe": "/usr/bin/python3.11",
             "platform": target.platform, "root": "/x/envs", "envs": [], "wheels": []}
    plans = env_nodes.plans_of([host], {host.name: facts}, {host.name: lk}, cache)
    assert [x.name for x in plans[host.name].missing] == [w.name, uvw.name]  # no uv there: ours is sent
    plans = env_nodes.plans_of([host], {host.name: {**facts, "uv": "/usr/local/bin/uv"}}, {host.name: lk}, cache)
    p = plans[host.name]
    assert [x.name for x in p.missing] == [w.name] and p.uv is None
    assert env_nodes.build_request(p)["uv"] == {"path": "/usr/local/bin/uv"}


def _built(root: Path, env: str, wheels: list[str] | None) -> None:
    (root / env).mkdir(parents=True)
    (root / env / envbuild.COMPLETE).write_text(json.dumps({"id": env} | ({} if wheels is None else
                                                                          {"wheels": wheels})))


def _stored(root: Path, sha: str, name: str) -> None:
    (root / "wheels" / sha).mkdir(parents=True)
    (root / "wheels" / sha / name).write_bytes(b"x" * 10)


def test_prune_removes_the_wheels_no_environment_left_was_built_from(tmp_path, capsys):
    import fcntl
    root = tmp_path / "envs"
    kept, gone = "a" * 24, "b" * 24
    _built(root, kept, ["1" * 64])
    _built(root, gone, ["2" * 64])
    _stored(root, "1" * 64, "keep-1-py3-none-any.whl")
    _stored(root, "2" * 64, "gone-1-py3-none-any.whl")
    _stored(root, "3" * 64, f"uv-{wheels_module.UV_VERSION}-py3-none-any.whl")
    _stored(root, "4" * 64, "now-1-py3-none-any.whl")
    (root / "wheels" / ".tmp-999-abc").write_bytes(b"cut short")
    args = {"root": str(root), "keep": [kept], "store": True, "uv_version": wheels_module.UV_VERSION,
            "keep_wheels": ["4" * 64]}
    fd = envbuild.store_lock(str(root), fcntl.LOCK_SH)  # a build runs: the store is left whole
    try:
        envbuild.prune({**args, "dry": True})
        assert answer(capsys)["store"] == {"busy": True, "removed": []}
    finally:
        os.close(fd)
    envbuild.prune({**args, "dry": True})
    assert answer(capsys)["store"] == {"removed": [["gone-1-py3-none-any.whl", 10]]}
    assert len(envbuild.store_wheels(str(root))) == 4
    envbuild.prune(args)
    got = answer(capsys)
    assert got["removed"] == [[gone, len(json.dumps({"id": gone, "wheels": ["2" * 64]}))]]
    assert got["store"] == {"removed": [["gone-1-py3-none-any.whl", 10]]}
    assert sorted(envbuild.store_wheels(str(root))) == ["1" * 64, "3" * 64, "4" * 64]
    assert sorted(os.listdir(root / "wheels")) == ["1" * 64, "3" * 64, "4" * 64]  # the cut receive's file too
    _built(root, "c" * 24, None)  # built by an older clusterddp: its wheels unknown, the store is kept whole
    envbuild.prune({**args, "keep": [kept, "c" * 24], "keep_wheels": []})
    assert answer(capsys)["store"] == {"unknown": "c" * 24, "removed": []}
    assert len(envbuild.store_wheels(str(root))) == 3


def test_the_probe_looks_at_the_environment_first_in_the_same_command_and_runs_with_its_python_once_ready(
        tmp_path):
    """`check` and `up`'s preflight with `packages:`: one command per host, which says what the node holds and
    then probes the environment's python when it is complete (else the base python)."""
    import subprocess
    import sys
    from dataclasses import replace

    from clusterddp.check import probe_command
    from clusterddp.node.probe import parse_reply
    host = replace(local().hosts[0], transport="ssh", python=sys.executable, workdir=str(tmp_path))
    lk = parse(b"cddptiny==1.0\n", "req.txt")

    def probed() -> tuple[dict, dict]:
        cmd = probe_command(host, "127.0.0.1", None, full=False, env_look=env_nodes.look_args(host, lk))
        r = subprocess.run(["bash", "-c", cmd.text], input=cmd.stdin, capture_output=True, timeout=60)
        return env_nodes.looked(host.name, r.stdout), parse_reply(r.stdout, r.stderr, r.returncode)
    facts, probe = probed()
    eid = env_nodes.env_id(lk.sha256, facts)
    assert facts["envs"] == [] and facts["id"] == eid and probe["executable"] == sys.executable
    python = tmp_path / "envs" / eid / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.symlink_to(sys.executable)
    (tmp_path / "envs" / eid / envbuild.COMPLETE).write_text("{}")
    facts, probe = probed()
    assert facts["envs"] == [eid] and probe["executable"] == str(python)
