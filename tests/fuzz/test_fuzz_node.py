"""Property-based: what a node sends, generated and mutated, thrown at the real parsers.

Collect answers start as real ones (the node program run in-process on a small run folder),
then get bytes flipped, cut, repeated, or header lines with wrong types, negative or huge
sizes, bad paths and extra entries put in; probe replies start as the real probe's and get
facts replaced by any JSON value. Whatever comes, the receiver and ``parse_reply`` (then
``check.evaluate`` and the CLI's report) raise nothing but their per-host error, in bounded
time and memory, and the receiver writes only below its destination. Derandomized in CI: every
run tries the same cases; scripts/fuzz.sh runs the campaign (tests/fuzz/fuzzing.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from clusterddp.node import collect, probe
from clusterddp.node.collect import Receiver, StreamError
from fuzzing import DEEP_JSON, INVALID_UTF8, case, fuzz

MEMORY = 16 << 20     # bytes allocated at the peak of one case; the streams are a few KiB

FILES = {"ckpt/a.bin": bytes(range(256)) * 9, "ckpt/deep/b.txt": b'{"json": "lookalike"}\n' * 20,
         "ckpt/empty": b"", "train.log": b"step 1\n"}
SAMPLES = {".clusterddp/metrics.jsonl": b'{"t": 2}\n' * 30, ".clusterddp@attempt-2/metrics.jsonl": b'{"t": 1}\n' * 7,
           ".clusterddp/where.jsonl": b'{"w": 1}\n' * 11}


@pytest.fixture(scope="module")
def answers(tmp_path_factory) -> list[bytes]:
    """Real answers of the node program: everything sent; only hashes (local copies of the
    right size); a second request by paths."""
    d = tmp_path_factory.mktemp("node")
    (d / ".clusterddp").mkdir()
    (d / ".clusterddp" / "node.log").write_bytes(b"rank 0 says hi\n\x1b[2J\n")
    for p, body in FILES.items():
        (d / p).parent.mkdir(parents=True, exist_ok=True)
        (d / p).write_bytes(body)
    (d / "ckpt" / "link").symlink_to(d / "ckpt" / "a.bin")
    for rel, body in SAMPLES.items():  # the samplers' files: this attempt's, an earlier one's, where.jsonl
        (d / rel).parent.mkdir(exist_ok=True)
        (d / rel).write_bytes(body)
    sizes = {p: len(b) for p, b in FILES.items()}
    out = []
    for req in ({"log": True, "globs": ["ckpt/**", "*.log"], "have": {}},
                {"log": False, "globs": ["**"], "have": sizes},
                {"paths": ["ckpt/deep/b.txt", "train.log"], "have": {}},
                {"log": True, "globs": ["*.log"], "have": {}, "samples": ["."]}):
        buf, here = io.BytesIO(), os.getcwd()
        try:
            assert collect.main([str(d), str(d / ".clusterddp" / "node.log")], stdin=io.StringIO(json.dumps(req)),
                                stdout=buf) == 0
        finally:
            os.chdir(here)
        out.append(buf.getvalue())
    return out


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=10)
paths = st.sampled_from(["ckpt/a.bin", "ckpt/deep/b.txt", "train.log", "ckpt/empty", "x", "../x", "/etc/passwd",
                         ".clusterddp/launch.sh", "a//b", "./a", "a\x00b", "\ud800", "", "ckpt/link",
                         "ckpt/../../x", "x" * 5000]) | st.text(max_size=20)
sizes = st.sampled_from([0, 1, 3, 256, -1, -(1 << 40), 1 << 50, (1 << 50) + 1, 1 << 62, True, 2.0, "3"]) \
    | st.integers(min_value=-10, max_value=5000)
headers = st.one_of(
    st.builds(lambda n: {"log": n}, sizes),
    st.builds(lambda p, n: {"file": p, "size": n}, paths, sizes),
    st.builds(lambda n: {"files": n}, sizes),
    st.builds(lambda p, n: {"path": p, "send": n}, paths, sizes),
    st.builds(lambda p, h, s: {"path": p, "sha256": h, "stable": s}, paths,
              st.sampled_from([hashlib.sha256(b"").hexdigest(), "0" * 64, "A" * 64, "xyz", ""]) | st.text(max_size=70),
              st.booleans() | json_values),
    st.builds(lambda p, e: {"path": p, "error": e}, paths, json_values),
    st.builds(lambda e: {"error": e}, json_values),
    st.just({"tick": 1}),
    st.builds(lambda f, a, n: {"samples": f, "attempt": a, "size": n}, st.sampled_from([".", "..", "x"]) | paths,
              st.none() | sizes, sizes),
    st.builds(lambda f, n: {"where": f, "size": n}, st.sampled_from([".", "/"]) | paths, sizes),
    st.dictionaries(st.sampled_from(["log", "file", "size", "files", "path", "send", "sha256", "stable", "error",
                                     "tick", "samples", "attempt", "where", "extra"]), json_values, max_size=4),
)
header_lines = headers.map(lambda h: json.dumps(h).encode() + b"\n") | st.sampled_from(
    [b"[1]\n", b"{not json\n", b'{"tick": NaN}\n', b"\xff\xfe\n", b"[" * 3000 + b"\n", b"{}\n", b"\n", b"x" * 70000,
     *(d.encode() + b"\n" for d in DEEP_JSON), *(b'{"log": 1}' + b + b"\n" for b in INVALID_UTF8)])


def mutate(data: bytes, draw) -> bytes:
    """One mutation of an answer: a byte flipped, cut, a range dropped or repeated, bytes or a
    header line put in, a header line replaced, a value of a header line changed, or a file
    renamed in every header that names it (the framing kept: a bad path that looks consistent)."""
    kind = draw(st.sampled_from(["flip", "cut", "drop", "repeat", "insert", "header", "replace", "retype",
                                 "rename"]))
    n = len(data)
    if kind == "rename":
        old = json.dumps(draw(st.sampled_from(sorted(FILES)))).encode()
        return data.replace(old, json.dumps(draw(paths)).encode())
    i = draw(st.integers(0, max(0, n - 1)))
    if kind == "flip" and n:
        return data[:i] + bytes([data[i] ^ draw(st.integers(1, 255))]) + data[i + 1:]
    if kind == "cut":
        return data[:i]
    j = draw(st.integers(i, min(n, i + 2000)))
    if kind == "drop":
        return data[:i] + data[j:]
    if kind == "repeat":
        return data[:j] + data[i:j] + data[j:]
    if kind == "insert":
        return data[:i] + draw(st.binary(max_size=40)) + data[i:]
    starts = [0] + [k + 1 for k in range(n) if data[k] == 10]  # line starts (some inside payloads: fine)
    at = draw(st.sampled_from(starts))
    end = data.find(b"\n", at)
    end = n if end < 0 else end + 1
    if kind == "retype":  # one value of a header line: a wrong type, a negative or huge size, a bad path
        try:
            rec = json.loads(data[at:end])
        except ValueError:
            rec = None
        if isinstance(rec, dict) and rec:
            key = draw(st.sampled_from(sorted(rec)))
            rec[key] = draw(paths if key in ("path", "file", "samples", "where")
                            else sizes if key in ("log", "size", "files", "send", "attempt") else json_values)
            return data[:at] + json.dumps(rec).encode() + b"\n" + data[end:]
    line = draw(header_lines)
    if kind == "header":
        return data[:at] + line + data[at:]
    return data[:at] + line + data[end:]


@contextlib.contextmanager
def bounded():
    """Fail the case if it allocates more than MEMORY at its peak (fuzzing.case bounds its time)."""
    tracemalloc.start()  # only around the case: tracing hypothesis's own work would triple the time
    try:
        yield
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < MEMORY, f"allocated {peak} bytes at the peak"


@pytest.fixture(scope="module")
def scratch():
    d = Path(tempfile.mkdtemp(prefix="fuzz-collect-"))
    yield d
    shutil.rmtree(d)


@fuzz(30)
@given(data=st.data())
def test_any_collect_answer_gives_files_or_a_stream_error_only(answers, scratch, data):
    base = data.draw(st.sampled_from(range(len(answers))))
    stream = answers[base]
    for _ in range(data.draw(st.integers(1, 3))):
        stream = mutate(stream, data.draw)
    request = [{"globs": ["ckpt/**", "*.log"]}, {"globs": ["**"]}, {"paths": ["ckpt/deep/b.txt", "train.log"]},
               {"globs": ["*.log"], "samples": ["."]}, None][data.draw(st.sampled_from([base, 4]))]
    chunk = data.draw(st.sampled_from([1, 7, 4096, 1 << 20]))
    dest = scratch / "artifacts"
    shutil.rmtree(dest, ignore_errors=True)
    if base == 1:  # hashes only: local copies of the right size, one of them damaged
        for p, body in FILES.items():
            (dest / p).parent.mkdir(parents=True, exist_ok=True)
            (dest / p).write_bytes(body[:-1] + b"X" if p == "train.log" else body)
    asked: list[str] = []

    def where(rel: str) -> Path:
        asked.append(rel)
        return dest / rel
    with case("collect stream"), bounded():
        rx = Receiver(where, request=request)
        try:
            for i in range(0, len(stream), chunk):
                rx.feed(stream[i:i + chunk])
        except StreamError:
            assert rx.broken is not None
        rx.finish()
    event("stream error" if rx.broken else "missing files" if rx.missing else "answer errors" if rx.errors else "clean")
    assert all(collect.path_problem(p) is None for p in asked), asked  # nothing written elsewhere
    assert not list(dest.rglob("*.part"))
    node_bytes = set(FILES.values())
    for p in rx.fetched:  # what was kept is byte for byte a file the node sent (or a header's empty one)
        got = (dest / p).read_bytes()
        # A rename in every header that names a file keeps the framing and the hashes: it is an
        # answer from a node that has that file under the new name, so its bytes are kept under
        # the new name when that name was asked for; what must never happen is bytes that no
        # file of the node has, or a name nobody asked for.
        assert got == FILES.get(p, got) or got in node_bytes, p
        if request is not None and "paths" in request:
            assert p in request["paths"], p
    assert "train.log" not in rx.whole  # the damaged copy is never called whole
    # the samplers' files: only of a folder asked for, bounded; each kept one is whole (a rename of its folder
    # or a change of its bytes keeps the framing: an answer from a node that has such a file)
    assert set(rx.samples) | set(rx.where) <= set((request or {}).get("samples", []))
    assert all(len(b) <= collect.SAMPLES_MOST for f in rx.samples.values() for b in f.values())
    assert all(len(b) <= collect.WHERE_MOST for b in rx.where.values())
    if rx.broken is None and stream == answers[base] and base == 3:
        assert rx.samples == {".": {None: SAMPLES[".clusterddp/metrics.jsonl"],
                                    2: SAMPLES[".clusterddp@attempt-2/metrics.jsonl"]}}
        assert rx.where == {".": SAMPLES[".clusterddp/where.jsonl"]}
    assert all(isinstance(p, str) and isinstance(w, str) for p, w in rx.missing)
    if rx.broken is None and stream == answers[base]:
        assert not rx.missing and not rx.errors


GOOD_FACTS = {"python": "3.11.7", "executable": "/usr/bin/python3", "hostname": "b", "iface": "eth0",
              "torch": "2.13.0", "cuda": None, "nccl": None, "torch_error": None, "full": True, "gpus": None,
              "interfaces": ["eth0", "lo"], "ip_tool": True, "env_ifname": {"NCCL_SOCKET_IFNAME": None,
                                                                             "GLOO_SOCKET_IFNAME": None},
              "disk_path": "/data", "disk_free": 500 << 30, "workdir_exists": True, "disk_writable": True,
              "port_free": True, "time": 1.8e9}


@pytest.fixture(scope="module")
def fleet_inventory():
    from clusterddp import inventory
    return inventory.parse("hosts: [{name: a, address: 10.0.0.1}, {name: b, address: 10.0.0.2}]\n", "inv.yaml")


def probe_line(facts: dict) -> bytes:
    return (probe.MARK + json.dumps(facts) + "\n").encode()


@fuzz(30)
@given(data=st.data())
def test_any_probe_reply_gives_facts_or_a_probe_error_and_check_never_trips(fleet_inventory, data):
    from clusterddp.check import FAIL, evaluate
    from clusterddp.cli.check import print_report
    from clusterddp.fleet import HostResult
    from clusterddp.transport import CommandResult

    facts = dict(GOOD_FACTS)
    keys = st.sampled_from(sorted(probe.FACTS) + ["setup_failed", "extra"])
    for k, v in data.draw(st.lists(st.tuples(keys, json_values), max_size=4)):
        facts[k] = v
    for k in data.draw(st.lists(keys, max_size=2)):
        facts.pop(k, None)
    out = b"motd\n" + probe_line(facts)
    if data.draw(st.booleans()):
        out = mutate(out, data.draw)
    f = None
    with case("probe reply", probe.ProbeError), bounded():
        f = probe.parse_reply(out, b"", 0)
    with case("check (evaluate, report)"), bounded():
        if f is not None:
            for k, v in f.items():
                kind = probe.FACTS.get(k, "text")
                assert v is None or kind.endswith("?") or kind != "text" or isinstance(v, str), (k, v)
        results = [HostResult("a", CommandResult(0, probe_line({**GOOD_FACTS, "hostname": "a"}), b""), None,
                              1.8e9, 1.8e9), HostResult("b", CommandResult(0, out, b""), None, 1.8e9, 1.8e9)]
        for full in (False, True):  # `up`'s preflight, then `check` (and its report)
            report = evaluate(fleet_inventory, results, full=full, master_port=29500)
            assert report.hosts[0].status != FAIL, report.hosts[0].findings
        if f is not None:  # the table is slow to draw; a refused reply puts only our words in it
            with contextlib.redirect_stdout(io.StringIO()) as shown:
                print_report(report, 0.1)
            assert "\x1b" not in shown.getvalue()
    event("facts" if f is not None else "probe error")


GOOD_LOOK = {"python": "3.11.2", "impl": "cpython", "tag": "cp311", "exe": "/usr/bin/python3.11",
             "platform": "manylinux_2_36_x86_64", "root": "/w/envs", "envs": [], "wheels": [], "free": 10}


@fuzz(40)
@given(data=st.data())
def test_any_environment_look_in_a_probes_output_gives_facts_or_a_host_error(data):
    """The `packages:` look as `check` and `up`'s preflight read it from the probe's own output (untrusted):
    its facts, checked (a uv of ours is an absolute path), or a HostError naming the host; whether every
    environment is ready is then True/False, never a traceback."""
    from clusterddp.envs import nodes as env_nodes
    from clusterddp.errors import HostError
    look = dict(GOOD_LOOK)
    keys = st.sampled_from(sorted(GOOD_LOOK) + ["uv", "id", "extra"])
    for k, v in data.draw(st.lists(st.tuples(keys, json_values), max_size=4)):
        look[k] = v
    out = b"motd\n" + (env_nodes.MARK + json.dumps(look)).encode() + b"\n" + probe.MARK.encode() + b"{}\n"
    if data.draw(st.booleans()):
        out = mutate(out, data.draw)
    with case("environment look", HostError, lambda e: str(e).startswith("a:")), bounded():
        f = env_nodes.looked("a", out)
        assert f["uv"] is None or f["uv"].startswith("/") if "uv" in f else True
        assert all(isinstance(x, str) for x in f["envs"])
    with case("environment found ready"), bounded():
        made = env_nodes.found_ready({"a": {"root": "/w/envs", "lock": "d" * 64}}, {"a": out})
        assert made is None or made["a"].python.endswith("/bin/python")
